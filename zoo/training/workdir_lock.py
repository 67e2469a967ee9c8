"""One run per workdir: a lock file that names its holder.

`workdir/lock` holds the holder's host, process id, start time and command line; a second run is refused with
one line naming it. A killed run's lock is taken over: on the same host when its process no longer exists; from
another host when the holder has not refreshed the file (every `REFRESH_EVERY_S`) for `STALE_AFTER_S` seconds.

Local workdirs take the lock with an exclusive create (atomic); a URL workdir (gs://, s3://) has no such
operation, so there the lock catches a second run started while the first is going, not a race.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import threading
import time

from etils import epath

from zoo.files import as_path, atomic_write_bytes, is_url

LOCK_NAME = "lock"
REFRESH_EVERY_S = 60.0
STALE_AFTER_S = 600.0


class WorkdirBusy(RuntimeError):
    """Another run holds the workdir."""


def _holder() -> dict:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv)[:500],
    }


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def _read(path: epath.Path) -> dict | None:
    try:
        holder = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, UnicodeDecodeError):
        return {}  # unreadable: a half-written lock, judged by its age alone
    return holder if isinstance(holder, dict) else {}


def stale_reason(path: epath.Path, holder: dict, *, now: float | None = None) -> str | None:
    """Why the lock `holder` (read from `path`) is stale, or None when its run may still be going."""
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
        if holder["pid"] == os.getpid():
            return None  # this process holds it: taking it twice is a bug, reported as busy
        return None if _process_exists(holder["pid"]) else f"process {holder['pid']} no longer exists"
    try:
        age = (now or time.time()) - path.stat().mtime
    except (OSError, AttributeError):
        return None
    return f"not refreshed for {age / 60:.0f} minutes" if age > STALE_AFTER_S else None


class WorkdirLock:
    """`with WorkdirLock(workdir):` holds `workdir/lock` for the block (process 0 only; others hold nothing)."""

    def __init__(self, workdir: str | os.PathLike, *, enabled: bool = True, name: str = LOCK_NAME):
        self.workdir = as_path(workdir)
        self.path = self.workdir / name
        self.enabled = enabled
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None

    def _describe(self, holder: dict) -> str:
        if not holder:
            return (
                f"a run whose lock file cannot be read (half-written, or not a lock; it counts as a run's until "
                f"{STALE_AFTER_S / 60:.0f} minutes old)"
            )
        return f"process {holder.get('pid', '?')} on {holder.get('host', '?')} since {holder.get('started', '?')}"

    def _create(self, holder: dict) -> bool:
        """Creates the lock file when there is none; False when one exists."""
        data = json.dumps(holder, indent=1).encode()
        if is_url(self.workdir):
            if self.path.exists():
                return False
            self.path.write_bytes(data)
            return True
        try:
            fd = os.open(os.fspath(self.path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True

    def acquire(self) -> None:
        if not self.enabled:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        mine = _holder()
        for _ in range(3):  # a lock released or taken over between our looks: look again
            if self._create(mine):
                break
            holder = _read(self.path)
            if holder is None:
                continue
            reason = stale_reason(self.path, holder)
            if reason is None:
                raise WorkdirBusy(
                    f"{self.workdir} is in use by {self._describe(holder)}; wait for that run to end, or delete "
                    f"{self.path} if it is gone"
                )
            print(f"taking over the lock of {self._describe(holder)}: {reason}", flush=True)
            atomic_write_bytes(self.path, json.dumps(mine, indent=1).encode())
            break
        else:
            raise WorkdirBusy(f"{self.path} keeps changing: another run is starting in {self.workdir}")
        self._refresher = threading.Thread(target=self._refresh, name="workdir-lock", daemon=True)
        self._refresher.start()

    def _refresh(self) -> None:
        # Rewriting the same content moves the file's mtime: another host reads it as "still alive".
        while not self._stop.wait(REFRESH_EVERY_S):
            try:
                atomic_write_bytes(self.path, self.path.read_bytes())
            except OSError:
                pass  # a failed refresh at worst lets a lock look stale earlier

    def release(self) -> None:
        if not self.enabled or self._refresher is None:
            return
        self._stop.set()
        self._refresher.join()
        self._refresher = None
        holder = _read(self.path)
        if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> WorkdirLock:
        self.acquire()
        return self

    def __exit__(self, *_exc) -> None:
        self.release()
