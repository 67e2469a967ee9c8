"""`lra-train`: train and evaluate an LRA task.

    lra-train --config=lra_flax/configs/listops.py:demo --workdir=runs/listops-demo [--config.model.mixer=softmax]

Re-running the same command on the same workdir resumes from its last checkpoint.
"""

from __future__ import annotations

import json

from absl import app, flags
from ml_collections import config_flags

from lra_flax.tasks import TASKS
from zoo.training import cli, memory, train_and_evaluate

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
    if _PLAN_MEMORY.value:
        print(memory.format_plan(memory.plan(config, task)))
        return
    if not _WORKDIR.value:
        raise app.UsageError("--workdir is required")
    results = train_and_evaluate(config, _WORKDIR.value, task)
    print(json.dumps(results, indent=2, sort_keys=True))


def run() -> None:
    cli.run(main, "lra-train")


if __name__ == "__main__":
    run()
