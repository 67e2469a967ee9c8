"""Pallas kernels for ReLU attention (SPEC §2): forward, and dq / dk-dv backward, under a custom VJP.

Tiled like flash attention, with none of softmax's bookkeeping: no running max, no log-sum-exp, no
delta pre-pass. A query block accumulates Σ_blocks ReLU(q kᵀ/√d)·m @ v in fp32; the row factor
1/(γ_h r(n_i)) depends only on the row and the mask, so it is computed outside (O(B·H·T)) and applied
once at the end. Causal grids skip key blocks that lie wholly above the diagonal (and the dk/dv kernel
skips query blocks wholly below it). Backward recomputes scores per tile:

    dP = dO Vᵀ,  dS = dP ⊙ 1[s>0] ⊙ m ⊙ factor / √d,  dQ = dS K,  dK = dSᵀ Q,  dV = (P ⊙ factor)ᵀ dO

and dγ = −Σ_i factor_i Σ_j p_ij dP_ij / γ from a per-row sum the dq kernel also emits.

Inputs of any length and head dim are padded inside (keys masked, head dim to a power of two). These
are the GPU kernels (Triton through `pl.pallas_call`; `interpret=True` on CPU for tests); TPU has its own
Mosaic kernels in `relu_attention_tpu`, laid out for its (8, 128) tiles.
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
class PallasBlockSizes:
    block_q: int = 64
    block_k: int = 64
    block_q_bwd: int = 64
    block_k_bwd: int = 64
    num_warps: int | None = None  # GPU (Triton): None = 4 for head_dim ≤ 64, else 8
    num_stages: int = 2

    @classmethod
    def for_backend(cls, backend: str, head_dim: int) -> PallasBlockSizes:
        if backend == "gpu":
            if head_dim <= 64:  # not yet measured on a GPU
                return cls(block_q=128, block_k=64, block_q_bwd=64, block_k_bwd=64)
            # H100, bf16, D 128, T 4096 causal (benchmarks/kernels-gpu-nvidia_h100_80gb_hbm3.json, "blocks"): 4 warps
            # and 3 stages took forward 5.63 → 3.50 ms and forward+backward 21.9 → 12.5 ms against 8 warps, 2 stages.
            return cls(block_q=64, block_k=64, block_q_bwd=64, block_k_bwd=64, num_warps=4, num_stages=3)
        return cls(block_q=32, block_k=32, block_q_bwd=32, block_k_bwd=32)  # interpret mode: small is fast


def _compiler_params(backend: str, sizes: PallasBlockSizes, head_dim: int):
    if backend == "gpu":
        from jax.experimental.pallas import triton as plgpu

        warps = sizes.num_warps or (4 if head_dim <= 64 else 8)
        return plgpu.CompilerParams(num_warps=warps, num_stages=sizes.num_stages)
    if backend == "tpu":
        raise ValueError(
            "these are the GPU (Triton) kernels; TPU has its own in relu_attention_tpu / linear_attention_tpu"
        )
    return None


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def padded_lengths(tq: int, tk: int, causal: bool, q_blocks: tuple[int, ...], k_blocks: tuple[int, ...]):
    """(query, key) lengths padded to whole blocks of every kernel; causal pads both to one length so that
    query and key positions stay aligned."""
    if causal:
        unit = math.lcm(*q_blocks, *k_blocks)
        return _round_up(tq, unit), _round_up(tq, unit)
    return _round_up(tq, math.lcm(*q_blocks)), _round_up(tk, math.lcm(*k_blocks))


def _scores(q, k, key_valid, q_start, k_start, block_q, block_k, scale, causal):
    """s `[block_q, block_k]` float32 and the visibility mask of one tile."""
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
    vis = key_valid[None, :] > 0
    if causal:
        q_pos = q_start + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
        k_pos = k_start + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)
        vis = vis & (q_pos >= k_pos)
    return s, vis


def _num_k_blocks(i, block_q, block_k, num_k, causal):
    if not causal:
        return num_k
    return jnp.minimum(lax.div(block_q * (i + 1) + block_k - 1, block_k), num_k)


# ----------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------


def _fwd_kernel(q_ref, k_ref, v_ref, valid_ref, factor_ref, o_ref, *, block_q, block_k, scale, causal):
    i = pl.program_id(0)
    q = q_ref[...]
    num_k = k_ref.shape[0] // block_k

    def body(j, acc):
        start = j * block_k
        k = k_ref[pl.ds(start, block_k), :]
        v = v_ref[pl.ds(start, block_k), :]
        s, vis = _scores(q, k, valid_ref[pl.ds(start, block_k)], i * block_q, start, block_q, block_k, scale, causal)
        p = jnp.where(vis, jnp.maximum(s, 0.0), 0.0)
        return acc + lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)

    acc = jnp.zeros((block_q, v_ref.shape[-1]), jnp.float32)
    acc = lax.fori_loop(0, _num_k_blocks(i, block_q, block_k, num_k, causal), body, acc)
    o_ref[...] = (acc * factor_ref[...][:, None]).astype(o_ref.dtype)


def _specs_q(block, d):
    return pl.BlockSpec((None, None, block, d), lambda i, b, h: (b, h, i, 0))


def _specs_full(t, d):
    return pl.BlockSpec((None, None, t, d), lambda i, b, h: (b, h, 0, 0))


def _forward(q, k, v, valid, factor, causal, scale, sizes, backend, interpret):
    b, h, tq, d = q.shape
    tk = k.shape[2]
    bq, bk = sizes.block_q, sizes.block_k
    kernel = functools.partial(_fwd_kernel, block_q=bq, block_k=bk, scale=scale, causal=causal)
    return pl.pallas_call(
        kernel,
        grid=(tq // bq, b, h),
        in_specs=[
            _specs_q(bq, d),
            _specs_full(tk, d),
            _specs_full(tk, v.shape[-1]),
            pl.BlockSpec((None, tk), lambda i, b_, h_: (b_, 0)),
            pl.BlockSpec((None, None, bq), lambda i, b_, h_: (b_, h_, i)),
        ],
        out_specs=_specs_q(bq, v.shape[-1]),
        out_shape=jax.ShapeDtypeStruct((*q.shape[:3], v.shape[-1]), v.dtype),
        compiler_params=_compiler_params(backend, sizes, d),
        interpret=interpret,
        name="relu_attention_fwd",
    )(q, k, v, valid, factor)


# ----------------------------------------------------------------------------------------------
# Backward: dq (+ per-row Σ p·dP for dγ), then dk and dv
# ----------------------------------------------------------------------------------------------


def _dq_kernel(q_ref, k_ref, v_ref, valid_ref, factor_ref, do_ref, dq_ref, pdp_ref, *, block_q, block_k, scale, causal):
    i = pl.program_id(0)
    q, do, factor = q_ref[...], do_ref[...], factor_ref[...]
    num_k = k_ref.shape[0] // block_k

    def body(j, carry):
        dq, pdp = carry
        start = j * block_k
        k = k_ref[pl.ds(start, block_k), :]
        v = v_ref[pl.ds(start, block_k), :]
        s, vis = _scores(q, k, valid_ref[pl.ds(start, block_k)], i * block_q, start, block_q, block_k, scale, causal)
        p = jnp.where(vis, jnp.maximum(s, 0.0), 0.0)
        dp = lax.dot_general(do, v, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        pdp = pdp + jnp.sum(p * dp, axis=1)
        ds = jnp.where(vis & (s > 0), dp * factor[:, None], 0.0) * scale
        dq = dq + lax.dot_general(ds.astype(k.dtype), k, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        return dq, pdp

    init = (jnp.zeros(q.shape, jnp.float32), jnp.zeros((block_q,), jnp.float32))
    dq, pdp = lax.fori_loop(0, _num_k_blocks(i, block_q, block_k, num_k, causal), body, init)
    dq_ref[...] = dq.astype(dq_ref.dtype)
    pdp_ref[...] = pdp


def _dkdv_kernel(
    q_ref, k_ref, v_ref, valid_ref, factor_ref, do_ref, dk_ref, dv_ref, *, block_q, block_k, scale, causal
):
    j = pl.program_id(0)
    k, v = k_ref[...], v_ref[...]
    valid = valid_ref[...]
    num_q = q_ref.shape[0] // block_q
    # Causal: query blocks that end before this key block starts see none of it.
    first = lax.div(j * block_k, block_q) if causal else 0

    def body(i, carry):
        dk, dv = carry
        start = i * block_q
        q = q_ref[pl.ds(start, block_q), :]
        do = do_ref[pl.ds(start, block_q), :]
        factor = factor_ref[pl.ds(start, block_q)]
        s, vis = _scores(q, k, valid, start, j * block_k, block_q, block_k, scale, causal)
        a = jnp.where(vis, jnp.maximum(s, 0.0), 0.0) * factor[:, None]
        dv = dv + lax.dot_general(a.astype(do.dtype), do, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        dp = lax.dot_general(do, v, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        ds = jnp.where(vis & (s > 0), dp * factor[:, None], 0.0) * scale
        dk = dk + lax.dot_general(ds.astype(q.dtype), q, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        return dk, dv

    init = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
    dk, dv = lax.fori_loop(first, num_q, body, init)
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _backward(q, k, v, valid, factor, do, causal, scale, sizes, backend, interpret):
    b, h, tq, d = q.shape
    tk, dv_dim = k.shape[2], v.shape[-1]
    bq, bk = sizes.block_q_bwd, sizes.block_k_bwd
    params = _compiler_params(backend, sizes, d)
    dq, pdp = pl.pallas_call(
        functools.partial(_dq_kernel, block_q=bq, block_k=bk, scale=scale, causal=causal),
        grid=(tq // bq, b, h),
        in_specs=[
            _specs_q(bq, d),
            _specs_full(tk, d),
            _specs_full(tk, dv_dim),
            pl.BlockSpec((None, tk), lambda i, b_, h_: (b_, 0)),
            pl.BlockSpec((None, None, bq), lambda i, b_, h_: (b_, h_, i)),
            _specs_q(bq, dv_dim),
        ],
        out_specs=[_specs_q(bq, d), pl.BlockSpec((None, None, bq), lambda i, b_, h_: (b_, h_, i))],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, tq), jnp.float32)],
        compiler_params=params,
        interpret=interpret,
        name="relu_attention_bwd_dq",
    )(q, k, v, valid, factor, do)
    dk, dv = pl.pallas_call(
        functools.partial(_dkdv_kernel, block_q=bq, block_k=bk, scale=scale, causal=causal),
        grid=(tk // bk, b, h),
        in_specs=[
            _specs_full(tq, d),
            _specs_q(bk, d),
            _specs_q(bk, dv_dim),
            pl.BlockSpec((None, bk), lambda j, b_, h_: (b_, j)),
            pl.BlockSpec((None, None, tq), lambda j, b_, h_: (b_, h_, 0)),
            _specs_full(tq, dv_dim),
        ],
        out_specs=[_specs_q(bk, d), _specs_q(bk, dv_dim)],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        compiler_params=params,
        interpret=interpret,
        name="relu_attention_bwd_dkdv",
    )(q, k, v, valid, factor, do)
    return dq, dk, dv, pdp


# ----------------------------------------------------------------------------------------------
# custom VJP over padded, head-major inputs
# ----------------------------------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9))
def _attend(q, k, v, valid, factor, causal, scale, sizes, backend, interpret):
    return _forward(q, k, v, valid, factor, causal, scale, sizes, backend, interpret)


def _attend_fwd(q, k, v, valid, factor, causal, scale, sizes, backend, interpret):
    out = _forward(q, k, v, valid, factor, causal, scale, sizes, backend, interpret)
    return out, (q, k, v, valid, factor)


def _attend_bwd(causal, scale, sizes, backend, interpret, residuals, do):
    q, k, v, valid, factor = residuals
    dq, dk, dv, pdp = _backward(q, k, v, valid, factor, do, causal, scale, sizes, backend, interpret)
    # out = factor · acc, so d(factor) = acc · dO = Σ_j p_ij dP_ij (the kernel's per-row sum).
    return dq, dk, dv, None, pdp


_attend.defvjp(_attend_fwd, _attend_bwd)


def relu_attention_pallas(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array,
    factor: jax.Array,
    *,
    causal: bool,
    block_sizes: PallasBlockSizes | None = None,
    backend: str | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """Σ_j factor_i · ReLU(q_i·k_j/√d) · m_ij · v_j via the Pallas kernels.

    q, k, v: `[batch, length, heads, dim]`; key_mask `[batch, key_length]` bool; factor
    `[batch, heads, q_length]` float32 (the row scale, differentiable: dγ flows through it).
    """
    backend = backend or jax.default_backend()  # the platform to build for (lowering for another is allowed)
    interpret = jax.default_backend() == "cpu" if interpret is None else interpret
    _, tq, _, d = q.shape
    tk, dv_dim = k.shape[1], v.shape[-1]
    sizes = block_sizes or PallasBlockSizes.for_backend(backend, d)
    d_pad, dv_pad = pl.next_power_of_2(d), pl.next_power_of_2(dv_dim)
    # Whole blocks for every kernel (GPU tiles must be powers of two).
    tq_pad, tk_pad = padded_lengths(
        tq, tk, causal, (sizes.block_q, sizes.block_q_bwd), (sizes.block_k, sizes.block_k_bwd)
    )

    def head_major(x, t_pad, dim_pad):
        x = jnp.pad(x, ((0, 0), (0, t_pad - x.shape[1]), (0, 0), (0, dim_pad - x.shape[-1])))
        return x.transpose(0, 2, 1, 3)

    # Zero-padding the head dim changes no score; padded keys are invisible; padded rows are dropped.
    qh, kh, vh = head_major(q, tq_pad, d_pad), head_major(k, tk_pad, d_pad), head_major(v, tk_pad, dv_pad)
    valid = jnp.pad(key_mask.astype(jnp.float32), ((0, 0), (0, tk_pad - tk)))
    factor = jnp.pad(factor.astype(jnp.float32), ((0, 0), (0, 0), (0, tq_pad - tq)))
    # The original head dim sets the score scale, not the padded one.
    out = _attend(qh, kh, vh, valid, factor, causal, 1.0 / math.sqrt(d), sizes, backend, interpret)
    return out.transpose(0, 2, 1, 3)[:, :tq, :, :dv_dim]
