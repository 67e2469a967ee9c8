"""Tiles of `[batch, length, heads, dim]` arrays for the GPU (Triton) kernels, read and written in place.

The kernels take q, k, v and write their outputs in the model's own layout: no head-major transposed or
padded copies in HBM around them (on an H100 those copies were 3 × 256 MiB of the ReLU kernel's temporaries
at every length, benchmarks/gpu/README.md). A BlockSpec may therefore be longer than the array — a sequence
that is not a whole number of tiles, a head dim that is not a power of two (Triton tiles must be) — and
Triton reads and writes past the end of what it is not told to mask, while interpret mode pads with NaN. So a
tile that can reach past the end is loaded with a mask (zeros there, which add nothing to any product the
kernels form) and stored with one. Which axes need it is static (`Extent`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

# `jax.experimental.pallas.triton` is imported when a masked tile is traced, not here (linear_attention/mosaic_tpu.py).


@dataclasses.dataclass(frozen=True)
class Extent:
    """An array axis of `size` elements whose tiles cover `padded` (≥ size): the grid's whole tiles along a
    sequence, the next power of two along a head dim. Tiles past `size` (partly or wholly) are masked."""

    size: int
    padded: int

    @classmethod
    def power_of_two(cls, size: int) -> Extent:
        """A head-dim axis: Triton tiles are powers of two."""
        return cls(size, 1 << max(size - 1, 0).bit_length())

    def __post_init__(self):
        if self.padded < self.size:
            raise ValueError(f"tiles cover {self.padded} of an axis of {self.size}")


def _mask(shape: tuple[int, int], rows: Extent, row0, cols: Extent, col0) -> jax.Array | None:
    mask = None
    if rows.padded != rows.size:
        mask = row0 + lax.broadcasted_iota(jnp.int32, shape, 0) < rows.size
    if cols.padded != cols.size:
        in_dim = col0 + lax.broadcasted_iota(jnp.int32, shape, 1) < cols.size
        mask = in_dim if mask is None else mask & in_dim
    return mask


def load_tile(ref, rows: Extent, row0, cols: Extent, col0=0) -> jax.Array:
    """`ref[...]`, a tile whose first element is (row0, col0) of an array with axes `rows` × `cols`; zeros
    past the end of either."""
    mask = _mask(ref.shape, rows, row0, cols, col0)
    if mask is None:
        return ref[...]
    from jax.experimental.pallas import triton as pl_triton

    return pl_triton.load(ref, mask=mask, other=0)


def store_tile(ref, value: jax.Array, rows: Extent, row0, cols: Extent, col0=0) -> None:
    """`ref[...] = value`, writing nothing past the end of `rows` or `cols` (as `load_tile`)."""
    mask = _mask(ref.shape, rows, row0, cols, col0)
    value = value.astype(ref.dtype)
    if mask is None:
        ref[...] = value
    else:
        from jax.experimental.pallas import triton as pl_triton

        pl_triton.store(ref, value, mask=mask)
