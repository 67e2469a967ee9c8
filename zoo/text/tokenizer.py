"""Tokenizers with one id layout: 0 pad, 1 unk, 2 bos, 3 eos, then the task's special symbols, then pieces.

`SentencePieceTokenizer` is trained on a corpus (vocabulary size from the config) or loaded from a
`.model` file; `WordTokenizer` takes text that is already tokenised (e.g. fairseq's BPE output) as it is,
splitting on whitespace, with a vocabulary built deterministically from the training split.
"""

from __future__ import annotations

import collections
import io
import itertools
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import sentencepiece as spm

from zoo.files import as_path, atomic_write_bytes

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
_SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def detokenize(self, text: str) -> str: ...
    def piece_to_id(self, piece: str) -> int: ...
    def word_starts(self) -> np.ndarray: ...
    def save(self, path: str | os.PathLike) -> Path: ...


def _strip_specials(ids: Iterable[int]) -> list[int]:
    """Ids up to the first eos, without pad/bos."""
    return [i for i in itertools.takewhile(lambda i: i != EOS_ID, map(int, ids)) if i not in (PAD_ID, BOS_ID)]


def _save(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    atomic_write_bytes(path, data)  # creates the folder
    return path


class SentencePieceTokenizer:
    def __init__(self, model_proto: bytes, source: str = "<memory>"):
        self.proto = model_proto
        try:
            self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        except RuntimeError as e:  # a truncated or foreign file: SentencePiece's parse error names no file
            raise ValueError(f"{source} is not a SentencePiece model ({' '.join(str(e).split())})") from None
        if self.sp.pad_id() != PAD_ID or self.sp.eos_id() != EOS_ID or self.sp.bos_id() != BOS_ID:
            raise ValueError(
                f"SentencePiece model {source} has pad/bos/eos ids {self.sp.pad_id()}/{self.sp.bos_id()}/"
                f"{self.sp.eos_id()}; this project needs {PAD_ID}/{BOS_ID}/{EOS_ID} (train it with train_sentencepiece)"
            )
        self.vocab_size = self.sp.get_piece_size()

    @classmethod
    def load(cls, path: str | os.PathLike) -> SentencePieceTokenizer:
        path = as_path(path)  # a workdir's copy may be at a URL
        if not path.is_file():
            raise FileNotFoundError(f"SentencePiece model file {path} does not exist")
        return cls(path.read_bytes(), str(path))

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.sp.decode(_strip_specials(ids))

    def detokenize(self, text: str) -> str:
        """Raw text is what `decode` gives back: nothing to undo."""
        return text

    def piece_to_id(self, piece: str) -> int:
        i = self.sp.piece_to_id(piece)
        if i == UNK_ID and piece != "<unk>":
            raise KeyError(f"the SentencePiece model has no piece {piece!r}")
        return i

    def word_starts(self) -> np.ndarray:
        """`[vocab]` bool: the piece begins a word (SentencePiece marks word starts with ▁)."""
        return np.array(
            [self.sp.id_to_piece(i).startswith("▁") or self.sp.is_control(i) for i in range(self.vocab_size)]
        )

    def save(self, path: str | os.PathLike) -> Path:
        return _save(path, self.proto)


def train_sentencepiece(
    texts: Iterable[str], *, vocab_size: int, user_symbols: Sequence[str] = ()
) -> SentencePieceTokenizer:
    """Trains a SentencePiece model in memory on `texts` (one sentence or document per item)."""
    fixed = len(_SPECIALS) + len(user_symbols)  # pad, unk, bos, eos and the symbols: not pieces of text
    if vocab_size <= fixed:
        raise ValueError(
            f"a SentencePiece vocabulary of {vocab_size} leaves no piece for text: it holds {fixed} fixed ids "
            "(pad, unk, bos, eos and the user symbols) and needs more (data.vocab_size)"
        )
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError("cannot train a tokenizer: the corpus is empty")
    out = io.BytesIO()
    start = time.perf_counter()
    print(f"training SentencePiece (unigram, vocab {vocab_size}) on {len(texts):,} texts...", flush=True)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=out,
            vocab_size=vocab_size,
            model_type="unigram",
            character_coverage=0.9995,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            user_defined_symbols=list(user_symbols),
            input_sentence_size=2_000_000,
            shuffle_input_sentence=True,
            max_sentence_length=1 << 16,
            hard_vocab_limit=False,  # a small corpus may not support the full size: use what it supports
            num_threads=os.cpu_count() or 1,
            minloglevel=2,
        )
    except RuntimeError as e:
        raise ValueError(f"SentencePiece training failed (vocab_size={vocab_size}): {e}") from None
    tokenizer = SentencePieceTokenizer(out.getvalue())
    # hard_vocab_limit=False lets a small corpus give fewer pieces than asked: said, since the model's
    # embedding tables follow the tokenizer's size, not data.vocab_size.
    size = f"vocab {tokenizer.vocab_size:,}"
    if tokenizer.vocab_size < vocab_size:
        size += f", fewer than the {vocab_size:,} asked: the corpus supports no more pieces"
    print(f"SentencePiece trained in {time.perf_counter() - start:.1f} s ({size})", flush=True)
    return tokenizer


class WordTokenizer:
    """Whitespace tokens of already-tokenised text; fairseq's BPE separator "@@ " is undone on decode."""

    def __init__(self, pieces: Sequence[str]):
        if tuple(pieces[: len(_SPECIALS)]) != _SPECIALS:
            raise ValueError(f"a word vocabulary must start with {_SPECIALS}")
        first = {}
        for line, piece in enumerate(pieces, start=1):  # a token is what str.split() yields: one, not blank
            if piece.split() != [piece]:
                raise ValueError(f"line {line}: {piece!r} is not one whitespace-free token")
            if piece in first:
                raise ValueError(f"line {line}: {piece!r} is already on line {first[piece]}")
            first[piece] = line
        self.pieces = list(pieces)
        self.ids = {p: i for i, p in enumerate(self.pieces)}
        self.vocab_size = len(self.pieces)

    @classmethod
    def build(cls, texts: Iterable[str], *, max_size: int = 0) -> WordTokenizer:
        """Most frequent tokens first, ties by the token itself, so the vocabulary is deterministic."""
        counts = collections.Counter(tok for t in texts for tok in t.split())
        if not counts:
            raise ValueError("cannot build a vocabulary: the corpus is empty")
        ranked = sorted(counts, key=lambda tok: (-counts[tok], tok))
        ranked = [t for t in ranked if t not in _SPECIALS]
        if max_size:
            ranked = ranked[: max(0, max_size - len(_SPECIALS))]
        return cls([*_SPECIALS, *ranked])

    @classmethod
    def load(cls, path: str | os.PathLike) -> WordTokenizer:
        path = as_path(path)
        if not path.is_file():
            raise FileNotFoundError(f"vocabulary file {path} does not exist")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(
                f"vocabulary file {path} is not UTF-8 text ({e.reason} at byte {e.start}); a SentencePiece model "
                "is read as one only when its name ends in .model"
            ) from None
        lines = text.removesuffix("\n").split("\n")  # the last line counts with or without its newline
        try:
            return cls([line.removesuffix("\r") for line in lines])
        except ValueError as e:
            raise ValueError(f"vocabulary file {path}: {e}") from None

    def encode(self, text: str) -> list[int]:
        return [self.ids.get(tok, UNK_ID) for tok in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        return self.detokenize(" ".join(self.pieces[i] for i in _strip_specials(ids)))

    def detokenize(self, text: str) -> str:
        """`text` as `decode` writes its output: BPE pieces joined into words (fairseq's --remove-bpe). A
        reference must go through this too, or every word BPE split can never match a hypothesis."""
        return (text + " ").replace("@@ ", "").strip()

    def piece_to_id(self, piece: str) -> int:
        if piece not in self.ids:
            raise KeyError(f"the vocabulary has no token {piece!r}")
        return self.ids[piece]

    def word_starts(self) -> np.ndarray:
        # Each token is a word here; BPE continuation is a property of the sequence, not of the vocabulary.
        return np.ones((self.vocab_size,), bool)

    def save(self, path: str | os.PathLike) -> Path:
        return _save(path, "".join(p + "\n" for p in self.pieces).encode("utf-8"))


def load_tokenizer(path: str | os.PathLike) -> SentencePieceTokenizer | WordTokenizer:
    """A `.model` file is SentencePiece; anything else is a word vocabulary (one token per line)."""
    path = as_path(path)
    return SentencePieceTokenizer.load(path) if path.suffix == ".model" else WordTokenizer.load(path)
