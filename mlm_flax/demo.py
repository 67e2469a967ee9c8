"""`make demo-mlm`: pretrain the demo gMLP on the offline Wikipedia sample, print perplexity before and after
training and the unigram baseline, and plot the learned spatial weights (sgu_weights.png in the workdir).

    python -m mlm_flax.demo --workdir=runs/mlm-demo [--arch=gmlp|amlp|bert|bert_relpos]

Re-running resumes (or, when finished, re-evaluates) from the workdir's checkpoint.
"""

from __future__ import annotations

import tempfile
import time

from absl import flags

from mlm_flax import sgu_analysis
from mlm_flax.configs import pretrain
from mlm_flax.task import make_task
from zoo.training import cli, train_and_evaluate

_WORKDIR = flags.DEFINE_string("workdir", "runs/mlm-demo", "Run directory.")
_ARCH = flags.DEFINE_enum("arch", "gmlp", list(pretrain.ENCODERS), "Encoder architecture (demo size).")
_WHEEL_CACHE = flags.DEFINE_string("wheel_cache", "data/wheels", "Where the gensim wheel is (or is downloaded).")


def main(argv: list[str]) -> None:
    del argv
    config = pretrain.get_config(f"{_ARCH.value}_demo")
    config.data.wheel_cache = _WHEEL_CACHE.value
    start = time.perf_counter()
    task = make_task(config)
    at_start = config.copy_and_resolve_references()
    with at_start.unlocked():
        at_start.train.steps = 0
    with tempfile.TemporaryDirectory() as untrained:  # the same evaluation at step 0
        before = train_and_evaluate(at_start, untrained, task)
    results = train_and_evaluate(config, _WORKDIR.value, task)
    rows = [
        ("model", f"{_ARCH.value}_demo ({config.model.num_layers} layers, d {config.model.d_model})"),
        ("test perplexity, untrained", f"{before['test_perplexity']:.1f}"),
        ("test perplexity, trained", f"{results['test_perplexity']:.1f}"),
        ("unigram perplexity (no context)", f"{results['unigram_perplexity']:.1f}"),
        ("test masked-token accuracy", f"{100 * results['test_accuracy']:.1f}%"),
    ]
    notes = []
    if _ARCH.value in ("gmlp", "amlp"):
        report = sgu_analysis.inspect(_WORKDIR.value)
        scores = " ".join(f"{x['toeplitz_score']:.3f}" for x in report["layers"])
        notes = [("SGU Toeplitz score per layer", scores), ("figure", str(report["figure"]))]
    cli.print_demo(
        "Masked language modelling demo (Wikipedia sample)", rows, results, workdir=_WORKDIR.value,
        wall_time=("data + train + eval", time.perf_counter() - start), notes=notes,
    )  # fmt: skip


if __name__ == "__main__":
    cli.run(main, "mlm-demo")
