"""`make demo`: generate a small ListOps set if missing, train the ReLU-attention encoder, print a result table.

    python -m lra_flax.demo --workdir=runs/listops-demo --data_dir=data/listops-demo

Re-running resumes (or, when finished, re-evaluates) from the workdir's checkpoint.
"""

from __future__ import annotations

import time

from absl import flags

from lra_flax.configs import listops as listops_config
from lra_flax.tasks import listops
from zoo.training import cli, train_and_evaluate

_WORKDIR = flags.DEFINE_string("workdir", "runs/listops-demo", "Run directory.")
_DATA_DIR = flags.DEFINE_string("data_dir", "data/listops-demo", "Where the generated ListOps TSVs live.")
_MIXER = flags.DEFINE_string("mixer", "relu", "Token mixer (see zoo.mixers.names()).")


def main(argv: list[str]) -> None:
    del argv
    config = listops_config.get_config("demo")
    config.data.dir = _DATA_DIR.value
    config.model.mixer = _MIXER.value
    start = time.perf_counter()
    task = listops.make_task(config)
    results = train_and_evaluate(config, _WORKDIR.value, task)
    wall = time.perf_counter() - start
    majority = listops.majority_rate(task.prepare()["test"])
    rows = [
        ("mixer", config.model.mixer),
        ("test accuracy", f"{100 * results['test_accuracy']:.1f}%"),
        ("majority-class rate (test)", f"{100 * majority:.1f}%"),
        ("test loss", f"{results['test_loss']:.3f}"),
        ("valid accuracy", f"{100 * results['valid_accuracy']:.1f}%"),
        ("train steps/s", f"{results['train_steps_run'] / max(results['train_wall_time_s'], 1e-9):.2f}"),
        ("wall time (data + train + eval)", f"{wall:.0f} s"),
        ("workdir", _WORKDIR.value),
    ]
    cli.print_table("ListOps demo results", rows)


if __name__ == "__main__":
    cli.run(main, "lra-demo")
