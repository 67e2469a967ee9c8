"""`mlm-train`: pretrain a masked language model (gMLP, aMLP, BERT or any encoder mixer) and report perplexity.

    mlm-train --config=mlm_flax/configs/pretrain.py:demo --workdir=runs/mlm-demo [--config.model.mixer=amlp]

Re-running the same command on the same workdir resumes from its last checkpoint. At the end the workdir
holds results.json with test_loss, test_perplexity, test_accuracy (masked tokens) and unigram_perplexity,
and spm.model, the tokenizer `mlm-finetune` and `mlm-inspect` use.
"""

from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from mlm_flax.task import make_task
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
    cli.train_or_plan(config, _WORKDIR.value, make_task(config), plan_memory=_PLAN_MEMORY.value)


def run() -> None:
    cli.run(main, "mlm-train")


if __name__ == "__main__":
    run()
