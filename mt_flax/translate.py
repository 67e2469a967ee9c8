"""`mt-translate`: translate a text file (one sentence per line) with a trained run's checkpoint.

mt-translate --workdir=runs/mt-demo --input=sentences.de --output=sentences.en [--overwrite] [--beam_size=5]

Blank input lines (the document separators of `mt-data` files) come out as blank lines.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np
from absl import app, flags

from mt_flax.task import check_decode, check_decode_fits, load_run, translate_ids
from zoo.files import atomic_write_bytes
from zoo.text import EOS_ID
from zoo.training import cli
from zoo.training.config import check_output_file
from zoo.training.data import read_utf8_lines, utf8_lines

_WORKDIR = flags.DEFINE_string("workdir", None, "A mt-train workdir (config.json, tokenizer, checkpoints/).")
_INPUT = flags.DEFINE_string("input", None, "Source text, one sentence per line ('-' for stdin).")
_OUTPUT = flags.DEFINE_string("output", "-", "Where translations go, one per line ('-' for stdout).")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace --output when it exists.")
_BEAM = flags.DEFINE_integer("beam_size", None, "Beam size (default: the run's decode.beam_size).")
_ALPHA = flags.DEFINE_float("length_penalty", None, "Length penalty alpha (default: the run's).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
flags.mark_flags_as_required(["workdir", "input"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    # Every input and output is checked before the model is loaded and anything is decoded.
    if _BEAM.value is not None and _BEAM.value < 1:
        raise ValueError(f"--beam_size={_BEAM.value} must be at least 1")
    if _ALPHA.value is not None and not math.isfinite(_ALPHA.value):
        raise ValueError(f"--length_penalty={_ALPHA.value} must be a finite number")
    if _INPUT.value != "-" and not os.path.isfile(_INPUT.value):
        raise ValueError(f"--input={_INPUT.value} is not a file")
    if _OUTPUT.value != "-":
        if _INPUT.value != "-" and os.path.exists(_OUTPUT.value) and os.path.samefile(_INPUT.value, _OUTPUT.value):
            raise ValueError(f"--output={_OUTPUT.value} is the --input file: the translations would replace it")
        check_output_file(_OUTPUT.value, "--output", replace=None if _OVERWRITE.value else "--overwrite")
    lines = utf8_lines(sys.stdin.buffer.read(), "<stdin>") if _INPUT.value == "-" else read_utf8_lines(_INPUT.value)
    config, tokenizer, model, step = load_run(_WORKDIR.value, _STEP.value)
    if _BEAM.value is not None:
        config.decode.beam_size = _BEAM.value
    if _ALPHA.value is not None:
        config.decode.length_penalty = _ALPHA.value
    check_decode(config)
    sources, rows = [], []  # blank lines (document separators) stay blank: they are not translated
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        ids = [*tokenizer.encode(line.strip()), EOS_ID]
        if len(ids) > config.model.max_length:
            raise ValueError(
                f"{_INPUT.value}:{n}: {len(ids)} tokens with EOS, more than model.max_length={config.model.max_length}"
            )
        sources.append(np.asarray(ids, np.int32))
        rows.append(n - 1)
    if sources:
        check_decode_fits(model, config, max(len(ids) for ids in sources))
    hyps = [tokenizer.decode(x) for x in translate_ids(model, config, sources)] if sources else []
    out_lines = [""] * len(lines)
    for row, hyp in zip(rows, hyps, strict=True):
        out_lines[row] = hyp
    out = "".join(h + "\n" for h in out_lines)
    if _OUTPUT.value == "-":
        sys.stdout.write(out)
    else:
        atomic_write_bytes(_OUTPUT.value, out.encode("utf-8"))
        print(f"translated {len(hyps)} lines with checkpoint step {step} into {_OUTPUT.value}", file=sys.stderr)


def run() -> None:
    cli.run(main, "mt-translate")


if __name__ == "__main__":
    run()
