"""Pieces the Mosaic GPU (Hopper) kernels share: shared-memory tile layouts, a score tile, causal masks.

Imported inside the kernel builders only (`jax.experimental.pallas.mosaic_gpu` is needed to build a kernel,
not to import the ops).
"""

from __future__ import annotations

import functools
import inspect

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

# CUDA runtimes whose ptxas miscompiles the masks of causal attention kernels: JAX's own Hopper attention
# (jax/experimental/pallas/ops/gpu/attention_mgpu.py) refuses causal inputs for 12.8.0 up to 12.9.1.
PTXAS_CAUSAL_MISCOMPILE = (12080, 12091)  # [first, last) cudaRuntimeGetVersion values


def cuda_runtime_version() -> int | None:
    """The CUDA runtime version as cudaRuntimeGetVersion gives it (12090 = 12.9), None without a CUDA plugin
    (a CPU lowering a kernel for CUDA: nothing is compiled by ptxas there)."""
    from jax._src.lib import cuda_versions

    return None if cuda_versions is None else int(cuda_versions.cuda_runtime_get_version())


def masked_refusal(version: int | None = None) -> str | None:
    """Why kernels with causal (or anti-causal) masks must not be compiled by this CUDA's ptxas, or None."""
    version = cuda_runtime_version() if version is None else version
    first, last = PTXAS_CAUSAL_MISCOMPILE
    if version is not None and first <= version < last:
        return (
            f"CUDA runtime {version // 1000}.{version % 1000 // 10}: its ptxas miscompiles causal masks in "
            f"Mosaic GPU attention kernels (refused from 12.8 up to 12.9.1, as JAX's own attention_mgpu does); "
            f"use CUDA ≥ 12.9.1 or the Triton kernels"
        )
    return None


def load_reduced(ref, layout):
    """`plgpu.load(ref, layout=...)` of a whole small ref: jax 0.10 needs the index `()`, jax 0.11 deprecates it."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    idx = inspect.signature(plgpu.load).parameters.get("idx")
    if idx is not None and idx.default is inspect.Parameter.empty:
        return plgpu.load(ref, (), layout=layout)
    return plgpu.load(ref, layout=layout)


def swizzled(dtype) -> tuple:
    """128-byte swizzled shared-memory tiles, the wgmma operand layout: rows of 64 16-bit or 32 32-bit values."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return plgpu.TilingTransform((8, 128 // jnp.dtype(dtype).itemsize)), plgpu.SwizzleTransform(128)


def scores_tile(a_smem, b_smem, shape: tuple[int, int]) -> jax.Array:
    """a · bᵀ (both shared-memory tiles, b read transposed) by one wgmma into a fresh fp32 accumulator."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def run(acc_ref):
        plgpu.wgmma(acc_ref, a_smem, b_smem.transpose((1, 0)))
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


def memory_warpgroup(fetch, steps, stages: int, consumed: tuple) -> None:
    """A warp-specialised kernel's memory warpgroup: `fetch(step, slot)` for the first `stages` steps, then step
    j + `stages` into j's slot once every compute warpgroup has arrived on each barrier of `consumed` there."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    plgpu.set_max_registers(40, action="decrease")
    for slot in range(stages):
        pl.when(slot < steps)(functools.partial(fetch, slot, slot))

    @pl.loop(0, jnp.maximum(steps - stages, 0))
    def _refill(j):
        slot = lax.rem(j, stages)
        for barrier in consumed:
            plgpu.barrier_wait(barrier.at[slot])
        fetch(j + stages, slot)
