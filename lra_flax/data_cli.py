"""`lra-data`: write generated LRA data sets in the LRA release format.

lra-data listops --output_dir=DIR [--num_train=96000 --num_valid=2000 --num_test=2000 --seed=0]
                 [--min_length=500 --max_length=2000 --max_depth=10 --max_args=10]
"""

from __future__ import annotations

import time

from absl import app, flags

from lra_flax.tasks import listops

_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Directory for basic_{train,val,test}.tsv.")
_NUM_TRAIN = flags.DEFINE_integer("num_train", 96000, "Training examples.")
_NUM_VALID = flags.DEFINE_integer("num_valid", 2000, "Validation examples.")
_NUM_TEST = flags.DEFINE_integer("num_test", 2000, "Test examples.")
_SEED = flags.DEFINE_integer("seed", 0, "Generator seed; the same seed gives byte-identical files.")
_MIN_LENGTH = flags.DEFINE_integer("min_length", 500, "Keep expressions longer than this (tokens).")
_MAX_LENGTH = flags.DEFINE_integer("max_length", 2000, "Keep expressions shorter than this (tokens).")
_MAX_DEPTH = flags.DEFINE_integer("max_depth", 10, "Maximum nesting depth.")
_MAX_ARGS = flags.DEFINE_integer("max_args", 10, "Maximum arguments per operator (at least 2).")
flags.mark_flag_as_required("output_dir")
_GENERATOR_FLAGS = (_NUM_TRAIN, _NUM_VALID, _NUM_TEST, _SEED, _MIN_LENGTH, _MAX_LENGTH, _MAX_DEPTH, _MAX_ARGS)

GENERATORS = ("listops",)


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[1] not in GENERATORS:
        raise app.UsageError(f"usage: lra-data {{{','.join(GENERATORS)}}} --output_dir=DIR [flags]")
    start = time.perf_counter()
    settings = {flag.name: flag.value for flag in _GENERATOR_FLAGS}
    try:
        paths = listops.write_dataset(_OUTPUT_DIR.value, **settings)
    except (ValueError, RuntimeError) as e:
        raise app.UsageError(str(e)) from None
    for split, path in paths.items():
        print(f"{split}: {path}")
    print(f"done in {time.perf_counter() - start:.1f}s")


def run() -> None:
    app.run(main)


if __name__ == "__main__":
    run()
