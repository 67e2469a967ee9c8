"""Pallas TPU (Mosaic) kernels for ReLU attention: forward, dq (+ per-row Σ p·dP) and dk/dv, custom VJP.

The same mathematics as `relu_attention_triton` (see its docstring), laid out the way JAX's TPU flash
attention is, because Mosaic's rules differ from Triton's:

- head-major `[B, H, T, D]` inputs; every block's last two dims are (multiple of 8, multiple of 128) or the
  whole dim, so D = 64, 128, 256 (or any D) is one full-width block, never padded to a power of two;
- a 4-D grid (batch, head, this block, the blocks it sums over) with the summed axis innermost and
  "arbitrary"; fp32 accumulators live in VMEM scratch, zeroed under `pl.when(first)` and written out under
  `pl.when(last)`; no block spans the whole sequence, so VMEM does not limit the length;
- causal grids skip tiles wholly above the diagonal with `pl.when`, and their index maps clamp to the last
  (first) needed block, so a skipped step re-uses the block already in VMEM instead of copying a new one;
- per-row quantities (the row factor in, Σ p·dP out) are lane-dense `[block_q, 128]` tiles (the row's value
  in every lane), the key mask a `[1, block_k]` row.

The row factor 1/(γ_h r(n_i)) comes from outside as `[B, H, T]` and is broadcast to lanes here; its gradient
is the dq kernel's Σ_j p_ij dP_ij, so dγ flows as in the other impls.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.numerics import LANES, TRANS_B, padded_lengths, tpu_interpret

# `jax.experimental.pallas.tpu` is imported where the kernels are built, not here (linear_attention/mosaic_tpu.py).


@dataclasses.dataclass(frozen=True)
class TpuBlockSizes:
    """Tile lengths (multiples of 128): forward and dq use (block_q, block_k); dk/dv (block_q_dkv, block_k_dkv)."""

    block_q: int = 128
    block_k: int = 128
    block_q_dkv: int = 128
    block_k_dkv: int = 128

    def __post_init__(self):
        for name, value in dataclasses.asdict(self).items():
            if value <= 0 or value % LANES:
                raise ValueError(f"TpuBlockSizes.{name}={value} must be a positive multiple of {LANES}")


def _params():
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"))


def _column(lanes: jax.Array, width: int) -> jax.Array:
    """A lane-replicated `[rows, 128]` tile as `[rows, width]` (the row's value in every column)."""
    if width <= LANES:
        return lanes[:, :width]
    wide = jnp.tile(lanes, (1, -(-width // LANES)))  # whole lane tiles, as JAX's TPU flash attention
    return wide if wide.shape[1] == width else wide[:, :width]


def _scores(q, k, valid, q_start, k_start, scale, causal):
    """s `[bq, bk]` float32 and the visibility of each (query, key) pair of the tile."""
    s = lax.dot_general(q, k, TRANS_B, preferred_element_type=jnp.float32) * scale
    vis = jnp.broadcast_to(valid, s.shape) > 0  # compare after the broadcast: Mosaic broadcasts numbers, not masks
    if causal:
        rows = q_start + lax.broadcasted_iota(jnp.int32, s.shape, 0)
        cols = k_start + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        vis = vis & (rows >= cols)
    return s, vis


def _last_key_block(i, bq, bk):
    """The last key block that query block i sees when causal."""
    return lax.div(i * bq + bq - 1, bk)


def _first_query_block(j, bq, bk):
    """The first query block that sees key block j when causal."""
    return lax.div(j * bk, bq)


def _accumulate_over_last_axis(accumulators, accumulate, needed, finish) -> None:
    """The shape of every kernel here: fp32 VMEM accumulators zeroed at the first step of the innermost
    ("arbitrary") grid axis, `accumulate()` on the steps where `needed` (None: all; causal tiles past the
    diagonal are skipped), and `finish()` writing the outputs at its last step."""
    step = pl.program_id(3)

    @pl.when(step == 0)
    def _init():
        for acc in accumulators:
            acc[...] = jnp.zeros_like(acc)

    if needed is None:
        accumulate()
    else:
        pl.when(needed)(accumulate)
    pl.when(step == pl.num_programs(3) - 1)(finish)


# Forward


def _fwd_kernel(q_ref, k_ref, v_ref, valid_ref, factor_ref, o_ref, acc_ref, *, scale, causal, bq, bk):
    i, j = pl.program_id(2), pl.program_id(3)

    def accumulate():
        s, vis = _scores(q_ref[...], k_ref[...], valid_ref[...], i * bq, j * bk, scale, causal)
        p = jnp.where(vis, jnp.maximum(s, 0.0), 0.0)
        acc_ref[...] += lax.dot(p.astype(v_ref.dtype), v_ref[...], preferred_element_type=jnp.float32)

    def finish():
        o_ref[...] = (acc_ref[...] * _column(factor_ref[...], acc_ref.shape[-1])).astype(o_ref.dtype)

    _accumulate_over_last_axis([acc_ref], accumulate, j <= _last_key_block(i, bq, bk) if causal else None, finish)


def _forward(q, k, v, valid, factor_lanes, causal, scale, sizes, interpret):
    from jax.experimental.pallas import tpu as pltpu

    b, h, tq, d = q.shape
    tk, dv = k.shape[2], v.shape[-1]
    bq, bk = sizes.block_q, sizes.block_k

    def kv_block(i, j):  # causal: steps past the diagonal keep the last needed block (no copy)
        return jnp.minimum(j, _last_key_block(i, bq, bk)) if causal else j

    return pl.pallas_call(
        functools.partial(_fwd_kernel, scale=scale, causal=causal, bq=bq, bk=bk),
        grid=(b, h, tq // bq, tk // bk),
        in_specs=[
            pl.BlockSpec((None, None, bq, d), lambda b_, h_, i, j: (b_, h_, i, 0)),
            pl.BlockSpec((None, None, bk, d), lambda b_, h_, i, j: (b_, h_, kv_block(i, j), 0)),
            pl.BlockSpec((None, None, bk, dv), lambda b_, h_, i, j: (b_, h_, kv_block(i, j), 0)),
            pl.BlockSpec((None, 1, bk), lambda b_, h_, i, j: (b_, 0, kv_block(i, j))),
            pl.BlockSpec((None, None, bq, LANES), lambda b_, h_, i, j: (b_, h_, i, 0)),
        ],
        out_specs=pl.BlockSpec((None, None, bq, dv), lambda b_, h_, i, j: (b_, h_, i, 0)),
        out_shape=jax.ShapeDtypeStruct((b, h, tq, dv), v.dtype),
        scratch_shapes=[pltpu.VMEM((bq, dv), jnp.float32)],
        compiler_params=_params(),
        interpret=interpret,
        name="relu_attention_fwd_tpu",
    )(q, k, v, valid, factor_lanes)


# Backward: dq and the per-row Σ p·dP (for dγ), then dk and dv


def _dq_kernel(
    q_ref, k_ref, v_ref, valid_ref, factor_ref, do_ref, dq_ref, pdp_ref, dq_acc, pdp_acc, *, scale, causal, bq, bk
):
    i, j = pl.program_id(2), pl.program_id(3)

    def accumulate():
        k = k_ref[...]
        s, vis = _scores(q_ref[...], k, valid_ref[...], i * bq, j * bk, scale, causal)
        p = jnp.where(vis, jnp.maximum(s, 0.0), 0.0)
        dp = lax.dot_general(do_ref[...], v_ref[...], TRANS_B, preferred_element_type=jnp.float32)
        pdp_acc[...] += jnp.sum(p * dp, axis=1, keepdims=True)
        ds = jnp.where(vis & (s > 0), dp * _column(factor_ref[...], s.shape[1]), 0.0) * scale
        dq_acc[...] += lax.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)

    def finish():
        dq_ref[...] = dq_acc[...].astype(dq_ref.dtype)
        pdp_ref[...] = pdp_acc[...]

    needed = j <= _last_key_block(i, bq, bk) if causal else None
    _accumulate_over_last_axis([dq_acc, pdp_acc], accumulate, needed, finish)


def _dkdv_kernel(
    q_ref, k_ref, v_ref, valid_ref, factor_ref, do_ref, dk_ref, dv_ref, dk_acc, dv_acc, *, scale, causal, bq, bk
):
    j, i = pl.program_id(2), pl.program_id(3)

    def accumulate():
        q, do = q_ref[...], do_ref[...]
        s, vis = _scores(q, k_ref[...], valid_ref[...], i * bq, j * bk, scale, causal)
        factor = _column(factor_ref[...], s.shape[1])
        a = jnp.where(vis, jnp.maximum(s, 0.0), 0.0) * factor
        dv_acc[...] += lax.dot(a.T.astype(do.dtype), do, preferred_element_type=jnp.float32)
        dp = lax.dot_general(do, v_ref[...], TRANS_B, preferred_element_type=jnp.float32)
        ds = jnp.where(vis & (s > 0), dp * factor, 0.0) * scale
        dk_acc[...] += lax.dot(ds.T.astype(q.dtype), q, preferred_element_type=jnp.float32)

    def finish():
        dk_ref[...] = dk_acc[...].astype(dk_ref.dtype)
        dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)

    # Causal: query blocks that end before this key block starts see none of it.
    needed = i >= _first_query_block(j, bq, bk) if causal else None
    _accumulate_over_last_axis([dk_acc, dv_acc], accumulate, needed, finish)


def _backward(q, k, v, valid, factor_lanes, do, causal, scale, sizes, interpret):
    from jax.experimental.pallas import tpu as pltpu

    b, h, tq, d = q.shape
    tk, dv = k.shape[2], v.shape[-1]
    bq, bk = sizes.block_q, sizes.block_k

    def kv_block(i, j):
        return jnp.minimum(j, _last_key_block(i, bq, bk)) if causal else j

    def q_rows(width):
        return pl.BlockSpec((None, None, bq, width), lambda b_, h_, i, j: (b_, h_, i, 0))

    def kv_rows(width):
        return pl.BlockSpec((None, None, bk, width), lambda b_, h_, i, j: (b_, h_, kv_block(i, j), 0))

    dq, pdp = pl.pallas_call(
        functools.partial(_dq_kernel, scale=scale, causal=causal, bq=bq, bk=bk),
        grid=(b, h, tq // bq, tk // bk),
        in_specs=[
            q_rows(d),
            kv_rows(d),
            kv_rows(dv),
            pl.BlockSpec((None, 1, bk), lambda b_, h_, i, j: (b_, 0, kv_block(i, j))),
            q_rows(LANES),
            q_rows(dv),
        ],
        out_specs=[q_rows(d), q_rows(LANES)],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, tq, LANES), jnp.float32)],
        scratch_shapes=[pltpu.VMEM((bq, d), jnp.float32), pltpu.VMEM((bq, LANES), jnp.float32)],
        compiler_params=_params(),
        interpret=interpret,
        name="relu_attention_bwd_dq_tpu",
    )(q, k, v, valid, factor_lanes, do)

    bq, bk = sizes.block_q_dkv, sizes.block_k_dkv

    def q_block(j, i):  # causal: steps before the diagonal keep the first needed block (no copy)
        return jnp.maximum(i, _first_query_block(j, bq, bk)) if causal else i

    def q_side(width):
        return pl.BlockSpec((None, None, bq, width), lambda b_, h_, j, i: (b_, h_, q_block(j, i), 0))

    def k_side(width):
        return pl.BlockSpec((None, None, bk, width), lambda b_, h_, j, i: (b_, h_, j, 0))

    dk, dv_out = pl.pallas_call(
        functools.partial(_dkdv_kernel, scale=scale, causal=causal, bq=bq, bk=bk),
        grid=(b, h, tk // bk, tq // bq),
        in_specs=[
            q_side(d),
            k_side(d),
            k_side(dv),
            pl.BlockSpec((None, 1, bk), lambda b_, h_, j, i: (b_, 0, j)),
            q_side(LANES),
            q_side(dv),
        ],
        out_specs=[k_side(d), k_side(dv)],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        scratch_shapes=[pltpu.VMEM((bk, d), jnp.float32), pltpu.VMEM((bk, dv), jnp.float32)],
        compiler_params=_params(),
        interpret=interpret,
        name="relu_attention_bwd_dkdv_tpu",
    )(q, k, v, valid, factor_lanes, do)
    return dq, dk, dv_out, pdp[..., 0]


# custom VJP over padded, head-major inputs


def _lanes(factor):
    return jnp.broadcast_to(factor[..., None], (*factor.shape, LANES))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _attend(q, k, v, valid, factor, causal, scale, sizes, interpret):
    return _forward(q, k, v, valid, _lanes(factor), causal, scale, sizes, interpret)


def _attend_fwd(q, k, v, valid, factor, causal, scale, sizes, interpret):
    return _attend(q, k, v, valid, factor, causal, scale, sizes, interpret), (q, k, v, valid, factor)


def _attend_bwd(causal, scale, sizes, interpret, residuals, do):
    q, k, v, valid, factor = residuals
    dq, dk, dv, pdp = _backward(q, k, v, valid, _lanes(factor), do, causal, scale, sizes, interpret)
    return dq, dk, dv, None, pdp  # out = factor · acc, so d(factor) = Σ_j p_ij dP_ij


_attend.defvjp(_attend_fwd, _attend_bwd)


def relu_attention_mosaic_tpu(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array,
    factor: jax.Array,
    *,
    causal: bool,
    block_sizes: TpuBlockSizes | None = None,
    interpret: bool | str = False,
) -> jax.Array:
    """The Mosaic TPU kernels, from the arrays every ReLU backend takes (kernels/README.md); `interpret` runs
    them on any platform ("tpu": in TPU interpret mode, `kernels.numerics.tpu_interpret`)."""
    sizes = block_sizes or TpuBlockSizes()
    tq, d = q.shape[1], q.shape[-1]
    tk = k.shape[1]
    tq_pad, tk_pad = padded_lengths(
        tq, tk, causal, (sizes.block_q, sizes.block_q_dkv), (sizes.block_k, sizes.block_k_dkv)
    )

    def head_major(x, t_pad):
        return jnp.pad(x, ((0, 0), (0, t_pad - x.shape[1]), (0, 0), (0, 0))).transpose(0, 2, 1, 3)

    valid = jnp.pad(key_mask.astype(jnp.float32), ((0, 0), (0, tk_pad - tk)))[:, None, :]  # padded keys: invisible
    factor = jnp.pad(factor.astype(jnp.float32), ((0, 0), (0, 0), (0, tq_pad - tq)))
    out = _attend(
        head_major(q, tq_pad), head_major(k, tk_pad), head_major(v, tk_pad), valid, factor, causal,
        1.0 / math.sqrt(d), sizes, tpu_interpret(interpret),
    )  # fmt: skip
    return out.transpose(0, 2, 1, 3)[:, :tq]
