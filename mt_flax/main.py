"""`mt-train`: train a translation model, decode the test set, report BLEU / chrF.

    mt-train --config=mt_flax/configs/translation.py:demo --workdir=runs/mt-demo [--config.model.mixer=linear]

Re-running the same command on the same workdir resumes from its last checkpoint. At the end the workdir
holds test.hyp.txt, test.ref.txt and results.json with bleu, chrf, bleu_tokenized, sacrebleu_signature,
examples_scored and pairs_dropped (test pairs longer than model.max_length, left out of the scores).
"""

from __future__ import annotations

from mt_flax.configs import translation
from mt_flax.task import make_task
from zoo import config_fields
from zoo.training import cli


def run() -> None:
    cli.task_main(make_task, "mt-train", __name__, config_fields.config_file_sections(translation))


if __name__ == "__main__":
    run()
