"""`mt-train`: train a translation model, decode the test set, report BLEU / chrF.

    mt-train --config=mt_flax/configs/translation.py:demo --workdir=runs/mt-demo [--config.model.mixer=linear]

Re-running the same command on the same workdir resumes from its last checkpoint. At the end the workdir
holds test.hyp.txt, test.ref.txt and results.json with bleu, chrf, bleu_tokenized and sacrebleu_signature.
"""

from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from mt_flax.task import make_task
from zoo.training import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Task config file with a preset after ':'.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, translations and results.")
_PLAN_MEMORY = flags.DEFINE_bool(
    "plan_memory", False, "Compile the train step for the configured mesh, print per-device memory, and exit."
)
flags.mark_flags_as_required(["config"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    task = make_task(config)
    cli.train_or_plan(config, _WORKDIR.value, task, plan_memory=_PLAN_MEMORY.value)


def run() -> None:
    cli.run(main, "mt-train")


if __name__ == "__main__":
    run()
