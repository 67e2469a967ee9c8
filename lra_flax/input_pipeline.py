"""LRA release files → cached ArrayRecord examples → Grain batches, and the classification task built on them.

TSV errors name the file and line. Inputs longer than `model.max_length` are an error unless
`data.truncate` is set. Caches are keyed by the source file (size, mtime), the vocabulary and the
length settings, so a changed input never reuses a stale cache.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import jax
import ml_collections
import numpy as np

from zoo.training import Task, classification_loss
from zoo.training import data as data_lib

DataFormatError = data_lib.DataFormatError


def read_tsv(path: str | os.PathLike, header: Sequence[str]) -> Iterator[tuple[int, list[str]]]:
    """Yields (line number, fields) for each data line of an LRA TSV whose first line is `header`."""
    path = Path(path)
    with path.open(newline="") as f:
        for line_no, line in enumerate(f, start=1):
            fields = line.rstrip("\r\n").split("\t")
            if line_no == 1:
                if fields != list(header):
                    expected = "\t".join(header)
                    raise DataFormatError(f"{path}:1: expected header {expected!r}, got {line.rstrip()!r}")
                continue
            if line.strip() == "":
                continue
            if len(fields) != len(header):
                raise DataFormatError(
                    f"{path}:{line_no}: expected {len(header)} tab-separated fields "
                    f"({', '.join(header)}), got {len(fields)}"
                )
            yield line_no, fields


def _cache_path(source: Path, *parts: object) -> Path:
    return source.parent / "cache" / f"{source.stem}-{data_lib.source_key(source, *parts)}.array_record"


def cache_classification_split(
    tsv: Path,
    *,
    encode: Callable[[str], list[int]],
    vocab: Sequence[str],
    num_classes: int,
    max_length: int,
    truncate: bool,
) -> Path:
    """Tokenises a `Source\\tTarget` TSV into fixed-length examples {inputs [max_length], targets}."""
    cache = _cache_path(tsv, tuple(vocab), num_classes, max_length, truncate)
    if cache.exists():
        return cache

    def examples():
        for line_no, (source, target) in read_tsv(tsv, ("Source", "Target")):
            try:
                ids = encode(source)
            except KeyError as e:
                raise DataFormatError(f"{tsv}:{line_no}: {e.args[0]}") from None
            if not target.strip().lstrip("-").isdigit() or not 0 <= int(target) < num_classes:
                raise DataFormatError(f"{tsv}:{line_no}: target {target!r} is not a class id in [0, {num_classes})")
            if len(ids) > max_length:
                if not truncate:
                    raise DataFormatError(
                        f"{tsv}:{line_no}: input has {len(ids)} tokens, more than model.max_length={max_length}; "
                        "raise model.max_length or set data.truncate=True to cut long inputs"
                    )
                ids = ids[:max_length]
            inputs = np.zeros((max_length,), np.int32)
            inputs[: len(ids)] = ids
            yield {"inputs": inputs, "targets": np.int32(int(target))}

    count = data_lib.write_records(cache, examples())
    if count == 0:
        cache.unlink()
        raise DataFormatError(f"{tsv}: no examples")
    return cache


def classification_task(
    config: ml_collections.ConfigDict,
    prepare: Callable[[], dict[str, Path]],
    *,
    vocab_size: int,
    num_classes: int,
    model_cls,
) -> Task:
    """A Task over cached {inputs, targets} splits `train`, `valid`, `test`; `prepare` makes them (once)."""
    eval_batch = config.train.eval_batch_size or config.train.batch_size
    prepare = functools.cache(prepare)

    def build_model(rngs):
        return model_cls(config.model, vocab_size=vocab_size, num_classes=num_classes, rngs=rngs)

    def train_batches():
        records = data_lib.read_records(prepare()["train"])
        return data_lib.train_batches(records, global_batch=config.train.batch_size, seed=config.seed)

    def eval_batches(split):
        return data_lib.eval_batches(data_lib.read_records(prepare()[split]), global_batch=eval_batch)

    def batch_spec(batch: int):
        return {
            "inputs": jax.ShapeDtypeStruct((batch, config.model.max_length), np.int32),
            "targets": jax.ShapeDtypeStruct((batch,), np.int32),
            "weights": jax.ShapeDtypeStruct((batch,), np.float32),
        }

    return Task(
        build_model=build_model,
        train_batches=train_batches,
        eval_batches=eval_batches,
        loss_fn=classification_loss(config.train.label_smoothing),
        prepare=prepare,
        batch_spec=batch_spec,
    )
