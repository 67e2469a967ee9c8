"""Pallas TPU (Mosaic) kernels for linear attention: a chunked forward scan, a forward scan for dφ(q) and a
reverse-order scan for dφ(k), dv, under a custom VJP. The mathematics is `linear_attention_triton`'s:

    causal chunk c:  acc = φq_c S + tril(φq_c φk_cᵀ) v_c,   den = φq_c·z + rowsum(tril(φq_c φk_cᵀ)),
                     then S += φk_cᵀ v_c, z += Σ φk_c;      out = acc / stab(den)
    backward (g = dO/stab(den), h = −(dO·out)/stab(den), per row, computed outside in O(T)):
      dφq_i = S_i g_i + z_i h_i                  (forward scan, S_i, z_i inclusive of i)
      dφk_j = R_j v_j + r_j,  dv_j = R_jᵀ φk_j   (reverse scan, R_j = Σ_{i≥j} φq_i g_iᵀ, r_j = Σ_{i≥j} h_i φq_i)

Mosaic layout: head-major `[B, H, T, ·]` blocks of one chunk (a multiple of 128 rows) by the whole feature or
value width (never padded); grid (batch, head, chunk) with the chunk axis innermost and "arbitrary" so the
fp32 state (S, z) — or (R, r) — stays in VMEM scratch; the backward's reverse order comes from its index map
(chunk n−1−c at step c). Non-causal attention runs the same kernels with the state fixed at the totals over
all keys (computed by XLA, O(T·m·d_v)) and no intra-chunk term. Per-row quantities (the denominator out, h in)
are lane-dense `[chunk, 128]` tiles.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.numerics import LANES, TRANS_B, lower_triangle, round_up, stabilise_denominator, tpu_interpret

# `jax.experimental.pallas.tpu` is imported by the functions that build the kernels, not here: with the Triton and
# splash imports (kernels/triton_tiles.py, softmax_attention/mosaic_tpu.py) it took 0.17 s of the start-up of
# every process that imports `kernels` (0.90 → 0.73 s on a 2-core CPU), and CPU and GPU runs never use it.


@dataclasses.dataclass(frozen=True)
class TpuChunkSizes:
    chunk: int = 256  # rows per grid step (a multiple of 128): the intra-chunk product is chunk × chunk

    def __post_init__(self):
        if self.chunk <= 0 or self.chunk % LANES:
            raise ValueError(f"TpuChunkSizes.chunk={self.chunk} must be a positive multiple of {LANES}")


def _params():
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"))


def _t(x, dtype):
    """xᵀ, transposed in fp32 (as JAX's TPU flash attention does) and cast to the matmul dtype."""
    return x.astype(jnp.float32).T.astype(dtype)


# Forward


def _fwd_kernel(q_ref, k_ref, v_ref, s0_ref, z0_ref, o_ref, den_ref, s_acc, z_acc, *, eps, eps_mode, causal):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        s_acc[...] = s0_ref[...]
        z_acc[...] = z0_ref[...]

    q = q_ref[...]
    qf = q.astype(jnp.float32)
    num = lax.dot(qf, s_acc[...], preferred_element_type=jnp.float32)
    den = jnp.sum(qf * z_acc[...], axis=1, keepdims=True)
    if causal:
        k, v = k_ref[...], v_ref[...]
        a = lax.dot_general(q, k, TRANS_B, preferred_element_type=jnp.float32)
        a = jnp.where(lower_triangle(a.shape[0]), a, 0.0)
        num += lax.dot(a.astype(v.dtype), v, preferred_element_type=jnp.float32)
        den += jnp.sum(a, axis=1, keepdims=True)
        s_acc[...] += lax.dot(_t(k, v.dtype), v, preferred_element_type=jnp.float32)
        z_acc[...] += jnp.sum(k.astype(jnp.float32), axis=0, keepdims=True)
    o_ref[...] = (num / stabilise_denominator(den, eps, eps_mode)).astype(o_ref.dtype)
    den_ref[...] = jnp.broadcast_to(den, den_ref.shape)


def _state_specs(m, dv):
    return [
        pl.BlockSpec((None, None, m, dv), lambda b, h, c: (b, h, 0, 0)),
        pl.BlockSpec((None, None, 1, m), lambda b, h, c: (b, h, 0, 0)),
    ]


def _forward(q, k, v, s0, z0, causal, eps, eps_mode, sizes, interpret):
    from jax.experimental.pallas import tpu as pltpu

    b, h, t, m = q.shape
    dv, c = v.shape[-1], sizes.chunk

    def rows(width):
        return pl.BlockSpec((None, None, c, width), lambda b_, h_, i: (b_, h_, i, 0))

    return pl.pallas_call(
        functools.partial(_fwd_kernel, eps=eps, eps_mode=eps_mode, causal=causal),
        grid=(b, h, t // c),
        in_specs=[rows(m), rows(m), rows(dv), *_state_specs(m, dv)],
        out_specs=[rows(dv), rows(LANES)],
        out_shape=[jax.ShapeDtypeStruct(v.shape, v.dtype), jax.ShapeDtypeStruct((b, h, t, LANES), jnp.float32)],
        scratch_shapes=[pltpu.VMEM((m, dv), jnp.float32), pltpu.VMEM((1, m), jnp.float32)],
        compiler_params=_params(),
        interpret=interpret,
        name="linear_attention_fwd_tpu",
    )(q, k, v, s0, z0)


# Backward


def _dq_kernel(k_ref, v_ref, q_ref, g_ref, h_ref, s0_ref, z0_ref, dq_ref, s_acc, z_acc, *, causal):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        s_acc[...] = s0_ref[...]
        z_acc[...] = z0_ref[...]

    g, hcol = g_ref[...], h_ref[...][:, :1]
    dq = lax.dot_general(g, s_acc[...], TRANS_B, preferred_element_type=jnp.float32) + hcol * z_acc[...]
    if causal:  # the chunk's own keys j ≤ i: (tril(g vᵀ + h)) k
        k, v = k_ref[...], v_ref[...]
        mix = lax.dot_general(g, v.astype(jnp.float32), TRANS_B, preferred_element_type=jnp.float32) + hcol
        mix = jnp.where(lower_triangle(mix.shape[0]), mix, 0.0)
        dq += lax.dot(mix.astype(k.dtype), k, preferred_element_type=jnp.float32)
        s_acc[...] += lax.dot(_t(k, v.dtype), v, preferred_element_type=jnp.float32)
        z_acc[...] += jnp.sum(k.astype(jnp.float32), axis=0, keepdims=True)
    dq_ref[...] = dq.astype(dq_ref.dtype)


def _dkdv_kernel(q_ref, g_ref, h_ref, k_ref, v_ref, r0_ref, rz0_ref, dk_ref, dv_ref, r_acc, rz_acc, *, causal):
    @pl.when(pl.program_id(2) == 0)  # the last chunk: the scan runs backwards
    def _init():
        r_acc[...] = r0_ref[...]
        rz_acc[...] = rz0_ref[...]

    k, v = k_ref[...], v_ref[...]
    dk = lax.dot_general(v.astype(jnp.float32), r_acc[...], TRANS_B, preferred_element_type=jnp.float32)
    dk += rz_acc[...]
    dv = lax.dot(k.astype(jnp.float32), r_acc[...], preferred_element_type=jnp.float32)
    if causal:  # the chunk's own queries i ≥ j
        q, g, hcol = q_ref[...], g_ref[...], h_ref[...][:, :1]
        lower = lower_triangle(q.shape[0])
        mix = lax.dot_general(g, v.astype(jnp.float32), TRANS_B, preferred_element_type=jnp.float32) + hcol
        mix = jnp.where(lower, mix, 0.0)  # [i, j] = g_i·v_j + h_i for i ≥ j
        dk += lax.dot(mix.T.astype(q.dtype), q, preferred_element_type=jnp.float32)
        p = jnp.where(lower, lax.dot_general(q, k, TRANS_B, preferred_element_type=jnp.float32), 0.0)
        dv += lax.dot(p.T, g, preferred_element_type=jnp.float32)
        r_acc[...] += lax.dot(q.astype(jnp.float32).T, g, preferred_element_type=jnp.float32)
        rz_acc[...] += jnp.sum(q.astype(jnp.float32) * hcol, axis=0, keepdims=True)
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _backward(q, k, v, g, h_lanes, totals, causal, sizes, interpret):
    from jax.experimental.pallas import tpu as pltpu

    b, hh, t, m = q.shape
    dv_dim, c = v.shape[-1], sizes.chunk
    n = t // c
    s0, z0, r0, rz0 = totals

    def rows(width, reverse=False):
        index = (lambda b_, h_, i: (b_, h_, n - 1 - i, 0)) if reverse else (lambda b_, h_, i: (b_, h_, i, 0))
        return pl.BlockSpec((None, None, c, width), index)

    dq = pl.pallas_call(
        functools.partial(_dq_kernel, causal=causal),
        grid=(b, hh, n),
        in_specs=[rows(m), rows(dv_dim), rows(m), rows(dv_dim), rows(LANES), *_state_specs(m, dv_dim)],
        out_specs=rows(m),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[pltpu.VMEM((m, dv_dim), jnp.float32), pltpu.VMEM((1, m), jnp.float32)],
        compiler_params=_params(),
        interpret=interpret,
        name="linear_attention_bwd_dq_tpu",
    )(k, v, q, g, h_lanes, s0, z0)
    dk, dv = pl.pallas_call(
        functools.partial(_dkdv_kernel, causal=causal),
        grid=(b, hh, n),
        in_specs=[
            rows(m, True),
            rows(dv_dim, True),
            rows(LANES, True),
            rows(m, True),
            rows(dv_dim, True),
            *_state_specs(m, dv_dim),
        ],
        out_specs=[rows(m, True), rows(dv_dim, True)],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        scratch_shapes=[pltpu.VMEM((m, dv_dim), jnp.float32), pltpu.VMEM((1, m), jnp.float32)],
        compiler_params=_params(),
        interpret=interpret,
        name="linear_attention_bwd_dkdv_tpu",
    )(q, g, h_lanes, k, v, r0, rz0)
    return dq, dk, dv


# custom VJP over padded, head-major inputs


def _key_totals(k, v, causal):
    """The scan's starting state: zeros when causal, Σ_j φk_j v_jᵀ and Σ_j φk_j otherwise."""
    b, h, _, m = k.shape
    if causal:
        return jnp.zeros((b, h, m, v.shape[-1]), jnp.float32), jnp.zeros((b, h, 1, m), jnp.float32)
    kf = k.astype(jnp.float32)
    return jnp.einsum("bhtm,bhtd->bhmd", kf, v.astype(jnp.float32)), jnp.sum(kf, axis=2)[:, :, None, :]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _attend(q, k, v, causal, eps, eps_mode, sizes, interpret):
    s0, z0 = _key_totals(k, v, causal)
    return _forward(q, k, v, s0, z0, causal, eps, eps_mode, sizes, interpret)[0]


def _attend_fwd(q, k, v, causal, eps, eps_mode, sizes, interpret):
    s0, z0 = _key_totals(k, v, causal)
    out, den = _forward(q, k, v, s0, z0, causal, eps, eps_mode, sizes, interpret)
    return out, (q, k, v, out, den[..., 0])


def _attend_bwd(causal, eps, eps_mode, sizes, interpret, residuals, d_out):
    q, k, v, out, den = residuals
    inv = 1.0 / stabilise_denominator(den, eps, eps_mode)
    g = d_out.astype(jnp.float32) * inv[..., None]
    h = -jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1) * inv
    s0, z0 = _key_totals(k, v, causal)
    if causal:
        r0, rz0 = jnp.zeros_like(s0), jnp.zeros_like(z0)
    else:  # the query-side totals: R = Σ_i φq_i g_iᵀ, r = Σ_i h_i φq_i
        qf = q.astype(jnp.float32)
        r0, rz0 = jnp.einsum("bhtm,bhtd->bhmd", qf, g), jnp.einsum("bhtm,bht->bhm", qf, h)[:, :, None, :]
    h_lanes = jnp.broadcast_to(h[..., None], (*h.shape, LANES))
    return _backward(q, k, v, g, h_lanes, (s0, z0, r0, rz0), causal, sizes, interpret)


_attend.defvjp(_attend_fwd, _attend_bwd)


def linear_attention_mosaic_tpu(
    phi_q: jax.Array,
    phi_k: jax.Array,
    v: jax.Array,
    *,
    causal: bool,
    eps: float,
    eps_mode: str = "add",
    block_sizes: TpuChunkSizes | None = None,
    interpret: bool | str = False,
) -> jax.Array:
    """The Mosaic TPU kernels, from what every linear backend takes (kernels/README.md); `interpret` runs them
    on any platform ("tpu": in TPU interpret mode, `kernels.numerics.tpu_interpret`)."""
    sizes = block_sizes or TpuChunkSizes()
    t = phi_q.shape[1]
    t_pad = round_up(t, sizes.chunk)

    def head_major(x):  # zero rows add nothing to the state and their outputs are dropped
        return jnp.pad(x, ((0, 0), (0, t_pad - t), (0, 0), (0, 0))).transpose(0, 2, 1, 3)

    interpret = tpu_interpret(interpret)
    out = _attend(head_major(phi_q), head_major(phi_k), head_major(v), causal, eps, eps_mode, sizes, interpret)
    return out.transpose(0, 2, 1, 3)[:, :t]
