"""`mlm-finetune`: train a sentence(-pair) classifier from a pretrained MLM encoder (SST-2, MNLI, offline sample).

    mlm-finetune --config=mlm_flax/configs/finetune.py:polarity --config.pretrained.workdir=runs/mlm-demo \\
      --workdir=runs/polarity-demo

The classifier's encoder starts as the pretraining checkpoint's (checked against the config's model
section: a mismatch is an error naming the differing fields); the head starts fresh. Re-running resumes.
"""

from __future__ import annotations

from mlm_flax.configs import finetune
from mlm_flax.finetune_task import make_task
from zoo import config_fields
from zoo.training import cli


def run() -> None:
    cli.task_main(make_task, "mlm-finetune", __name__, config_fields.config_file_sections(finetune))


if __name__ == "__main__":
    run()
