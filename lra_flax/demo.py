"""`make demo`: train an LRA task's demo preset (data generated or downloaded on first use), print a result table.

    python -m lra_flax.demo                                   # ListOps (what `make demo` runs)
    python -m lra_flax.demo --task=text --mixer=linear        # IMDB bytes, offline data
    python -m lra_flax.demo --task=retrieval                  # Bible cross-reference pairs, offline data

Re-running resumes (or, when finished, re-evaluates) from the workdir's checkpoint.
"""

from __future__ import annotations

import time

from absl import flags

from lra_flax import input_pipeline
from lra_flax.tasks import REGISTRY, make_task, with_demo
from zoo.training import cli, train_and_evaluate

_TASK = flags.DEFINE_enum("task", "listops", with_demo(), "LRA task.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default runs/<task>-demo).")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Overrides the preset's data.dir (ListOps, Retrieval).")
_MIXER = flags.DEFINE_string("mixer", "relu", "Token mixer (see zoo.mixers.names()).")


def main(argv: list[str]) -> None:
    del argv
    task_name = _TASK.value
    config = REGISTRY[task_name].get_config("demo")
    if _DATA_DIR.value:
        config.data.dir = _DATA_DIR.value
    config.model.mixer = _MIXER.value
    workdir = _WORKDIR.value or f"runs/{task_name}-demo"
    start = time.perf_counter()
    task = make_task(config)
    results = train_and_evaluate(config, workdir, task)
    wall = time.perf_counter() - start
    majority = input_pipeline.majority_rate(task.prepare()["test"])
    rows = [("mixer", config.model.mixer), ("test accuracy", f"{100 * results['test_accuracy']:.1f}%")]
    rows += [("majority-class rate (test)", f"{100 * majority:.1f}%"), ("test loss", f"{results['test_loss']:.3f}")]
    rows += [("valid accuracy", f"{100 * results['valid_accuracy']:.1f}%")]
    notes = [("data", results["data_note"])] if "data_note" in results else []
    cli.print_demo(
        f"LRA {task_name} demo results", rows, results, wall_time=("data + train + eval", wall), workdir=workdir,
        notes=notes,
    )  # fmt: skip


if __name__ == "__main__":
    cli.run(main, "lra-demo")
