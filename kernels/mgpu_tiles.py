"""Pieces the Mosaic GPU (Hopper) kernels share: shared-memory tile layouts, a score tile, causal masks.

Imported inside the kernel builders only (`jax.experimental.pallas.mosaic_gpu` is needed to build a kernel,
not to import the ops).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def swizzled(dtype) -> tuple:
    """128-byte swizzled shared-memory tiles, the wgmma operand layout: rows of 64 16-bit or 32 32-bit values."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return plgpu.TilingTransform((8, 128 // jnp.dtype(dtype).itemsize)), plgpu.SwizzleTransform(128)


def scores_tile(a_smem, b_smem, shape: tuple[int, int]) -> jax.Array:
    """a · bᵀ (both shared-memory tiles, b read transposed) by one wgmma into a fresh fp32 accumulator."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def run(acc_ref):
        plgpu.wgmma(acc_ref, a_smem, plgpu.transpose_ref(b_smem, (1, 0)))
        return acc_ref[...]

    return pl.run_scoped(run, plgpu.ACC(shape, jnp.float32))


def visible(rows_start, cols_start, shape: tuple[int, int], rule: str) -> jax.Array:
    """Which entries of a score tile whose rows start at `rows_start` and columns at `cols_start` (in the
    wgmma accumulator layout) are visible: rule "row_ge_col" (causal, query rows × key columns) or
    "row_le_col" (anti-causal, or causal for a transposed tile: key rows × query columns)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    rows = plgpu.broadcasted_iota(jnp.int32, shape, 0, layout=plgpu.Layout.WGMMA) + rows_start
    cols = plgpu.broadcasted_iota(jnp.int32, shape, 1, layout=plgpu.Layout.WGMMA) + cols_start
    if rule == "row_ge_col":
        return rows >= cols
    if rule == "row_le_col":
        return rows <= cols
    raise ValueError(f"unknown visibility rule {rule!r}")
