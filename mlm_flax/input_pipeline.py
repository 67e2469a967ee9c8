"""Documents → SentencePiece → packed fixed-length sequences (cached ArrayRecord) → masked batches (or, for a
causal LM, the sequences as they are).

A sequence is `[CLS]` followed by the next `seq_length − 1` tokens of the split's token stream, in which
every document ends with `[SEP]` (RoBERTa's full-sentence packing: sequences may span documents); the
last one is padded. Masking (mlm_flax.masking) happens when a batch is read, seeded by (seed, global row
number), so the masks of a run are the same for any number of processes and on resume, and a token is
masked differently each epoch; held-out splits use fixed masks (seeded by the example index).
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from collections.abc import Iterator
from pathlib import Path

import grain
import ml_collections
import numpy as np

from mlm_flax import data as mlm_data
from mlm_flax.masking import MaskingSpec, mask_tokens
from zoo.text import BOS_ID, EOS_ID, PAD_ID, UNK_ID, SentencePieceTokenizer, train_sentencepiece
from zoo.training import data as data_lib
from zoo.training.data import DataFormatError

SPECIAL_SYMBOLS = ("[MASK]", "[CLS]", "[SEP]")


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    mask: int
    cls: int
    sep: int

    @property
    def all(self) -> tuple[int, ...]:
        """Every id that is never masked: padding, unknown, bos/eos and the three symbols."""
        return (PAD_ID, UNK_ID, BOS_ID, EOS_ID, self.mask, self.cls, self.sep)


def special_ids(tokenizer: SentencePieceTokenizer, source: str = "the tokenizer") -> SpecialIds:
    try:
        return SpecialIds(*(tokenizer.piece_to_id(s) for s in SPECIAL_SYMBOLS))
    except KeyError as e:
        raise ValueError(
            f"{source} lacks a special symbol needed for MLM ({e.args[0]}); it must define "
            f"{', '.join(SPECIAL_SYMBOLS)} as user symbols (leave data.tokenizer_model empty to train one)"
        ) from None


def cache_dir(config: ml_collections.ConfigDict) -> Path:
    d = config.data
    return Path(d.cache_dir or Path(d.dir) / "cache")


def _corpus_key(config: ml_collections.ConfigDict) -> tuple:
    d = config.data
    if d.source == "text":
        files = [Path(d.dir) / f"{s}.txt" for s in mlm_data.SPLITS]
        present = tuple(f for f in files if f.is_file())
        if files[0] not in present:
            mlm_data.text_splits(d.dir, d.documents, d.holdout_fraction)  # raises, naming the missing file
        return ("text", d.documents, d.holdout_fraction, *present)
    if (Path(d.dir) / "train.txt").is_file():  # data.dir only holds the caches here: the user meant source=text
        raise ValueError(
            f"data.dir={d.dir} holds train.txt, but data.source={d.source!r} does not read it (data.dir only holds "
            "this run's caches then); set data.source=text to train on it"
        )
    if d.source in mlm_data.OFFLINE_CORPORA:
        return (d.source, mlm_data.OFFLINE_CORPORA[d.source][0], d.holdout_fraction)
    return ("tfds", d.tfds_name, d.tfds_text_field, d.tfds_max_documents)


# Parsing the Wikipedia XML takes seconds: once per process, not once per split.
_offline_splits = functools.lru_cache(maxsize=4)(mlm_data.offline_splits)


def load_documents(config: ml_collections.ConfigDict, split: str) -> list[str]:
    d = config.data
    _corpus_key(config)  # refuses a train.txt in data.dir that this source would not read
    if d.source == "text":
        return mlm_data.text_splits(d.dir, d.documents, d.holdout_fraction)[split]
    if d.source == "tfds":
        return mlm_data.tfds_documents(
            d.tfds_name, split, d.tfds_text_field, d.tfds_data_dir or None, d.tfds_max_documents
        )
    return _offline_splits(d.source, d.wheel_cache, d.holdout_fraction)[split]


def load_or_train_tokenizer(config: ml_collections.ConfigDict) -> tuple[SentencePieceTokenizer, Path]:
    """data.tokenizer_model if set (it must define [MASK], [CLS], [SEP]), else one trained on train (cached)."""
    d = config.data
    if d.tokenizer_model:
        path = Path(d.tokenizer_model)
        if not path.is_file():
            raise FileNotFoundError(
                f"config field data.tokenizer_model: SentencePiece model file {path} does not exist"
            )
        tokenizer = SentencePieceTokenizer.load(path)
        special_ids(tokenizer, f"SentencePiece model {path}")
        return tokenizer, path
    key = data_lib.source_key(*_corpus_key(config), "sentencepiece", d.vocab_size, SPECIAL_SYMBOLS)
    path = cache_dir(config) / f"tokenizer-{key}.model"
    if path.exists():
        return SentencePieceTokenizer.load(path), path
    docs = load_documents(config, "train")
    tokenizer = train_sentencepiece(
        (p for doc in docs for p in doc.split("\n")), vocab_size=d.vocab_size, user_symbols=SPECIAL_SYMBOLS
    )
    tokenizer.save(path)  # written atomically
    return tokenizer, path


def pack(token_docs: Iterator[list[int]], seq_length: int, ids: SpecialIds) -> Iterator[np.ndarray]:
    """`[CLS]` + the next `seq_length − 1` tokens of the stream of documents each ending in `[SEP]`."""
    body = seq_length - 1
    buffer: list[int] = []
    for doc in token_docs:
        buffer.extend(doc)
        buffer.append(ids.sep)
        while len(buffer) >= body:
            yield np.asarray([ids.cls, *buffer[:body]], np.int32)
            buffer = buffer[body:]
    if buffer:
        out = np.full((seq_length,), PAD_ID, np.int32)
        out[0], out[1 : 1 + len(buffer)] = ids.cls, buffer
        yield out


def cache_split(config: ml_collections.ConfigDict, split: str, tokenizer, tokenizer_path: Path) -> Path:
    """Writes (once) the split's packed sequences to ArrayRecord, with token counts alongside (`.counts.npy`)."""
    d = config.data
    # The tokenizer by its bytes: caches prepared on one machine are found on another (studies.mlm_setting).
    key = data_lib.source_key(*_corpus_key(config), split, data_lib.file_digest(tokenizer_path), d.seq_length)
    path = cache_dir(config) / f"{split}-{key}.array_record"
    counts_path = path.with_suffix(".counts.npy")
    if path.exists() and counts_path.exists():
        return path
    docs = load_documents(config, split)
    ids = special_ids(tokenizer)
    counts = np.zeros((tokenizer.vocab_size,), np.int64)

    def token_docs():
        for doc in docs:
            tokens = [t for paragraph in doc.split("\n") for t in tokenizer.encode(paragraph)]
            if tokens:
                yield tokens

    def sequences():
        for seq in pack(token_docs(), d.seq_length, ids):
            np.add.at(counts, seq, 1)
            yield {"tokens": seq}

    n = data_lib.write_records(path, sequences(), progress=f"caching {path.name}")
    if n == 0:
        path.unlink()
        raise DataFormatError(f"the {split} split of data.source={d.source!r} has no tokens")
    counts[PAD_ID] = 0
    data_lib.atomic_save_npy(counts_path, counts)  # whole or not at all: "cached?" checks that it exists
    return path


def masking_spec(config: ml_collections.ConfigDict, tokenizer) -> MaskingSpec:
    d = config.data
    ids = special_ids(tokenizer)
    return MaskingSpec(
        mask_id=ids.mask,
        vocab_size=tokenizer.vocab_size,
        special_ids=ids.all,
        max_predictions=d.max_predictions,
        rate=d.mask_rate,
        mask_fraction=d.mask_token_fraction,
        random_fraction=d.random_token_fraction,
        word_starts=tokenizer.word_starts() if d.whole_word else None,
        pad_id=PAD_ID,
        budget=d.mask_budget,
    )


def next_token_ids(tokenizer) -> np.ndarray:
    """The ids a causal LM predicts: all but padding and [CLS] (which only starts a sequence)."""
    cls = special_ids(tokenizer).cls
    return np.asarray([i for i in range(tokenizer.vocab_size) if i not in (PAD_ID, cls)], np.int64)


def _masker(spec: MaskingSpec, seed_parts: tuple[int, ...]):
    def transform(row: int, ex: dict) -> dict:
        return mask_tokens(ex["tokens"], np.random.default_rng([*seed_parts, row]), spec)

    return transform


def _unmasked(row: int, ex: dict) -> dict:
    return {"inputs": ex["tokens"]}


def open_split(records_path: Path) -> tuple[grain.MapDataset, np.ndarray]:
    """A cached split's records and token counts, opened (the file stays open: deleted later, it is still read)."""
    return data_lib.read_records(records_path), np.load(records_path.with_suffix(".counts.npy"))


def train_batches(
    records: grain.MapDataset, config: ml_collections.ConfigDict, spec: MaskingSpec | None
) -> grain.IterDataset:
    """Infinite masked batches of the training split's `records`; row r of the run (step × batch + row) is masked
    with rng (seed, r). `spec=None` (causal LM): the sequences as they are."""
    return data_lib.train_batches(
        records,
        global_batch=config.train.batch_size,
        seed=config.seed,
        row_transform=_unmasked if spec is None else _masker(spec, (config.seed,)),
    )


def eval_batches(records: grain.MapDataset, config: ml_collections.ConfigDict, spec: MaskingSpec | None, split: str):
    """Every held-out sequence once, with masks fixed by (seed, split, index) (`spec=None`: unmasked)."""
    return data_lib.eval_batches(
        records,
        global_batch=config.train.eval_batch_size or config.train.batch_size,
        row_transform=_unmasked if spec is None else _masker(spec, (config.seed, zlib.crc32(split.encode()))),
    )


def unigram_perplexity(train_counts: np.ndarray, eval_counts: np.ndarray, scored_ids: np.ndarray) -> float:
    """Perplexity of the held-out tokens with ids `scored_ids` under the training split's unigram distribution over
    those ids (add-one), from each split's token counts (`open_split`): the baseline a model that ignores context
    can at best reach. `scored_ids`: an MLM's maskable ids (`MaskingSpec.ordinary_ids`); a causal LM's, every id."""
    train = train_counts[scored_ids] + 1.0
    held_out = eval_counts[scored_ids]
    log_p = np.log(train / train.sum())
    return float(np.exp(-(held_out * log_p).sum() / max(held_out.sum(), 1)))
