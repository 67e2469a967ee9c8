"""`mt-train`: train a translation model, decode the test set, report BLEU / chrF.

    mt-train --config=mt_flax/configs/translation.py:demo --workdir=runs/mt-demo [--config.model.mixer=linear]

Re-running the same command on the same workdir resumes from its last checkpoint. At the end the workdir
holds test.hyp.txt, test.ref.txt and results.json with bleu, chrf, bleu_tokenized and sacrebleu_signature.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
from absl import app, flags
from ml_collections import config_flags

from mt_flax.task import make_task
from zoo.training import cli, memory, train_and_evaluate

_CONFIG = config_flags.DEFINE_config_file("config", None, "Task config file with a preset after ':'.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, translations and results.")
_PLAN_MEMORY = flags.DEFINE_bool(
    "plan_memory", False, "Compile the train step for the configured mesh, print per-device memory, and exit."
)
flags.mark_flags_as_required(["config"])


def train(config, workdir: str | Path) -> dict:
    """Trains and evaluates; results.json gains the test split's scores under their plain names."""
    workdir = Path(workdir)
    results = train_and_evaluate(config, workdir, make_task(config))
    scores_path = workdir / "test.scores.json"
    if scores_path.exists():
        scores = json.loads(scores_path.read_text())
        results.update({k: scores[k] for k in ("bleu", "chrf", "bleu_tokenized", "sacrebleu_signature")})
        if jax.process_index() == 0:
            tmp = workdir / "results.json.tmp"
            tmp.write_text(json.dumps(results, indent=2, sort_keys=True))
            os.replace(tmp, workdir / "results.json")
    return results


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    if _PLAN_MEMORY.value:
        print(memory.format_plan(memory.plan(config, make_task(config))))
        return
    if not _WORKDIR.value:
        raise app.UsageError("--workdir is required")
    print(json.dumps(train(config, _WORKDIR.value), indent=2, sort_keys=True))


def run() -> None:
    cli.run(main, "mt-train")


if __name__ == "__main__":
    run()
