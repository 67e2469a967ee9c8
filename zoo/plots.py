"""Figures without a display: matplotlib's Agg backend, and a PNG written atomically (never half a file)."""

from __future__ import annotations

import io
import os
import pathlib

from etils import epath

from zoo.files import MissingExtra, as_path, atomic_write_bytes, is_url


def pyplot():
    """`matplotlib.pyplot` on the Agg backend (imported on first use: most commands draw nothing)."""
    try:
        import matplotlib
    except ImportError:
        raise MissingExtra(
            "drawing figures needs matplotlib, an optional dependency: pip install 'relu-linear-gmlp-zoo[plots]' "
            "(or pip install -e '.[plots]' in a checkout)"
        ) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | os.PathLike, dpi: int = 110) -> pathlib.Path | epath.Path:
    """Writes `fig` to `path` (local or a URL) whole or not at all, then closes it; returns the path."""
    path = as_path(path) if is_url(path) else pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    png = io.BytesIO()
    fig.savefig(png, dpi=dpi, format=path.suffix.lstrip(".") or "png")
    pyplot().close(fig)
    atomic_write_bytes(path, png.getvalue())
    return path
