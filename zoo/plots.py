"""Figures without a display: matplotlib's Agg backend, and a PNG written atomically (never half a file)."""

from __future__ import annotations

import os
from pathlib import Path


def pyplot():
    """`matplotlib.pyplot` on the Agg backend (imported on first use: most commands draw nothing)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | os.PathLike, dpi: int = 110) -> Path:
    """Writes `fig` to `path` through a temporary file, then closes it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + f".tmp{os.getpid()}" + path.suffix)
    fig.savefig(tmp, dpi=dpi)
    pyplot().close(fig)
    os.replace(tmp, path)
    return path
