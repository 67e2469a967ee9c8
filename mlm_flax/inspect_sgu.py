"""`mlm-inspect`: plot a checkpoint's learned SGU spatial weights and score how Toeplitz-like they are.

    mlm-inspect --workdir=runs/mlm-demo [--step=N] [--output=PATH] [--overwrite]

Writes `sgu_weights.png` (one panel per gMLP/aMLP layer: W, n × n, blue negative / red positive) into the
workdir and prints per layer the Toeplitz score (share of W's energy explained by its diagonal means: 1
for a Toeplitz matrix, about 2/n for noise) — the gMLP paper observes learned W are Toeplitz-like, i.e.
the spatial projection learns shift-invariant, mostly local filters.
"""

from __future__ import annotations

import numpy as np
from absl import app, flags

from mlm_flax.sgu_analysis import DEFAULT_FIGURE, inspect
from zoo.training import cli
from zoo.training.config import check_output_dir, check_output_file

_WORKDIR = flags.DEFINE_string("workdir", None, "An mlm-train or mlm-finetune workdir.")
_STEP = flags.DEFINE_integer("step", 0, "Checkpoint step (0: the latest).")
FIGURE_SUFFIXES = (".png", ".pdf", ".svg")  # what the figure may be saved as (matplotlib's formats here)
_OUTPUT = flags.DEFINE_string("output", "", "Where the figure goes (default: WORKDIR/sgu_weights.png).")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace --output when it exists.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not _WORKDIR.value:
        raise app.UsageError("--workdir is required")
    # Checked before the checkpoint is read and plotted; by default the figure goes into the workdir.
    if _OUTPUT.value:
        check_output_file(
            _OUTPUT.value, "--output", FIGURE_SUFFIXES, replace=None if _OVERWRITE.value else "--overwrite"
        )
    else:
        check_output_dir(_WORKDIR.value, f"--workdir (where {DEFAULT_FIGURE} goes without --output)")
    report = inspect(_WORKDIR.value, _STEP.value or None, _OUTPUT.value or None)
    n = len(report["layers"])
    rows = [
        (f"layer {x['layer']}", f"Toeplitz score {x['toeplitz_score']:.3f}   rms(W) {x['rms']:.2e}")
        for x in report["layers"]
    ]
    rows.append(
        ("mean", f"Toeplitz score {np.mean([x['toeplitz_score'] for x in report['layers']]):.3f} over {n} layers")
    )
    rows.append(("figure", report["figure"]))
    cli.print_table(f"SGU spatial weights of {_WORKDIR.value} (step {report['step']})", rows)


def run() -> None:
    cli.run(main, "mlm-inspect")


if __name__ == "__main__":
    run()
