"""The settings that generated LRA data was written with, recorded beside it (generator.json).

A run or a re-run that asks for other settings is refused with each field that differs, instead of training on, or
adding to, data its config does not describe. Files without the record (a release's, a user's) are not checked.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from zoo.files import atomic_write_bytes, read_json

RECORD = "generator.json"


def as_recorded(settings: dict) -> dict:
    """`settings` as JSON holds them (tuples become lists), so that they compare equal with a read record."""
    return json.loads(json.dumps(settings))


def read(directory: str | os.PathLike) -> dict | None:
    """The settings recorded in `directory`, None where there is no record."""
    path = Path(directory) / RECORD
    if not path.exists():
        return None
    remedy = "move it away (the data there is then used as it is)"
    if not isinstance(record := read_json(path, remedy), dict):
        raise ValueError(f"{path} is not a generator record (a JSON object): {remedy}")
    return record


FILE_BYTES = "file_bytes"  # the size each generated file had when written, beside the settings


def check(directory: str | os.PathLike, settings: dict, *, where: str, what: str, named: str, remedy: str) -> bool:
    """Whether `directory` has a record; raises ValueError, naming each field that differs, when its settings are
    not `settings` ("`where` holds `what` generated with other `named` (field: a there, b asked): `remedy`"), or
    when a generated file's size is not the one recorded (changed or cut short since)."""
    if (recorded := read(directory)) is None:
        return False
    sizes = recorded.pop(FILE_BYTES, {})
    asked = as_recorded(settings)
    changed = sorted(k for k in set(recorded) | set(asked) if recorded.get(k) != asked.get(k))
    if changed:
        fields = ", ".join(f"{k}: {recorded.get(k)!r} there, {asked.get(k)!r} asked" for k in changed)
        raise ValueError(f"{where} holds {what} generated with other {named} ({fields}): {remedy}")
    for name, size in sorted(sizes.items()):
        path = Path(directory) / name
        if path.exists() and (now := path.stat().st_size) != size:
            raise ValueError(
                f"{path} has {now:,} bytes but had {size:,} when generated ({RECORD}): it was changed "
                f"or cut short since; delete the generated files to have them written again, or move {RECORD} away "
                "to use them as they are"
            )
    return True


def write(directory: str | os.PathLike, settings: dict, files: Iterable[str] = ()) -> None:
    """Records `settings`, and the sizes of the generated `files` (names in `directory`)."""
    record = as_recorded(settings)
    if files:
        record[FILE_BYTES] = {name: (Path(directory) / name).stat().st_size for name in files}
    atomic_write_bytes(Path(directory) / RECORD, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode())
