"""Example records on disk (ArrayRecord) and Grain pipelines for training and evaluation.

A record is a dict of numpy arrays serialised with msgpack. Training batches come from a seeded,
per-epoch reshuffled `MapDataset`, sliced per process, whose iterator state is checkpointed; eval
batches cover a split exactly once, padded with zero-weight rows so every batch has the same shape.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import grain
import jax
import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter
from flax import serialization

Example = dict[str, np.ndarray]


def write_records(path: str | os.PathLike, examples: Iterable[Example]) -> int:
    """Writes examples to an ArrayRecord file atomically (a temporary file, then a rename); returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    writer = ArrayRecordWriter(str(tmp), "group_size:1")
    count = 0
    try:
        for ex in examples:
            writer.write(serialization.msgpack_serialize(ex))
            count += 1
    finally:
        writer.close()
    os.replace(tmp, path)
    return count


def _decode(record: bytes) -> Example:
    return serialization.msgpack_restore(record)


def read_records(path: str | os.PathLike) -> grain.MapDataset:
    """The examples of one ArrayRecord file as a random-access dataset."""
    return grain.MapDataset.source(grain.sources.ArrayRecordDataSource([str(path)])).map(_decode)


def _process_slice(ds: grain.MapDataset) -> grain.MapDataset:
    return ds[jax.process_index() :: jax.process_count()]


def _stack(examples: list[Example]) -> Example:
    return {k: np.stack([ex[k] for ex in examples]) for k in examples[0]}


def with_weights(ex: Example) -> Example:
    return {**ex, "weights": np.float32(1.0)}


def local_batch_size(global_batch: int, what: str = "train.batch_size") -> int:
    if global_batch % jax.process_count():
        raise ValueError(f"{what}={global_batch} is not divisible by the {jax.process_count()} processes")
    return global_batch // jax.process_count()


def train_batches(
    ds: grain.MapDataset,
    *,
    global_batch: int,
    seed: int,
    transform: Callable[[Example], Example] | None = None,
    num_threads: int = 2,
) -> grain.IterDataset:
    """Infinite, reshuffled-each-epoch batches of this process's share; iterate it for a checkpointable iterator."""
    if len(ds) == 0:
        raise ValueError("the training split is empty")
    ds = _process_slice(ds).shuffle(seed=seed).repeat()
    if transform is not None:
        ds = ds.map(transform)
    ds = ds.map(with_weights).batch(local_batch_size(global_batch), drop_remainder=True, batch_fn=_stack)
    return ds.to_iter_dataset(grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=4))


def eval_batches(
    ds: grain.MapDataset, *, global_batch: int, transform: Callable[[Example], Example] | None = None
) -> Iterator[Example]:
    """Every example of this process's share once, in order; the last batch is padded with weight-0 rows.

    Every process yields the same number of batches (needed for collective eval on several hosts).
    """
    batch = local_batch_size(global_batch, "eval batch size")
    local = _process_slice(ds)
    if transform is not None:
        local = local.map(transform)
    per_process = -(-len(ds) // jax.process_count())
    num_batches = -(-per_process // batch)
    template = None
    for b in range(num_batches):
        rows = [with_weights(local[i]) for i in range(b * batch, min((b + 1) * batch, len(local)))]
        if rows:
            template = rows[0]
        if template is None:
            template = with_weights(transform(ds[0]) if transform else ds[0])
        pad = {k: np.zeros_like(v) for k, v in template.items()}
        yield _stack(rows + [pad] * (batch - len(rows)))
