"""Sentence and sentence-pair classification data for fine-tuning (GLUE's SST-2 and MNLI, and an offline sample).

Sources (config field data.source):
  glue_tsv          GLUE-format TSV files in data.dir (a header row names the columns): SST-2 `train.tsv`,
                    `dev.tsv` (sentence, label); MNLI `train.tsv`, `dev_matched.tsv`, `dev_mismatched.tsv`
                    (sentence1, sentence2, gold_label).
  tfds              TFDS `glue/sst2`, `glue/mnli` through tfds.data_source, when prepared.
  polarity_sample   offline: the 200 labelled movie-review sentences (Pang & Lee polarity, the source of
                    SST) shipped in the gensim wheel; a seeded 140 / 30 / 30 split.
GLUE's test labels are hidden, so `test` is a dev set (MNLI: matched; `test_mismatched`: mismatched) and
`valid` is `valid_size` training examples held out by a seeded draw.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from mlm_flax.data import hold_out
from zoo.text import WheelFile, fetch_wheel_member
from zoo.training.data import DataFormatError, open_tfds, read_utf8_lines

POLARITY_WHEEL = WheelFile("gensim", "4.4.0", "gensim/test/test_data/pang_lee_polarity.cor")


@dataclasses.dataclass(frozen=True)
class ClassificationTask:
    text_fields: tuple[str, ...]  # TSV columns: one (sentence) or two (sentence pair)
    label_field: str
    labels: tuple[str, ...]  # label strings in class-id order (TFDS uses the same order)
    files: dict  # split → TSV file stem; "valid" absent: held out from train
    eval_splits: tuple[str, ...] = ("valid", "test")
    tfds_name: str = ""
    tfds_fields: tuple[str, ...] = ()
    tfds_splits: dict = dataclasses.field(default_factory=dict)


TASKS = {
    "sst2": ClassificationTask(
        text_fields=("sentence",),
        label_field="label",
        labels=("0", "1"),
        files={"train": "train", "test": "dev"},
        tfds_name="glue/sst2",
        tfds_fields=("sentence",),
        tfds_splits={"train": "train", "test": "validation"},
    ),
    "mnli": ClassificationTask(
        text_fields=("sentence1", "sentence2"),
        label_field="gold_label",
        labels=("entailment", "neutral", "contradiction"),
        files={"train": "train", "test": "dev_matched", "test_mismatched": "dev_mismatched"},
        tfds_name="glue/mnli",
        tfds_fields=("premise", "hypothesis"),
        tfds_splits={"train": "train", "test": "validation_matched", "test_mismatched": "validation_mismatched"},
        eval_splits=("valid", "test", "test_mismatched"),
    ),
    "polarity": ClassificationTask(text_fields=("sentence",), label_field="label", labels=("neg", "pos"), files={}),
}

Example = tuple[tuple[str, ...], int]  # (texts, label id)


def task_spec(name: str) -> ClassificationTask:
    if name not in TASKS:
        raise ValueError(f"config field data.task={name!r} is unknown; valid: {', '.join(TASKS)}")
    return TASKS[name]


def eval_splits(name: str) -> tuple[str, ...]:
    return task_spec(name).eval_splits


def read_tsv(path: str | os.PathLike, task: ClassificationTask) -> list[Example]:
    """Examples of a GLUE TSV file; a missing column, short row or unknown label names the file and line."""
    path = Path(path)
    if not path.is_file():
        listing = sorted(p.name for p in path.parent.iterdir()) if path.parent.is_dir() else "no such directory"
        raise FileNotFoundError(f"GLUE file {path} does not exist (its directory contains: {listing})")
    lines = read_utf8_lines(path)
    if not lines:
        raise DataFormatError(f"{path}: empty file (expected a header row)")
    header = lines[0].split("\t")
    needed = (*task.text_fields, task.label_field)
    missing = [c for c in needed if c not in header]
    if missing:
        raise DataFormatError(f"{path}:1: header has no column(s) {missing}; columns: {header}")
    cols = [header.index(c) for c in needed]
    label_ids = {label: i for i, label in enumerate(task.labels)}
    examples = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        row = line.split("\t")
        if len(row) <= max(cols):
            raise DataFormatError(f"{path}:{n}: {len(row)} columns, the header has {len(header)}")
        *texts, label = (row[c] for c in cols)
        if label not in label_ids:
            raise DataFormatError(f"{path}:{n}: label {label!r} is not one of {list(task.labels)}")
        examples.append((tuple(" ".join(t.split()) for t in texts), label_ids[label]))
    if not examples:
        raise DataFormatError(f"{path}: no examples")
    return examples


def tfds_examples(task: ClassificationTask, split: str, data_dir: str | None) -> list[Example]:
    source = open_tfds(task.tfds_name, task.tfds_splits[split], data_dir, "data.source='glue_tsv'")
    out = []
    for i in range(len(source)):
        ex = source[i]
        texts = tuple(
            (ex[f].decode("utf-8") if isinstance(ex[f], bytes) else str(ex[f])).strip() for f in task.tfds_fields
        )
        out.append((texts, int(ex["label"])))
    return out


def polarity_examples(wheel_cache: str | os.PathLike) -> list[Example]:
    """The gensim wheel's labelled sentences: `__label__neg text` / `__label__pos text`, Latin-1."""
    path = fetch_wheel_member(POLARITY_WHEEL, wheel_cache)
    examples = []
    for n, line in enumerate(path.read_bytes().decode("latin-1").splitlines(), start=1):
        label, _, text = line.partition(" ")
        if label not in ("__label__neg", "__label__pos") or not text.strip():
            raise DataFormatError(f"{path}:{n}: expected '__label__neg|pos text'")
        examples.append(((" ".join(text.split()),), int(label == "__label__pos")))
    return examples


def load_splits(
    name: str, source: str, data_dir: str, *, wheel_cache: str, tfds_data_dir: str, valid_size: int
) -> dict[str, list[Example]]:
    task = task_spec(name)
    if name == "polarity":
        if source != "polarity_sample":
            raise ValueError("data.task='polarity' reads only data.source='polarity_sample'")
        return hold_out(polarity_examples(wheel_cache), {"valid": 30, "test": 30})
    if source == "glue_tsv":
        splits = {split: read_tsv(Path(data_dir) / f"{stem}.tsv", task) for split, stem in task.files.items()}
    elif source == "tfds":
        splits = {split: tfds_examples(task, split, tfds_data_dir or None) for split in task.tfds_splits}
    else:
        raise ValueError(
            f"config field data.source={source!r} is unknown for data.task={name!r}; valid: glue_tsv, tfds"
        )
    held = hold_out(splits["train"], {"valid": valid_size})
    return {**splits, "train": held["train"], "valid": held["valid"]}


def encode(texts: tuple[str, ...], tokenizer, *, cls_id: int, sep_id: int, max_length: int) -> np.ndarray:
    """`[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]`, the longer text truncated first to fit `max_length`."""
    pieces = [tokenizer.encode(t) for t in texts]
    budget = max_length - 1 - len(pieces)
    while sum(len(p) for p in pieces) > budget:
        longest = max(range(len(pieces)), key=lambda i: len(pieces[i]))
        pieces[longest] = pieces[longest][:-1]
    tokens = [cls_id]
    for p in pieces:
        tokens += [*p, sep_id]
    out = np.zeros((max_length,), np.int32)
    out[: len(tokens)] = tokens
    return out
