"""Paths the user gives (workdirs: local or a URL such as gs://bucket/run) and files written whole or not at all.

Every workdir goes through `as_path`, an `etils.epath.Path`, so a URL stays one (pathlib would turn `gs://b/r`
into the local `gs:/b/r`); inputs that must be local go through `require_local`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
from collections.abc import Iterator
from typing import IO

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


class MissingExtra(ImportError):
    """An optional dependency that a command needs is not installed (the message names the extra)."""


# Object stores a workdir may live in, and the package (in the `cloud` extra) that epath reaches each through.
URL_SCHEMES = {"gs": "gcsfs", "s3": "s3fs"}


def _local(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


def is_url(path: str | os.PathLike) -> bool:
    """True for `scheme://...` (gs, s3): a path no local-filesystem call may touch. `file://` is local."""
    return "://" in _local(os.fspath(path))


def as_path(path: str | os.PathLike) -> epath.Path:
    """`path` as an epath.Path: a gs:// or s3:// URL stays a URL; a local path (file:// too) becomes absolute. Any
    other scheme, or one whose package is not installed, is a one-line error."""
    text = _local(os.fspath(path))
    if not is_url(text):
        return epath.Path(os.path.abspath(text))
    scheme = text.split("://", 1)[0]
    if scheme not in URL_SCHEMES:
        raise ValueError(
            f"{text}: {scheme}:// is not a supported location; use a local path, file://, "
            + " or ".join(f"{s}://" for s in URL_SCHEMES)
        )
    try:
        import fsspec

        fsspec.get_filesystem_class(scheme)  # imports the scheme's package
    except ImportError:
        raise MissingExtra(
            f"{text}: {scheme}:// paths need {URL_SCHEMES[scheme]}, an optional dependency: pip install "
            "'relu-linear-gmlp-zoo[cloud]' (or pip install -e '.[cloud]' in a checkout)"
        ) from None
    return epath.Path(text)


def check_utf8_path(path: str | os.PathLike, flag: str) -> None:
    """A one-line error when `path` is not valid UTF-8 (checkpoint libraries cannot store such names)."""
    text = os.fspath(path)
    try:
        (text.encode() if isinstance(text, str) else text).decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        raise ValueError(f"{flag}={text!r}: the path is not valid UTF-8; use a name made of UTF-8 text") from None


def require_local(path: str | os.PathLike, field: str) -> pathlib.Path:
    """A local `pathlib.Path`, or a one-line error naming `field` when `path` is a URL."""
    if is_url(path):
        raise ValueError(
            f"{field}={os.fspath(path)}: must be a local path (its files are memory-mapped or listed locally); "
            "copy it to local disk first (e.g. `gcloud storage cp -r`). Workdirs may be URLs."
        )
    return pathlib.Path(path)


def refuse_to_replace(paths, output_dir: str | os.PathLike, tool: str) -> None:
    """Raises ValueError when any of `paths` (what `tool` would write in `output_dir`) exists (--overwrite)."""
    existing = [str(p) for p in paths if pathlib.Path(p).exists()]
    if existing:
        raise ValueError(
            f"--output_dir={output_dir} already holds {', '.join(existing)}: {tool} would replace them "
            "(--overwrite to do so)"
        )


def read_json(path: str | os.PathLike, hint: str = "move it away to have it made again"):
    """The JSON value in `path`, or a one-line ValueError naming the file (not JSON, not UTF-8) and `hint`."""
    try:
        return json.loads(as_path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a readable JSON file ({e}); {hint}") from None


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **open_args) -> Iterator[IO]:
    """`with atomic_open(path) as f:` writes a local `path` whole or not at all (a temporary file beside it, renamed
    over it at the end). Whatever fails, the temporary file is removed; an OS error names `path`."""
    path = pathlib.Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tmp.open(mode, **open_args) as f:
            yield f
        os.replace(tmp, path)
    except OSError as e:
        if e.filename is not None and os.fspath(e.filename) == os.fspath(path):
            raise
        raise OSError(e.errno, f"{e.strerror or e} (while writing it)", os.fspath(path)) from None
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Writes `path` whole or not at all: locally with `atomic_open`; an object store publishes an object only
    when its upload completes, so a direct write is whole-or-nothing there."""
    if is_url(path):
        epath.Path(os.fspath(path)).write_bytes(data)
        return
    with atomic_open(path, "wb") as f:
        f.write(data)
