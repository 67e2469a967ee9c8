"""Paths the user gives (workdirs: local or a URL such as gs://bucket/run) and files written whole or not at all.

Every workdir goes through `as_path`, an `etils.epath.Path`: a `gs://` or `s3://` workdir stays a URL all the
way to Orbax, TensorBoard and the JSON files (pathlib would turn `gs://b/r` into the local `gs:/b/r`).
Inputs that must be local (memory-mapped data caches) go through `require_local`, which says so.
"""

from __future__ import annotations

import os
import pathlib

from etils import epath


def parse_ordered_pair(text: str, sep: str, flag: str, form: str) -> tuple[int, int]:
    """ "a<sep>b" → (a, b) with 1 ≤ a ≤ b, or a one-line ValueError that names `flag` and the `form`."""
    try:
        a, b = (int(x) for x in text.split(sep))
    except ValueError:
        raise ValueError(f"{flag}={text!r} must be {form}") from None
    if not 1 <= a <= b:
        raise ValueError(f"{flag}={text!r}: {form} needs 1 <= first <= second")
    return a, b


def is_url(path: str | os.PathLike) -> bool:
    """True for `scheme://...` (gs, s3, ...): a path no local-filesystem call may touch."""
    return "://" in os.fspath(path)


def as_path(path: str | os.PathLike) -> epath.Path:
    """`path` as an epath.Path: a URL stays a URL; a local path becomes absolute (what Orbax wants)."""
    if is_url(path):
        return epath.Path(os.fspath(path))
    return epath.Path(os.path.abspath(os.fspath(path)))


def require_local(path: str | os.PathLike, field: str) -> pathlib.Path:
    """A local `pathlib.Path`, or a one-line error naming `field` when `path` is a URL."""
    if is_url(path):
        raise ValueError(
            f"{field}={os.fspath(path)}: must be a local path (its files are memory-mapped or listed locally); "
            "copy it to local disk first (e.g. `gcloud storage cp -r`). Workdirs may be URLs."
        )
    return pathlib.Path(path)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Writes `path` whole or not at all, so a reader (another process, a re-run) never sees half of it.

    Locally: a temporary file, then a rename. Object stores (gs://, s3://) publish an object only when its
    upload completes, so a direct write is already whole-or-nothing there (and renames are copies)."""
    if is_url(path):
        epath.Path(os.fspath(path)).write_bytes(data)
        return
    path = pathlib.Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
