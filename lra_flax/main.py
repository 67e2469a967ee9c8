"""`lra-train`: train and evaluate an LRA task.

    lra-train --config=lra_flax/configs/listops.py:demo --workdir=runs/listops-demo [--config.model.mixer=softmax]

Re-running the same command on the same workdir resumes from its last checkpoint.
"""

from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from lra_flax.tasks import TASKS
from zoo.training import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Task config file with a preset after ':'.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and results.")
_PLAN_MEMORY = flags.DEFINE_bool(
    "plan_memory", False, "Compile the train step for the configured mesh, print per-device memory, and exit."
)
flags.mark_flags_as_required(["config"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    if config.task not in TASKS:
        raise ValueError(f"config field task={config.task!r} is unknown; valid: {', '.join(TASKS)}")
    task = TASKS[config.task](config)
    cli.train_or_plan(config, _WORKDIR.value, task, plan_memory=_PLAN_MEMORY.value)


def run() -> None:
    cli.run(main, "lra-train")


if __name__ == "__main__":
    run()
