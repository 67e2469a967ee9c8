"""ReLU attention forward for Hopper GPUs in Mosaic GPU (`plgpu.kernel`): TMA copies and wgmma. EXPERIMENTAL.

One CUDA block (one warpgroup) per (query tile, head, batch) of the caller's `[B, T, H, D]` arrays: the query
tile is copied to shared memory once, key/value tiles stream through `stages` shared-memory slots by TMA
(the copy of tile j + stages is issued as soon as tile j is consumed), QKᵀ and P·V are wgmma into fp32
accumulators, and causal programs stop at the diagonal.

What the kernel leaves to its caller (`relu_attention_mgpu`), each one elementwise pass in XLA: padded keys
are made invisible by zeroing their value rows (ReLU attention, unlike softmax, then needs no score mask), and
the row factor 1/(γ r(n_i)) scales the unnormalised output. The backward pass is the Triton kernels'
(`relu_attention_pallas`): same residuals.

Status: lowers for CUDA on a CPU (tests/kernels/test_relu_attention_mgpu.py, `jax.export`); JAX's GPU
interpret mode (jax 0.10) cannot run wgmma on transposed shared-memory refs, so its numbers are checked only
on a GPU (benchmarks/gpu/session.sh, step `mgpu`), and `impl="auto"` never selects it.
Limits: bf16/fp16 inputs, head dims multiples of 64 (128-byte swizzled tiles), lengths whole tiles (64 by
default; the Triton kernels mask ragged tails, this one does not yet).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl


@dataclasses.dataclass(frozen=True)
class MgpuBlockSizes:
    block_q: int = 64
    block_k: int = 64
    stages: int = 2  # key/value shared-memory slots in flight

    def __post_init__(self):
        if self.block_q % 64 or self.block_k % 64:
            raise ValueError(f"MgpuBlockSizes: tiles must be multiples of 64, got {self.block_q}×{self.block_k}")
        if self.stages < 1:
            raise ValueError(f"MgpuBlockSizes.stages must be ≥ 1, got {self.stages}")


def supported(q: jax.Array, k: jax.Array, v: jax.Array, sizes: MgpuBlockSizes) -> str | None:
    """None if the kernel takes these inputs, else why not."""
    if q.shape[1] % sizes.block_q or k.shape[1] % sizes.block_k:
        # attention_mgpu in JAX's own ops asks the same: reads past the end are not relied on
        return (
            f"Mosaic GPU ReLU attention needs lengths that are whole tiles: {q.shape[1]} and {k.shape[1]} "
            f"for {sizes.block_q}×{sizes.block_k} tiles"
        )
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        return f"Mosaic GPU ReLU attention takes bf16/fp16 inputs, got {q.dtype}"
    if q.shape[-1] % 64 or v.shape[-1] % 64:
        return f"Mosaic GPU ReLU attention needs head dims that are multiples of 64, got {q.shape[-1]}, {v.shape[-1]}"
    return None


def _forward_unscaled(q, k, v, *, causal: bool, scale: float, sizes: MgpuBlockSizes):
    """Σ_j ReLU(q_i·k_j·scale) [j ≤ i if causal] v_j, `[B, T_q, H, D_v]` in v's dtype."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b, tq, h, d = q.shape
    tk, dv = k.shape[1], v.shape[-1]
    bq, bk, stages = sizes.block_q, sizes.block_k, sizes.stages
    num_q, num_k = pl.cdiv(tq, bq), pl.cdiv(tk, bk)
    dtype = q.dtype
    swizzled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

    def kernel(q_ref, k_ref, v_ref, o_ref):
        batch, head, q_tile = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("q_tiles")
        q0 = q_tile * bq
        if causal:  # key tiles that start after this query tile's last row contribute nothing
            kv_steps = jnp.minimum(lax.div(q0 + bq + bk - 1, bk), num_k)
        else:
            kv_steps = num_k

        def fetch(step, slot, k_smem, v_smem, k_bar, v_bar):
            rows = (batch, pl.ds(step * bk, bk), head)
            plgpu.copy_gmem_to_smem(k_ref.at[rows], k_smem.at[slot], k_bar.at[slot])
            plgpu.copy_gmem_to_smem(v_ref.at[rows], v_smem.at[slot], v_bar.at[slot])

        def with_buffers(q_smem, k_smem, v_smem, o_smem, q_bar, k_bar, v_bar):
            plgpu.copy_gmem_to_smem(q_ref.at[batch, pl.ds(q0, bq), head], q_smem, q_bar.at[0])
            for slot in range(stages):  # fill the pipeline
                pl.when(slot < kv_steps)(functools.partial(fetch, slot, slot, k_smem, v_smem, k_bar, v_bar))

            plgpu.barrier_wait(q_bar.at[0])

            def with_accumulator(acc_ref):
                def step(j, carry):
                    slot = lax.rem(j, stages)
                    plgpu.barrier_wait(k_bar.at[slot])

                    def scores(s_ref):
                        plgpu.wgmma(s_ref, q_smem, plgpu.transpose_ref(k_smem.at[slot], (1, 0)))
                        return s_ref[...]

                    s = pl.run_scoped(scores, plgpu.ACC((bq, bk), jnp.float32)) * scale
                    p = jnp.maximum(s, 0.0)
                    if causal:
                        rows = plgpu.broadcasted_iota(jnp.int32, (bq, bk), 0, layout=plgpu.Layout.WGMMA)
                        cols = plgpu.broadcasted_iota(jnp.int32, (bq, bk), 1, layout=plgpu.Layout.WGMMA)
                        p = jnp.where(q0 + rows >= j * bk + cols, p, 0.0)
                    plgpu.barrier_wait(v_bar.at[slot])
                    plgpu.wgmma(acc_ref, p.astype(dtype), v_smem.at[slot])
                    plgpu.wgmma_wait(0)  # the slot is free once its tiles have been read

                    @pl.when(j + stages < kv_steps)
                    def _():
                        fetch(j + stages, slot, k_smem, v_smem, k_bar, v_bar)

                    return carry

                lax.fori_loop(0, kv_steps, step, None)
                o_smem[...] = acc_ref[...].astype(dtype)

            pl.run_scoped(with_accumulator, plgpu.ACC((bq, dv), jnp.float32))
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_smem, o_ref.at[batch, pl.ds(q0, bq), head])
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(
            with_buffers,
            plgpu.SMEM((bq, d), dtype, transforms=swizzled),
            plgpu.SMEM((stages, bk, d), dtype, transforms=swizzled),
            plgpu.SMEM((stages, bk, dv), dtype, transforms=swizzled),
            plgpu.SMEM((bq, dv), dtype, transforms=swizzled),
            plgpu.Barrier(num_barriers=1),
            plgpu.Barrier(num_barriers=stages),
            plgpu.Barrier(num_barriers=stages),
        )

    return plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((b, tq, h, dv), dtype),
        grid=(num_q, h, b),
        grid_names=("q_tiles", "heads", "batch"),
    )(q, k, v)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _attend(q, k, v, key_mask, factor, causal, sizes, triton_sizes):
    v_visible = jnp.where(key_mask[:, :, None, None], v, jnp.zeros((), v.dtype))
    out = _forward_unscaled(q, k, v_visible, causal=causal, scale=1 / math.sqrt(q.shape[-1]), sizes=sizes)
    return (out.astype(jnp.float32) * factor.transpose(0, 2, 1)[..., None]).astype(v.dtype)


def _attend_fwd(q, k, v, key_mask, factor, causal, sizes, triton_sizes):
    return _attend(q, k, v, key_mask, factor, causal, sizes, triton_sizes), (q, k, v, key_mask, factor)


def _attend_bwd(causal, sizes, triton_sizes, residuals, d_out):
    from kernels.relu_attention_pallas import relu_attention_pallas

    q, k, v, key_mask, factor = residuals

    def triton(q, k, v, factor):
        return relu_attention_pallas(
            q, k, v, key_mask, factor, causal=causal, block_sizes=triton_sizes, backend="gpu", interpret=False
        )

    _, vjp = jax.vjp(triton, q, k, v, factor)
    dq, dk, dv, dfactor = vjp(d_out)
    return dq, dk, dv, None, dfactor


_attend.defvjp(_attend_fwd, _attend_bwd)


def relu_attention_mgpu(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array,
    factor: jax.Array,
    *,
    causal: bool,
    block_sizes: MgpuBlockSizes | None = None,
    backward_block_sizes=None,
) -> jax.Array:
    """Σ_j factor_i · ReLU(q_i·k_j/√d) · m_ij · v_j: forward by the Mosaic GPU kernel, backward by the Triton
    kernels. Arguments as `relu_attention_pallas`; raises ValueError for inputs `supported` refuses."""
    sizes = block_sizes or MgpuBlockSizes()
    reason = supported(q, k, v, sizes)
    if reason:
        raise ValueError(reason)
    if causal and q.shape[1] != k.shape[1]:
        raise ValueError(f"causal attention needs equal lengths, got {q.shape[1]} and {k.shape[1]}")
    return _attend(q, k, v, key_mask, factor.astype(jnp.float32), causal, sizes, backward_block_sizes)
