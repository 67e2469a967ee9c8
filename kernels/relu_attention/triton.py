"""Pallas kernels for ReLU attention (docs/kernels.md): forward, and dq / dk-dv backward, under a custom VJP.

Tiled like flash attention, with none of softmax's bookkeeping: no running max, no log-sum-exp, no
delta pre-pass. A query block accumulates Σ_blocks ReLU(q kᵀ/√d)·m @ v in fp32; the row factor
1/(γ_h r(n_i)) depends only on the row and the mask, so it is computed outside (O(B·H·T)) and applied
once at the end. Causal grids skip key blocks that lie wholly above the diagonal (and the dk/dv kernel
skips query blocks wholly below it), and only the tiles that cross the diagonal are masked: each loop runs in
two parts, the tiles every query of the block sees whole, then the diagonal ones. Padded keys need no mask at
all: their rows of k are zero (what every ReLU build takes), so their scores are 0 and ReLU(0) = 0, and their
score gradient is cut by 1[s > 0]. Backward recomputes scores per tile:

    dP = dO Vᵀ,  dS = dP ⊙ 1[s>0] ⊙ m ⊙ factor / √d,  dQ = dS K,  dK = dSᵀ Q,  dV = (P ⊙ factor)ᵀ dO

and dγ = −Σ_i factor_i Σ_j p_ij dP_ij / γ from a per-row sum the dq kernel also emits.

The kernels read q, k, v and write their outputs in the caller's `[B, T, H, D]` layout (no transposed or
padded copies): lengths that are not whole tiles and head dims that are not powers of two are masked inside
(`kernels.triton_tiles`); only the O(B·H·T) key mask and row factor are padded. These
are the GPU kernels (Triton through `pl.pallas_call`; `interpret=True` on CPU for tests); TPU has its own
Mosaic kernels in `relu_attention_mosaic_tpu`, laid out for its (8, 128) tiles.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.numerics import padded_lengths, triton_compiler_params, xlogx
from kernels.triton_tiles import Extent, load_tile, store_tile


@dataclasses.dataclass(frozen=True)
class PallasBlockSizes:
    """The Triton kernels' tiles and launch settings, each kernel its own (the dq kernel walks keys for a query
    tile, the dk/dv kernel queries for a key tile: they are tuned apart, as FlashAttention-2's Triton kernels
    are). block_q, block_k, num_warps, num_stages: the forward's. block_q_bwd, block_k_bwd: both backward
    kernels', unless block_{q,k}_dq or block_{q,k}_dkv name their own. num_warps_bwd, num_stages_bwd: the backward
    kernels' (None: the forward's). num_warps None: 4 for head dims ≤ 64, else 8."""

    block_q: int = 64
    block_k: int = 64
    block_q_bwd: int = 64
    block_k_bwd: int = 64
    num_warps: int | None = None
    num_stages: int = 2
    block_q_dq: int | None = None
    block_k_dq: int | None = None
    block_q_dkv: int | None = None
    block_k_dkv: int | None = None
    num_warps_bwd: int | None = None
    num_stages_bwd: int | None = None

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"PallasBlockSizes.{field.name}={value!r} must be a positive whole number")

    @property
    def dq(self) -> tuple[int, int]:
        return self.block_q_dq or self.block_q_bwd, self.block_k_dq or self.block_k_bwd

    @property
    def dkv(self) -> tuple[int, int]:
        return self.block_q_dkv or self.block_q_bwd, self.block_k_dkv or self.block_k_bwd

    @classmethod
    def for_backend(cls, backend: str, head_dim: int) -> PallasBlockSizes:
        if backend == "gpu":
            if head_dim <= 64:  # not yet measured on a GPU
                return cls(block_q=128, block_k=64, block_q_bwd=64, block_k_bwd=64)
            # H100, bf16, D 128, T 4096 causal (benchmarks/kernels-gpu-nvidia_h100_80gb_hbm3.json, "blocks"): 4 warps
            # and 3 stages took forward 5.63 → 3.50 ms and forward+backward 21.9 → 12.5 ms against 8 warps, 2 stages.
            return cls(block_q=64, block_k=64, block_q_bwd=64, block_k_bwd=64, num_warps=4, num_stages=3)
        return cls(block_q=32, block_k=32, block_q_bwd=32, block_k_bwd=32)  # interpret mode: small is fast


def _scores(q, k, q_start, k_start, block_q, block_k, scale, masked):
    """s `[block_q, block_k]` float32 of one tile, and where it `masked` (a tile on the causal diagonal) whether
    key j is at or before query i (None for a tile every query sees whole)."""
    s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
    if not masked:
        return s, None
    q_pos = q_start + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
    k_pos = k_start + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)
    return s, q_pos >= k_pos


def _relu(s, vis):
    return jnp.maximum(s, 0.0) if vis is None else jnp.where(vis, jnp.maximum(s, 0.0), 0.0)


def causal_key_blocks(i, block_q: int, block_k: int, num_k):
    """(whole, end): causal query block i sees key blocks [0, whole) entirely (their last key is at or before its
    first query: (j + 1)·bk ≤ i·bq + 1) and [whole, end) in part; none from `end` on."""
    end = jnp.minimum(lax.div(block_q * (i + 1) + block_k - 1, block_k), num_k)
    return jnp.minimum(lax.div(block_q * i + 1, block_k), end), end


def causal_query_blocks(j, block_q: int, block_k: int, num_q):
    """(first, whole): causal key block j is seen in part by query blocks [first, whole) (those crossing the
    diagonal) and entirely by [whole, num_q) (their first query is at or after its last key); not before."""
    first = lax.div(j * block_k, block_q)
    return first, jnp.maximum(jnp.minimum(lax.div((j + 1) * block_k + block_q - 2, block_q), num_q), first)


def _key_loop(body, carry, i, block_q, block_k, num_k, causal):
    """`body(j, carry, masked)` over the key blocks query block i sees: all of them, unmasked, when not causal;
    when causal the whole ones unmasked, then the diagonal ones masked."""
    if not causal:
        return lax.fori_loop(0, num_k, functools.partial(body, masked=False), carry)
    whole, end = causal_key_blocks(i, block_q, block_k, num_k)
    carry = lax.fori_loop(0, whole, functools.partial(body, masked=False), carry)
    return lax.fori_loop(whole, end, functools.partial(body, masked=True), carry)


# Forward


@dataclasses.dataclass(frozen=True)
class _Dims:
    """The axes the tiles cover (for the masks of `kernels.triton_tiles`) and the score scale 1/√d."""

    q_rows: Extent
    k_rows: Extent
    head: Extent
    value: Extent
    scale: float
    causal: bool


def _fwd_kernel(q_ref, k_ref, v_ref, factor_ref, o_ref, *stats_refs, block_q, block_k, dims):
    """Output tile; with `stats_refs` (Σ_j p_ij, Σ_j p_ij log p_ij) of its rows too, p = ReLU(s)·m unscaled."""
    i = pl.program_id(0)
    q = load_tile(q_ref, rows=dims.q_rows, row0=i * block_q, cols=dims.head)
    num_k = k_ref.shape[0] // block_k
    row_stats = bool(stats_refs)

    def body(j, carry, masked):
        acc, stats = carry
        start = j * block_k
        k = load_tile(k_ref.at[pl.ds(start, block_k), :], rows=dims.k_rows, row0=start, cols=dims.head)
        v = load_tile(v_ref.at[pl.ds(start, block_k), :], rows=dims.k_rows, row0=start, cols=dims.value)
        p = _relu(*_scores(q, k, i * block_q, start, block_q, block_k, dims.scale, masked))
        acc = acc + lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        if row_stats:
            stats = (stats[0] + jnp.sum(p, axis=1), stats[1] + jnp.sum(xlogx(p), axis=1))
        return acc, stats

    acc = jnp.zeros((block_q, v_ref.shape[-1]), jnp.float32)
    stats = (jnp.zeros((block_q,), jnp.float32),) * 2 if row_stats else ()
    acc, stats = _key_loop(body, (acc, stats), i, block_q, block_k, num_k, dims.causal)
    out = acc * factor_ref[...][:, None]
    store_tile(o_ref, out, rows=dims.q_rows, row0=i * block_q, cols=dims.value)
    for ref, value in zip(stats_refs, stats, strict=True):
        ref[...] = value


# BlockSpecs over the `[B, T, H, D]` arrays themselves (grid: row block, batch, head), padded to whole tiles
# only in the block shape: `kernels.triton_tiles` masks what lies past the end.
def _rows_of(block, d):
    return pl.BlockSpec((None, block, None, d), lambda i, b, h: (b, i, h, 0))


def _all_rows(t, d):
    return pl.BlockSpec((None, t, None, d), lambda i, b, h: (b, 0, h, 0))


def _row_vector(block):
    return pl.BlockSpec((None, None, block), lambda i, b, h: (b, h, i))


def _forward(q, k, v, factor, dims, sizes, backend, interpret, row_stats=False):
    """The output, and with `row_stats` the rows' (Σ p, Σ p log p) `[B, H, T_q padded]` from the same pass."""
    b, _, h, _ = q.shape
    tq_pad, tk_pad = dims.q_rows.padded, dims.k_rows.padded
    d_pad, dv_pad = dims.head.padded, dims.value.padded
    bq, bk = sizes.block_q, sizes.block_k
    out_shape = [jax.ShapeDtypeStruct((*q.shape[:3], dims.value.size), v.dtype)]
    out_specs = [_rows_of(bq, dv_pad)]
    if row_stats:
        out_shape += [jax.ShapeDtypeStruct(factor.shape, jnp.float32)] * 2
        out_specs += [_row_vector(bq)] * 2
    outs = pl.pallas_call(
        functools.partial(_fwd_kernel, block_q=bq, block_k=bk, dims=dims),
        grid=(tq_pad // bq, b, h),
        in_specs=[
            _rows_of(bq, d_pad),
            _all_rows(tk_pad, d_pad),
            _all_rows(tk_pad, dv_pad),
            _row_vector(bq),
        ],
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=triton_compiler_params(backend, sizes.num_warps, sizes.num_stages, d_pad),
        interpret=interpret,
        name="relu_attention_fwd_row_stats" if row_stats else "relu_attention_fwd",
    )(q, k, v, factor)
    return tuple(outs) if row_stats else outs[0]


# Backward: dq (+ per-row Σ p·dP for dγ), then dk and dv


def _score_grad(s, vis, dp, factor, stats_grad):
    """dL/ds_ij / scale of one tile: through the output (dP_ij · factor_i) and, when the row statistics are
    outputs too, through Σ_j p_ij (cotangent g1_i) and Σ_j p_ij log p_ij (g2_i: d(p log p)/dp = log p + 1)."""
    da = dp * factor[:, None]
    if stats_grad is not None:
        g1, g2 = stats_grad
        da = da + g1[:, None] + g2[:, None] * (jnp.log(jnp.where(s > 0, s, 1.0)) + 1.0)
    return jnp.where((s > 0) if vis is None else vis & (s > 0), da, 0.0)


def _dq_kernel(q_ref, k_ref, v_ref, factor_ref, do_ref, *refs, block_q, block_k, dims):
    """dq of a query tile and its rows' Σ_j p_ij dP_ij; `refs`: [g1, g2 (row-statistics cotangents)], dq, pdp."""
    *stats_grad_refs, dq_ref, pdp_ref = refs
    i = pl.program_id(0)
    q = load_tile(q_ref, rows=dims.q_rows, row0=i * block_q, cols=dims.head)
    do = load_tile(do_ref, rows=dims.q_rows, row0=i * block_q, cols=dims.value)
    factor = factor_ref[...]
    stats_grad = tuple(ref[...] for ref in stats_grad_refs) or None
    num_k = k_ref.shape[0] // block_k
    scale = dims.scale

    def body(j, carry, masked):
        dq, pdp = carry
        start = j * block_k
        k = load_tile(k_ref.at[pl.ds(start, block_k), :], rows=dims.k_rows, row0=start, cols=dims.head)
        v = load_tile(v_ref.at[pl.ds(start, block_k), :], rows=dims.k_rows, row0=start, cols=dims.value)
        s, vis = _scores(q, k, i * block_q, start, block_q, block_k, scale, masked)
        p = _relu(s, vis)
        dp = lax.dot_general(do, v, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        pdp = pdp + jnp.sum(p * dp, axis=1)
        ds = _score_grad(s, vis, dp, factor, stats_grad) * scale
        dq = dq + lax.dot_general(ds.astype(k.dtype), k, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        return dq, pdp

    init = (jnp.zeros(q.shape, jnp.float32), jnp.zeros((block_q,), jnp.float32))
    dq, pdp = _key_loop(body, init, i, block_q, block_k, num_k, dims.causal)
    store_tile(dq_ref, dq, rows=dims.q_rows, row0=i * block_q, cols=dims.head)
    pdp_ref[...] = pdp


def _dkdv_kernel(q_ref, k_ref, v_ref, factor_ref, do_ref, *refs, block_q, block_k, dims):
    """dk, dv of a key tile; `refs`: [g1, g2 (row-statistics cotangents)], dk, dv."""
    *stats_grad_refs, dk_ref, dv_ref = refs
    j = pl.program_id(0)
    k = load_tile(k_ref, rows=dims.k_rows, row0=j * block_k, cols=dims.head)
    v = load_tile(v_ref, rows=dims.k_rows, row0=j * block_k, cols=dims.value)
    num_q = q_ref.shape[0] // block_q
    scale = dims.scale

    def body(i, carry, masked):
        dk, dv = carry
        start = i * block_q
        q = load_tile(q_ref.at[pl.ds(start, block_q), :], rows=dims.q_rows, row0=start, cols=dims.head)
        do = load_tile(do_ref.at[pl.ds(start, block_q), :], rows=dims.q_rows, row0=start, cols=dims.value)
        factor = factor_ref[pl.ds(start, block_q)]
        stats_grad = tuple(ref[pl.ds(start, block_q)] for ref in stats_grad_refs) or None
        s, vis = _scores(q, k, start, j * block_k, block_q, block_k, scale, masked)
        a = _relu(s, vis) * factor[:, None]
        dv = dv + lax.dot_general(a.astype(do.dtype), do, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        dp = lax.dot_general(do, v, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        ds = _score_grad(s, vis, dp, factor, stats_grad) * scale
        dk = dk + lax.dot_general(ds.astype(q.dtype), q, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        return dk, dv

    init = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
    if not dims.causal:
        dk, dv = lax.fori_loop(0, num_q, functools.partial(body, masked=False), init)
    else:
        first, whole = causal_query_blocks(j, block_q, block_k, num_q)
        dk, dv = lax.fori_loop(first, whole, functools.partial(body, masked=True), init)
        dk, dv = lax.fori_loop(whole, num_q, functools.partial(body, masked=False), (dk, dv))
    store_tile(dk_ref, dk, rows=dims.k_rows, row0=j * block_k, cols=dims.head)
    store_tile(dv_ref, dv, rows=dims.k_rows, row0=j * block_k, cols=dims.value)


def _backward(q, k, v, factor, do, dims, sizes, backend, interpret, stats_grad=()):
    """dq, dk, dv and Σ_j p_ij dP_ij per row; `stats_grad`: the row statistics' cotangents (g1, g2), if any."""
    b, _, h, _ = q.shape
    tq_pad, tk_pad = dims.q_rows.padded, dims.k_rows.padded
    d_pad, dv_pad = dims.head.padded, dims.value.padded
    params = triton_compiler_params(
        backend, sizes.num_warps_bwd or sizes.num_warps, sizes.num_stages_bwd or sizes.num_stages, d_pad
    )
    bq, bk = sizes.dq
    dq, pdp = pl.pallas_call(
        functools.partial(_dq_kernel, block_q=bq, block_k=bk, dims=dims),
        grid=(tq_pad // bq, b, h),
        in_specs=[
            _rows_of(bq, d_pad),
            _all_rows(tk_pad, d_pad),
            _all_rows(tk_pad, dv_pad),
            _row_vector(bq),
            _rows_of(bq, dv_pad),
            *[_row_vector(bq)] * len(stats_grad),
        ],
        out_specs=[_rows_of(bq, d_pad), _row_vector(bq)],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(factor.shape, jnp.float32)],
        compiler_params=params,
        interpret=interpret,
        name="relu_attention_bwd_dq",
    )(q, k, v, factor, do, *stats_grad)
    bq, bk = sizes.dkv
    dk, dv = pl.pallas_call(
        functools.partial(_dkdv_kernel, block_q=bq, block_k=bk, dims=dims),
        grid=(tk_pad // bk, b, h),
        in_specs=[
            _all_rows(tq_pad, d_pad),
            _rows_of(bk, d_pad),
            _rows_of(bk, dv_pad),
            pl.BlockSpec((None, None, tq_pad), lambda j, b_, h_: (b_, h_, 0)),
            _all_rows(tq_pad, dv_pad),
            *[pl.BlockSpec((None, None, tq_pad), lambda j, b_, h_: (b_, h_, 0))] * len(stats_grad),
        ],
        out_specs=[_rows_of(bk, d_pad), _rows_of(bk, dv_pad)],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        compiler_params=params,
        interpret=interpret,
        name="relu_attention_bwd_dkdv",
    )(q, k, v, factor, do, *stats_grad)
    return dq, dk, dv, pdp


# custom VJP over the caller's [B, T, H, D] arrays (only the O(B·H·T) row factor is padded)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8))
def _attend(q, k, v, factor, dims, sizes, backend, interpret, row_stats):
    return _forward(q, k, v, factor, dims, sizes, backend, interpret, row_stats)


def _attend_fwd(q, k, v, factor, dims, sizes, backend, interpret, row_stats):
    return _forward(q, k, v, factor, dims, sizes, backend, interpret, row_stats), (q, k, v, factor)


def _attend_bwd(dims, sizes, backend, interpret, row_stats, residuals, cotangents):
    # out = factor · acc, so d(factor) = acc · dO = Σ_j p_ij dP_ij (the kernel's per-row sum); the row statistics
    # (of unscaled p) do not depend on the factor.
    do, *stats_grad = cotangents if row_stats else (cotangents,)
    return _backward(*residuals, do, dims, sizes, backend, interpret, tuple(stats_grad))


_attend.defvjp(_attend_fwd, _attend_bwd)


def relu_attention_triton(
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
    row_stats: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array, jax.Array]:
    """Σ_j factor_i · ReLU(q_i·k_j/√d) · m_ij · v_j by the Triton kernels, from the arrays every ReLU backend
    takes (kernels/README.md). `key_mask` is not read: padded keys' rows of k and v are zero, which is all these
    kernels need (module docstring). `backend`: the platform to build for (default: the running one);
    `interpret`: Pallas interpret mode (default: on a CPU).
    row_stats: also return Σ_j p_ij and Σ_j p_ij log p_ij, p = ReLU(s)·m before the factor, `[batch, heads,
    q_length]` float32, accumulated by the forward kernel in the same pass (and differentiable).
    """
    backend = backend or jax.default_backend()  # the platform to build for (lowering for another is allowed)
    interpret = jax.default_backend() == "cpu" if interpret is None else interpret
    _, tq, _, d = q.shape
    tk, dv_dim = k.shape[1], v.shape[-1]
    sizes = block_sizes or PallasBlockSizes.for_backend(backend, d)
    # Whole tiles for every kernel's grid; the arrays themselves stay as they are (kernels.triton_tiles).
    tq_pad, tk_pad = padded_lengths(
        tq, tk, causal, (sizes.block_q, sizes.dq[0], sizes.dkv[0]), (sizes.block_k, sizes.dq[1], sizes.dkv[1])
    )
    del key_mask  # padded keys' rows are zero, and tiles past the end load zeros; rows past the end are never stored
    factor = jnp.pad(factor.astype(jnp.float32), ((0, 0), (0, 0), (0, tq_pad - tq)))
    # The true head dim sets the score scale; the tiles' zero columns change no score.
    head, value = Extent.power_of_two(d), Extent.power_of_two(dv_dim)
    dims = _Dims(Extent(tq, tq_pad), Extent(tk, tk_pad), head, value, 1 / math.sqrt(d), causal)
    if not row_stats:
        return _attend(q, k, v, factor, dims, sizes, backend, interpret, False)
    out, p_sum, p_xlogx = _attend(q, k, v, factor, dims, sizes, backend, interpret, True)
    return out, p_sum[..., :tq], p_xlogx[..., :tq]
