"""`mlm-finetune`: train a sentence(-pair) classifier from a pretrained MLM encoder (SST-2, MNLI, offline sample).

    mlm-finetune --config=mlm_flax/configs/finetune.py:polarity --config.pretrained.workdir=runs/mlm-demo \\
      --workdir=runs/polarity-demo

The classifier's encoder starts as the pretraining checkpoint's (checked against the config's model
section: a mismatch is an error naming the differing fields); the head starts fresh. Re-running resumes.
"""

from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from mlm_flax.finetune_task import make_task
from zoo.training import cli

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Fine-tuning config file with a preset after ':'.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and results.")
_PLAN_MEMORY = flags.DEFINE_bool(
    "plan_memory", False, "Compile the train step for the configured mesh, print per-device memory, and exit."
)
flags.mark_flags_as_required(["config"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    cli.train_or_plan(config, _WORKDIR.value, make_task(config), plan_memory=_PLAN_MEMORY.value)


def run() -> None:
    cli.run(main, "mlm-finetune")


if __name__ == "__main__":
    run()
