"""What every LRA task shares: reading release files, byte tokens, cached examples, the classification task.

A task module (`lra_flax/tasks/NAME.py`) turns its source files into rows of token ids and a label; this
module caches those rows as ArrayRecord examples (`inputs` — or `inputs1`, `inputs2` for a pair task — as
unpadded uint16 ids, and `targets`) and builds the `zoo.training.Task` that pads them to
`model.max_length` on the fly. File errors name the file and line. Caches are keyed by their sources
(name, size, mtime) and every setting that changes the examples, so a changed input never reuses a
stale cache, and are written atomically, so a failed run never leaves a half-written one.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grain
import jax
import ml_collections
import numpy as np

from lra_flax import generator_record
from zoo.config_fields import Field
from zoo.files import atomic_open
from zoo.models import ModelBuilder, SequenceClassifier
from zoo.training import Task, classification_loss, flops
from zoo.training import data as data_lib

DataFormatError = data_lib.DataFormatError
decode_utf8 = data_lib.decode_utf8

# Bytes as tokens (LRA's ByteTextEncoder): byte b is id b + 1, id 0 is padding.
BYTE_VOCAB_SIZE = 257


def byte_ids(text: bytes) -> np.ndarray:
    """UTF-8 (or any) bytes → ids 1..256 as uint16."""
    return np.frombuffer(text, np.uint8).astype(np.uint16) + 1


def ids_to_bytes(ids: np.ndarray) -> bytes:
    """The inverse of `byte_ids`; padding (0) is dropped."""
    ids = np.asarray(ids)
    return (ids[ids > 0] - 1).astype(np.uint8).tobytes()


def read_tsv(
    path: str | os.PathLike, header: Sequence[str] | None, *, num_fields: int | None = None
) -> Iterator[tuple[int, list[str]]]:
    """Yields (line number, fields) for each data line of a TSV; `header` is its first line, or None for none."""
    path = Path(path)
    num_fields = len(header) if header is not None else num_fields
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            line = decode_utf8(raw, str(path), line_no).rstrip("\r\n")
            fields = line.split("\t")
            if line_no == 1 and header is not None:
                if fields != list(header):
                    expected = "\t".join(header)
                    raise DataFormatError(f"{path}:1: expected header {expected!r}, got {line!r}")
                continue
            if line.strip() == "":
                continue
            if len(fields) != num_fields:
                names = f" ({', '.join(header)})" if header is not None else ""
                raise DataFormatError(
                    f"{path}:{line_no}: expected {num_fields} tab-separated fields{names}, got {len(fields)}"
                )
            yield line_no, fields


def ensure_split_files(
    data: ml_collections.ConfigDict, split_files: dict[str, str], *, what: str, generate: Callable[[Path], None]
) -> Path:
    """data.dir holding every split file; when it holds none and data.generate is set, `generate(dir)` writes them
    and records the `data.generator` settings beside them (`generator_record`).

    A folder with only some of the files is an error: regenerating would overwrite the others. So is one generated
    with other `data.generator` settings than the config's (the run would train on data its config.json does not
    describe); files not written by the generator (a release's, a user's) are used as they are, and said so.
    """
    data_dir = Path(data.dir)
    names = list(split_files.values())
    missing = [f for f in names if not (data_dir / f).exists()]
    settings = data.generator.to_dict() if "generator" in data else None
    if not missing:
        if settings is None:
            return data_dir
        where, remedy = f"data.dir={data_dir}", "point data.dir elsewhere or ask for the same settings"
        if not generator_record.check(
            data_dir, settings, where=where, what=what, named="data.generator settings", remedy=remedy
        ):
            print(f"{where}: {what} not written by the generator, used as they are", flush=True)
        return data_dir
    present = [f for f in names if (data_dir / f).exists()]
    if present:
        raise FileNotFoundError(f"data.dir={data_dir} has {present} but not {missing}")
    if not data.generate:
        raise FileNotFoundError(
            f"data.dir={data_dir} has no {what} ({', '.join(names)}); point it at the LRA release files or set "
            "data.generate=True"
        )
    generate(data_dir)
    if settings is not None:
        generator_record.write(data_dir, settings, files=names)
    return data_dir


def write_split_files(
    output_dir: str | os.PathLike, split_files: Mapping[str, str], lines: Mapping[str, Iterable[str]], header: str = ""
) -> dict[str, Path]:
    """Writes each split's `lines` (after `header`) into its release file `split_files[split]` under `output_dir`
    (created, each file atomically); returns the paths in the order of `lines`."""
    paths = {split: Path(output_dir) / split_files[split] for split in lines}
    for split, path in paths.items():
        with atomic_open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(header + "".join(lines[split]))
    return paths


def release_files(split_files: dict[str, str]) -> Callable[[str, Any], list[Path]]:
    """`TaskSpec.data_files` of a task whose `lra-data` writes the release's split files (`split_files`' names)."""
    return lambda output_dir, flags: [Path(output_dir) / name for name in split_files.values()]


def parse_label(text: str, num_classes: int, where: str) -> int:
    """A class id written as an integer or a whole float ("1", "1.0"); anything else names `where`."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value.is_integer() or not 0 <= value < num_classes:
        raise DataFormatError(f"{where}: label {text!r} is not a class id in [0, {num_classes})")
    return int(value)


def fit_length(ids: Sequence[int] | np.ndarray, max_length: int, truncate: bool, where: str) -> np.ndarray:
    """Ids as uint16, cut to `max_length` when `truncate`, else an error naming `where` if longer."""
    ids = np.asarray(ids, np.uint16)
    if len(ids) > max_length:
        if not truncate:
            raise DataFormatError(
                f"{where}: input has {len(ids)} tokens, more than model.max_length={max_length}; "
                "raise model.max_length or set data.truncate=True to cut long inputs"
            )
        ids = ids[:max_length]
    return ids


def cache_path(directory: str | os.PathLike, name: str, *key: object) -> Path:
    """`directory/cache/NAME-<hash of key>.array_record`; `Path` parts of the key contribute size and mtime."""
    return Path(directory) / "cache" / f"{name}-{data_lib.source_key(*key)}.array_record"


def cache_examples(cache: Path, examples: Callable[[], Iterable[dict]], what: str) -> Path:
    """Writes `examples()` to `cache` unless it exists; an empty result is an error naming `what`."""
    if cache.exists():
        return cache
    count = data_lib.write_records(cache, examples(), progress=f"caching {what}")
    if count == 0:
        cache.unlink()
        raise DataFormatError(f"{what}: no examples")
    return cache


def cache_classification_split(
    tsv: Path,
    *,
    encode: Callable[[str], list[int]],
    vocab: Sequence[str],
    num_classes: int,
    max_length: int,
    truncate: bool,
    cache_dir: str | os.PathLike | None = None,
) -> Path:
    """Caches a `Source\\tTarget` TSV (ListOps' release format) as {inputs, targets} examples, under
    `cache_dir`/cache (default: the TSV's folder)."""

    def examples():
        for line_no, (source, target) in read_tsv(tsv, ("Source", "Target")):
            try:
                ids = encode(source)
            except KeyError as e:
                raise DataFormatError(f"{tsv}:{line_no}: {e.args[0]}") from None
            if not ids:  # an empty Source: an example of padding alone
                raise DataFormatError(f"{tsv}:{line_no}: the Source field holds no token")
            label = parse_label(target, num_classes, f"{tsv}:{line_no}")
            yield {"inputs": fit_length(ids, max_length, truncate, f"{tsv}:{line_no}"), "targets": np.int32(label)}

    cache = cache_path(cache_dir or tsv.parent, tsv.stem, tsv, tuple(vocab), num_classes, max_length, truncate)
    return cache_examples(cache, examples, str(tsv))


def _label_counts(records_path: str | os.PathLike) -> np.ndarray:
    ds = data_lib.read_records(records_path)
    return np.bincount([int(ds[i]["targets"]) for i in range(len(ds))])


def majority_rate(records_path: str | os.PathLike) -> float:
    """Share of the most frequent label in a cached split (the accuracy of always guessing it)."""
    counts = _label_counts(records_path)
    return float(counts.max() / max(counts.sum(), 1))


def label_entropy(records_path: str | os.PathLike) -> float:
    """Entropy in nats of the labels of a cached split: the cross-entropy loss of a model that predicts only their
    frequencies, the loss a classifier that learned nothing else converges to."""
    counts = _label_counts(records_path)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def classification_task(
    config: ml_collections.ConfigDict,
    prepare: Callable[[], dict[str, Path]],
    *,
    vocab_size: int,
    num_classes: int,
    model_cls=SequenceClassifier,
    input_fields: Sequence[str] = ("inputs",),
    final_results: Callable[[dict], dict] | None = None,
    data_note: Callable[[], str | None] | None = None,
    config_sections: Mapping[str, tuple[Field, ...]] | None = None,
) -> Task:
    """A Task over cached splits `train`, `valid`, `test`; `prepare` makes them (once).

    The model is called with one token array per name in `input_fields` (two for a pair task), each
    padded to `model.max_length`. `data_note()`, when it gives text, goes into results.json as `data_note`
    (how the offline data differs from the paper's). `config_sections`: the task's own declared config sections
    (its config module's `CONFIG_SECTIONS`), validated with the shared ones before a run starts.
    """
    if data_note is not None:

        def final_results(results):
            note = data_note()
            return {"data_note": note} if note else {}

    eval_batch = config.train.eval_batch_size or config.train.batch_size
    prepare = functools.cache(prepare)
    max_length = config.model.max_length

    def pad(ex: dict) -> dict:
        out = dict(ex)
        for name in input_fields:
            out[name] = np.zeros((max_length,), np.int32)
            out[name][: len(ex[name])] = ex[name]
        return out

    build_model = ModelBuilder(model_cls, config.model, dict(vocab_size=vocab_size, num_classes=num_classes))

    @functools.cache
    def records() -> dict[str, grain.MapDataset]:
        """Every split, opened when training starts: files deleted later are still read at evaluation."""
        splits = ("train", "valid", "test")  # what else `prepare` returns (a data source's name) is not a split
        return {split: data_lib.read_records(path) for split, path in prepare().items() if split in splits}

    def train_batches():
        return data_lib.train_batches(
            records()["train"], global_batch=config.train.batch_size, seed=config.seed, transform=pad
        )

    def eval_batches(split):
        return data_lib.eval_batches(records()[split], global_batch=eval_batch, transform=pad)

    def batch_spec(batch: int):
        spec = {name: jax.ShapeDtypeStruct((batch, config.model.max_length), np.int32) for name in input_fields}
        spec["targets"] = jax.ShapeDtypeStruct((batch,), np.int32)
        spec["weights"] = jax.ShapeDtypeStruct((batch,), np.float32)
        return spec

    pad_id = config.model.get("pad_id", 0)  # pixel tasks: -1, every token counts

    def count_tokens(batch):
        return sum(int(np.count_nonzero(batch[name] != pad_id)) for name in input_fields)

    return Task(
        build_model=build_model,
        train_batches=train_batches,
        eval_batches=eval_batches,
        loss_fn=classification_loss(config.train.label_smoothing, input_fields=tuple(input_fields)),
        count_tokens=count_tokens,
        prepare=prepare,
        batch_spec=batch_spec,
        final_results=final_results or (lambda results: {}),
        model_flops=lambda batch: flops.encoder_step_flops(config.model, batch, tuple(input_fields)),
        config_sections=config_sections or {},
    )
