"""`mlm-train`: pretrain a masked language model (gMLP, aMLP, BERT or any encoder mixer) and report perplexity.

    mlm-train --config=mlm_flax/configs/pretrain.py:demo --workdir=runs/mlm-demo [--config.model.mixer=amlp]

Re-running the same command on the same workdir resumes from its last checkpoint. At the end the workdir
holds results.json with test_loss, test_perplexity, test_accuracy (masked tokens) and unigram_perplexity,
and spm.model, the tokenizer `mlm-finetune` and `mlm-inspect` use.
"""

from __future__ import annotations

from mlm_flax.configs import pretrain
from mlm_flax.task import make_task
from zoo import config_fields
from zoo.training import cli


def run() -> None:
    cli.task_main(make_task, "mlm-train", __name__, config_fields.config_file_sections(pretrain))


if __name__ == "__main__":
    run()
