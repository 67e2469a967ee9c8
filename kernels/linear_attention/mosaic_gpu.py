"""Linear attention for Hopper GPUs in Mosaic GPU (`plgpu.kernel`): chunk-parallel, TMA copies and wgmma.
EXPERIMENTAL.

The numerator is a chunked product, as flash-linear-attention's chunk kernels compute it:

    num_i = Σ_{j ≤ i} (φq_i·φk_j) v_j = φq_i P_c + Σ_{j ≤ i in chunk c} (φq_i·φk_j) v_j,   P_c = Σ_{c' < c} φk_c'ᵀ v_c'

  1. `chunk_prefix`: one CUDA block per (64 × 64 tile of the m × d_v state, head, batch) scans the chunks with
     the state in an fp32 wgmma accumulator and stores each chunk's exclusive prefix P_c in bf16 (φk_c
     transposed in shared memory as the wgmma's A operand); chunks come through two TMA slots.
  2. `chunk_outputs`: one CUDA block per (chunk, head, batch): φq_c P_c + tril(φq_c φk_cᵀ) v_c, wgmma into an
     fp32 accumulator, rows scaled by 1/stab(den) before the store.

The state and the within-chunk scores go through bf16 as wgmma operands (as P does in flash attention), with
fp32 accumulation: the Triton kernels round the same products the same way for bf16 inputs.
Step 2's grid is B·H·T/C blocks and step 1's B·H·(m/64)·(d_v/64): a small batch · heads still fills the SMs.

The denominator den_i = φq_i · Σ_{j ≤ i} φk_j is a cumulative sum of φk (m values per row) and a row dot,
left to XLA (one `reduce_window` and elementwise passes over `[B, T, H, m]`; its gradients too).

Backward: the product r_i Σ_{j vis i} (a_i·b_j) c_j has gradients that are the same product again —
da = product(dO, c, b; r), db = product(c, G, a) and dc = product(b, a, G) with G = r·dO, over the reversed
(anti-causal) visibility — so the two kernels serve forward and backward (`mode`: causal, anticausal, full).

`kernels="xla"` runs the same chunk algorithm with XLA einsums in place of the two kernels: the algebra
(prefixes, the rounded state, masks, the custom VJP) is tested against the reference on any machine; the
kernels themselves lower for CUDA on a CPU (tests/kernels/test_linear_attention_mosaic_gpu.py) and run only on a
GPU — JAX 0.10's GPU interpret mode has no rule for their layout casts and accumulator state.
Limits (`supported` says why not; reviewed against JAX's attention_mgpu: kernels/README.md): bf16 inputs of one
dtype (fp16's range is too small for the rounded prefix state), m and d_v multiples of 64 with m·d_v ≤ 128²,
chunk·(max(m, d_v) + 1.5·chunk) ≤ 200·128 (chunk 64 at dims up to 256), lengths whole chunks, no causal masks with
CUDA 12.8–12.9.0. `impl="auto"` and `pallas_backend="gpu"` run them only from a `kernels.auto` entry.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.mosaic_gpu_tiles import load_reduced, masked_refusal, scores_tile, swizzled, visible
from kernels.numerics import stabilise_denominator

STATE_TILE = 64  # the prefix kernel's state tile: one 64 × 64 fp32 accumulator (32 registers a thread)
STAGES = 2  # the prefix kernel's chunks in flight
MAX_STATE_ENTRIES = 128 * 128
# A chunk's fp32 C × d_v output and C × C scores (plus their bf16 copy, half as many registers) in one
# warpgroup's registers: chunk·(d_v + 1.5·chunk) entries, 200 a thread at most (128 threads), leaving room for
# addresses. Chunk 64 takes dims up to 256; chunk 128 would need 256 a thread at dims 64 and is refused.
MAX_CHUNK_ENTRIES = 200 * 128
_REVERSED = {"causal": "anticausal", "anticausal": "causal", "full": "full"}


@dataclasses.dataclass(frozen=True)
class MgpuChunkSizes:
    """chunk: sequence positions per CUDA block (a multiple of 64: the wgmma row tile)."""

    chunk: int = 64

    def __post_init__(self):
        if self.chunk < 64 or self.chunk % 64:
            raise ValueError(f"MgpuChunkSizes.chunk must be a positive multiple of 64, got {self.chunk}")


def supported(
    phi_q: jax.Array, v: jax.Array, sizes: MgpuChunkSizes, kernels: str = "mosaic", causal: bool = True
) -> str | None:
    """None if the kernels take these inputs, else why not (the XLA stand-ins take any float dtype and dims).
    `causal`: the kernels then carry causal masks (refused with the CUDA versions that miscompile them)."""
    if phi_q.shape[1] % sizes.chunk:
        length = phi_q.shape[1]
        return f"Mosaic GPU linear attention needs lengths that are whole chunks: {length} for chunk {sizes.chunk}"
    if kernels != "mosaic":
        return None
    if phi_q.dtype != jnp.bfloat16:
        # fp16 is refused: the fp32 prefix state enters wgmma rounded to the input dtype, and a sum over
        # thousands of φ(k)vᵀ passes fp16's 65,504 at long lengths (bf16 has fp32's range).
        return f"Mosaic GPU linear attention takes bf16 inputs, got {phi_q.dtype}"
    if phi_q.dtype != v.dtype:  # φ(q) is staged in v's dtype
        return f"Mosaic GPU linear attention needs φ(q), φ(k) and v of one dtype, got {phi_q.dtype}, {v.dtype}"
    if phi_q.shape[-1] % 64 or v.shape[-1] % 64:
        return (
            f"Mosaic GPU linear attention needs feature and value dims that are multiples of 64, "
            f"got {phi_q.shape[-1]}, {v.shape[-1]}"
        )
    m, dv, chunk = phi_q.shape[-1], v.shape[-1], sizes.chunk
    # The output kernel holds a chunk's m × d_v state in shared memory (32 KiB at 128 × 128 in bf16) and its
    # C × C scores beside its C × d_v fp32 output in one warpgroup's registers (a guess until measured).
    if m * dv > MAX_STATE_ENTRIES:
        return (
            f"Mosaic GPU linear attention keeps a chunk's m × d_v state in shared memory: "
            f"{m} × {dv} is over {MAX_STATE_ENTRIES} entries"
        )
    if chunk * (max(m, dv) + 1.5 * chunk) > MAX_CHUNK_ENTRIES:
        return (
            f"Mosaic GPU linear attention keeps a chunk's scores and outputs in one warpgroup's registers: "
            f"chunk {chunk} with dims {m}, {dv} is over {MAX_CHUNK_ENTRIES} entries (a smaller chunk)"
        )
    if causal and (reason := masked_refusal()):
        return reason
    return None


# The two kernels


def _chunk_prefix_mosaic(b: jax.Array, c: jax.Array, chunk: int, mode: str) -> jax.Array:
    """P_c = Σ_{rows of the chunks before c (causal), after c (anticausal)} b_rowᵀ c_row, `[B, H, T/C, X, Y]` in
    c's dtype; "full": the sum over every row, `[B, H, 1, X, Y]`.

    One CUDA block per (64 × 64 tile of the state, head, batch) scans the chunks in order (reversed when
    anticausal), the state in an fp32 wgmma accumulator: before adding chunk c it stores the state so far, in
    c's dtype, as chunk c's prefix; the chunks' b and c tiles come through `STAGES` TMA slots. The states never
    pass through XLA in fp32 (flash-linear-attention's `chunk_fwd_h` stores them the same way)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    batch_size, t, heads, x = b.shape
    y = c.shape[-1]
    n = t // chunk
    dtype = c.dtype
    bx, by = STATE_TILE, STATE_TILE
    y_tiles = y // by
    stages = min(STAGES, n)

    def kernel(b_ref, c_ref, o_ref):
        batch, head, tile = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("tiles")
        cols_x, cols_y = pl.ds(lax.div(tile, y_tiles) * bx, bx), pl.ds(lax.rem(tile, y_tiles) * by, by)

        def chunk_index(step):
            return n - 1 - step if mode == "anticausal" else step

        def with_buffers(b_smem, c_smem, state_smem, b_bar, c_bar):
            def fetch(step, slot):
                rows = pl.ds(chunk_index(step) * chunk, chunk)
                plgpu.copy_gmem_to_smem(b_ref.at[batch, rows, head, cols_x], b_smem.at[slot], b_bar.at[slot])
                plgpu.copy_gmem_to_smem(c_ref.at[batch, rows, head, cols_y], c_smem.at[slot], c_bar.at[slot])

            for slot in range(stages):
                fetch(slot, slot)

            def store(state, index):
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last state has left the tile
                state_smem[...] = state.astype(dtype)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(state_smem, o_ref.at[batch, head, index, cols_x, cols_y])

            def step(s, state):
                slot = lax.rem(s, stages)
                if mode != "full":
                    store(state, chunk_index(s))  # the exclusive prefix of this chunk
                plgpu.barrier_wait(b_bar.at[slot])
                plgpu.barrier_wait(c_bar.at[slot])

                def add(acc_ref):
                    plgpu.wgmma(acc_ref, b_smem.at[slot].transpose((1, 0)), c_smem.at[slot])

                state = pl.run_state(add)(plgpu.ACC.init(state))  # waited for: the slot's tiles are read

                @pl.when(s + stages < n)
                def _():
                    fetch(s + stages, slot)

                return state

            state = plgpu.layout_cast(jnp.zeros((bx, by), jnp.float32), plgpu.Layout.WGMMA)
            state = lax.fori_loop(0, n, step, state)
            if mode == "full":
                store(state, 0)
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(
            with_buffers,
            plgpu.SMEM((stages, chunk, bx), b.dtype, transforms=swizzled(b.dtype)),
            plgpu.SMEM((stages, chunk, by), dtype, transforms=swizzled(dtype)),
            plgpu.SMEM((bx, by), dtype, transforms=swizzled(dtype)),
            plgpu.Barrier(num_barriers=stages),
            plgpu.Barrier(num_barriers=stages),
        )

    n_out = 1 if mode == "full" else n
    return plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((batch_size, heads, n_out, x, y), dtype),
        grid=((x // bx) * y_tiles, heads, batch_size),
        grid_names=("tiles", "heads", "batch"),
    )(b, c)


def _chunk_outputs_mosaic(a, b, c, p, r, chunk: int, mode: str) -> jax.Array:
    """r_i (a_i P_c + Σ_{j vis i in chunk c} (a_i·b_j) c_j), `[B, T, H, Y]` in c's dtype; P `[B, H, T/C, X, Y]`
    in c's dtype (`[B, H, 1, X, Y]` when mode is "full", which has no within-chunk term)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    batch_size, t, heads, x = a.shape
    y = c.shape[-1]
    n = t // chunk
    dtype = c.dtype
    within = mode != "full"

    def kernel(a_ref, b_ref, c_ref, p_ref, r_ref, o_ref):
        batch, head, block = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("chunks")
        start = block * chunk
        rows = (batch, pl.ds(start, chunk), head)
        state = (batch, head, block if within else 0)

        def with_buffers(a_smem, b_smem, c_smem, p_smem, r_smem, o_smem, bar):
            copies = [(a_ref.at[rows], a_smem), (p_ref.at[state], p_smem)]
            copies.append((r_ref.at[batch, head, pl.ds(start, chunk)], r_smem))
            if within:
                copies += [(b_ref.at[rows], b_smem), (c_ref.at[rows], c_smem)]
            for i, (src, dst) in enumerate(copies):
                plgpu.copy_gmem_to_smem(src, dst, bar.at[i])
            for i in range(len(copies)):
                plgpu.barrier_wait(bar.at[i])

            scores = None
            if within:
                rule = "row_ge_col" if mode == "causal" else "row_le_col"
                s = scores_tile(a_smem, b_smem, (chunk, chunk))
                scores = jnp.where(visible(0, 0, (chunk, chunk), rule), s, 0.0).astype(dtype)

            def output(acc_ref):
                plgpu.wgmma(acc_ref, a_smem, p_smem)
                if within:
                    plgpu.wgmma(acc_ref, scores, c_smem)
                return acc_ref[...]

            acc = pl.run_scoped(output, plgpu.ACC((chunk, y), jnp.float32))
            scale = load_reduced(r_smem, plgpu.Layout.WGMMA.reduce(1))
            o_smem[...] = (acc * lax.broadcast_in_dim(scale, (chunk, y), [0])).astype(dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_smem, o_ref.at[rows])
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(
            with_buffers,
            plgpu.SMEM((chunk, x), dtype, transforms=swizzled(dtype)),
            plgpu.SMEM((chunk, x), dtype, transforms=swizzled(dtype)),
            plgpu.SMEM((chunk, y), dtype, transforms=swizzled(dtype)),
            plgpu.SMEM((x, y), dtype, transforms=swizzled(dtype)),
            plgpu.SMEM((chunk,), jnp.float32),
            plgpu.SMEM((chunk, y), dtype, transforms=swizzled(dtype)),
            plgpu.Barrier(num_barriers=5 if within else 3),
        )

    return plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((batch_size, t, heads, y), dtype),
        grid=(n, heads, batch_size),
        grid_names=("chunks", "heads", "batch"),
    )(a, b, c, p, r)


# The same two steps in XLA (fp32 einsums, the state rounded to c's dtype as the kernels store it), for testing
# the chunk algorithm where the kernels cannot run.
def _chunk_prefix_xla(b: jax.Array, c: jax.Array, chunk: int, mode: str) -> jax.Array:
    batch_size, t, heads, x = b.shape
    b5 = b.astype(jnp.float32).reshape(batch_size, t // chunk, chunk, heads, x)
    c5 = c.astype(jnp.float32).reshape(batch_size, t // chunk, chunk, heads, c.shape[-1])
    states = jnp.einsum("bnchx,bnchy->bhnxy", b5, c5, precision=lax.Precision.HIGHEST)
    if mode == "full":
        return jnp.sum(states, axis=2, keepdims=True).astype(c.dtype)
    inclusive = lax.cumsum(states, axis=2, reverse=mode == "anticausal")
    zero = jnp.zeros_like(states[:, :, :1])
    if mode == "causal":
        return jnp.concatenate([zero, inclusive[:, :, :-1]], axis=2).astype(c.dtype)
    return jnp.concatenate([inclusive[:, :, 1:], zero], axis=2).astype(c.dtype)


def _chunk_outputs_xla(a, b, c, p, r, chunk: int, mode: str) -> jax.Array:
    batch_size, t, heads, x = a.shape
    n, f32, hi = t // chunk, jnp.float32, lax.Precision.HIGHEST

    def chunks(z):
        return z.astype(f32).reshape(batch_size, n, chunk, heads, z.shape[-1])

    p = jnp.broadcast_to(p.astype(f32), (batch_size, heads, n, x, c.shape[-1]))
    acc = jnp.einsum("bnchx,bhnxy->bnchy", chunks(a), p, precision=hi)
    if mode != "full":
        s = jnp.einsum("bnihx,bnjhx->bnhij", chunks(a), chunks(b), precision=hi)
        i, j = jnp.arange(chunk)[:, None], jnp.arange(chunk)[None, :]
        s = jnp.where(i >= j if mode == "causal" else i <= j, s, 0.0).astype(c.dtype).astype(f32)
        acc = acc + jnp.einsum("bnhij,bnjhy->bnihy", s, chunks(c), precision=hi)
    scale = r.transpose(0, 2, 1).reshape(batch_size, n, chunk, heads, 1)
    return (acc * scale).reshape(batch_size, t, heads, -1).astype(c.dtype)


_KERNELS = {"mosaic": (_chunk_prefix_mosaic, _chunk_outputs_mosaic), "xla": (_chunk_prefix_xla, _chunk_outputs_xla)}


# The chunked product and its VJP


def _product_impl(a, b, c, r, mode, chunk, kernels):
    prefix_fn, outputs_fn = _KERNELS[kernels]
    return outputs_fn(a, b, c, prefix_fn(b, c, chunk, mode), r, chunk, mode)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def chunked_product(a, b, c, r, mode: str, chunk: int, kernels: str = "mosaic"):
    """r_i Σ_{j vis i} (a_i·b_j) c_j: a, b `[B, T, H, X]`, c `[B, T, H, Y]`, r `[B, H, T]` fp32; `mode` says
    which j are visible to i (causal j ≤ i, anticausal j ≥ i, full: all). Returns c's dtype."""
    return _product_impl(a, b, c, r, mode, chunk, kernels)


def _product_fwd(a, b, c, r, mode, chunk, kernels):
    out = _product_impl(a, b, c, r, mode, chunk, kernels)
    return out, (a, b, c, r, out)


def _product_bwd(mode, chunk, kernels, residuals, d_out):
    a, b, c, r, out = residuals
    r_rows = r.transpose(0, 2, 1)[..., None]  # [B, T, H, 1]
    # out = r·u with r > 0 (1/stab(den) in linear attention): dr_i = Σ_y dO_iy u_iy = Σ_y dO_iy out_iy / r_i.
    dr = (jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True) / r_rows)[..., 0]
    g = (d_out.astype(jnp.float32) * r_rows).astype(c.dtype)
    ones = jnp.ones_like(r)
    back = _REVERSED[mode]
    da = _product_impl(d_out.astype(c.dtype), c, b, r, mode, chunk, kernels)  # Σ_j (r_i dO_i·c_j) b_j
    db = _product_impl(c, g, a, ones, back, chunk, kernels)  # Σ_{i sees j} (c_j·G_i) a_i
    dc = _product_impl(b, a, g, ones, back, chunk, kernels)  # Σ_{i sees j} (b_j·a_i) G_i
    return da.astype(a.dtype), db.astype(b.dtype), dc, dr.transpose(0, 2, 1)


chunked_product.defvjp(_product_fwd, _product_bwd)


def linear_attention_mosaic_gpu(
    phi_q: jax.Array,
    phi_k: jax.Array,
    v: jax.Array,
    *,
    causal: bool,
    eps: float,
    eps_mode: str = "add",
    block_sizes: MgpuChunkSizes | None = None,
    kernels: str = "mosaic",
) -> jax.Array:
    """The Mosaic GPU kernels, from what every linear backend takes (kernels/README.md).
    `kernels="xla"`: the same chunk algorithm without the Mosaic kernels (module docstring). Raises
    ValueError for inputs `supported` refuses."""
    if kernels not in _KERNELS:
        raise ValueError(f"unknown kernels {kernels!r}; valid: {', '.join(_KERNELS)}")
    sizes = block_sizes or MgpuChunkSizes()
    reason = supported(phi_q, v, sizes, kernels, causal)
    if not reason and kernels == "mosaic" and phi_k.dtype != phi_q.dtype:
        reason = f"Mosaic GPU linear attention needs φ(q), φ(k) and v of one dtype, got φ(k) {phi_k.dtype}"
    if reason:
        raise ValueError(reason)
    kf = phi_k.astype(jnp.float32)
    z = jnp.cumsum(kf, axis=1) if causal else jnp.sum(kf, axis=1, keepdims=True)
    den = jnp.sum(phi_q.astype(jnp.float32) * z, axis=-1)  # [B, T, H]
    inv = (1.0 / stabilise_denominator(den, eps, eps_mode)).transpose(0, 2, 1)
    return chunked_product(phi_q, phi_k, v, inv, "causal" if causal else "full", sizes.chunk, kernels)
