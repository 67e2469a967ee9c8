"""ReLU attention with ReLUFormer's variance-reduction factor (docs/mixers.md).

    s_ij = q_i·k_j / √d
    m_ij = 1 if key j is visible to query i (key mask, and j ≤ i when causal)
    n_i  = max(1, Σ_j m_ij)
    a_ij = m_ij · ReLU(s_ij) / (γ_h · √(n_i / 2))
    h_i  = Σ_j a_ij v_j

`row_scale` swaps √(n_i/2) for n_i (ReLU/L, Wortsman et al. 2023) or 1 (ReLA; the ablation).

Implementations (`ReluAttentionOptions.impl`, kernels/options.py):
  "reference"  dense fp32 definition (materialises the T×T matrix; for tests).
  "xla"        blocked over keys; the T×T matrix is never built, forward or backward (custom VJP that
               recomputes scores per key block, five matmuls a block). Causal self-attention is blocked over
               queries too (`kernels.blocking`; long sequences get longer blocks, at most MAX_CAUSAL_BLOCKS of
               them): key block j meets only the query rows from its own start, so the work is the lower
               triangle plus the diagonal blocks.
  "pallas"     tiled kernels: `relu_attention_tpu` (Mosaic) for TPU, `relu_attention_pallas` (Triton) for
               GPU, `relu_attention_mgpu` (Mosaic GPU) for Hopper; interpret mode on CPU.
  "auto"       "pallas" where `kernels/kernel_passes.json` records that these kernels passed their tests on
               this device class (and jax minor) and beat "xla" from this length on; "xla" everywhere else
               (`kernels.platforms`). A kernel that only lowered, or ran in interpret mode, is never chosen.

Unlike softmax there is no running max or log-sum-exp: the per-row factor depends only on i and
the mask, so it is applied once after the sum over key blocks.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from kernels.blocking import (
    block_causal,
    block_scores,
    causal_block_k,
    key_blocks,
    lower_triangle_gradients,
    pad_rows,
    unblock,
    visible,
)
from kernels.checks import check_attention_inputs, check_options, check_positive
from kernels.masking import zero_masked_rows
from kernels.numerics import xlogx
from kernels.options import ReluAttentionOptions
from kernels.platforms import largest_head_dim
from kernels.relu_attention_mgpu import MgpuBlockSizes, relu_attention_mgpu, supported
from kernels.relu_attention_pallas import relu_attention_pallas
from kernels.relu_attention_tpu import relu_attention_tpu


def visible_key_counts(key_mask: jax.Array, *, causal: bool, q_length: int | None = None) -> jax.Array:
    """n_i = max(1, number of keys visible to query i), as float32 `[batch, q_length]`.

    Causal rows count only real keys at positions ≤ i, never the padded length, so training and
    incremental decoding see the same n_i.
    """
    key_mask = key_mask.astype(jnp.int32)
    q_length = key_mask.shape[1] if q_length is None else q_length
    if causal:
        counts = jnp.cumsum(key_mask, axis=1)[:, :q_length]
    else:
        counts = jnp.broadcast_to(key_mask.sum(axis=1, keepdims=True), (key_mask.shape[0], q_length))
    return jnp.maximum(counts, 1).astype(jnp.float32)


ROW_SCALES = ("sqrt_half", "count", "none")


def _row_factor(counts: jax.Array, gamma_h: jax.Array, row_scale: str) -> jax.Array:
    """1 / (γ_h · r(n_i)) as `[batch, heads, q_length]` float32, r = √(n/2), n or 1 by `row_scale`."""
    inv_gamma = 1.0 / gamma_h.astype(jnp.float32)[None, :, None]
    if row_scale == "sqrt_half":
        return inv_gamma * lax.rsqrt(counts[:, None, :] / 2.0)
    if row_scale == "count":
        return inv_gamma / counts[:, None, :]
    return jnp.broadcast_to(inv_gamma, (counts.shape[0], gamma_h.shape[0], counts.shape[1]))


def _mask_factor(key_mask: jax.Array, gamma_h: jax.Array, causal: bool, row_scale: str, q_length: int) -> jax.Array:
    """The row factor `[batch, heads, q_length]` for a key mask: `_row_factor` of the visible-key counts."""
    return _row_factor(visible_key_counts(key_mask, causal=causal, q_length=q_length), gamma_h, row_scale)


def _check_inputs(q, k, v, key_mask, gamma, causal, row_scale="sqrt_half"):
    check_attention_inputs(q, k, v, key_mask, causal)
    if row_scale not in ROW_SCALES:
        raise ValueError(f"unknown row_scale {row_scale!r}; valid: {', '.join(ROW_SCALES)}")
    h = q.shape[2]
    gshape = jnp.shape(gamma)
    if gshape not in ((), (1,), (h,)):
        raise ValueError(f"gamma must be a scalar or have shape [heads]=({h},), got {gshape}")
    check_positive("gamma", gamma)


def _prepare(q, k, key_mask, gamma):
    if key_mask is None:
        key_mask = jnp.ones(k.shape[:2], dtype=bool)
    gamma_h = jnp.broadcast_to(jnp.asarray(gamma, jnp.float32).reshape(-1), (q.shape[2],))
    return key_mask.astype(bool), gamma_h


# ----------------------------------------------------------------------------------------------
# Reference
# ----------------------------------------------------------------------------------------------


def _reference_weights(q, k, key_mask, gamma_h, causal, row_scale):
    """Dense a_ij `[batch, heads, q_length, k_length]` in float32."""
    qf, kf = q.astype(jnp.float32), k.astype(jnp.float32)
    s = jnp.einsum("bqhd,bkhd->bhqk", qf, kf, precision=lax.Precision.HIGHEST) / math.sqrt(q.shape[-1])
    vis = visible(key_mask, jnp.arange(q.shape[1]), jnp.arange(k.shape[1]), causal)
    factor = _mask_factor(key_mask, gamma_h, causal, row_scale, q.shape[1])
    return jnp.where(vis, jax.nn.relu(s), 0.0) * factor[..., None]


def _reference(q, k, v, key_mask, gamma_h, causal, row_scale):
    a = _reference_weights(q, k, key_mask, gamma_h, causal, row_scale)
    out = jnp.einsum("bhqk,bkhd->bqhd", a, v.astype(jnp.float32), precision=lax.Precision.HIGHEST)
    return out.astype(v.dtype)


# ----------------------------------------------------------------------------------------------
# Blocked XLA implementation with a custom VJP
# ----------------------------------------------------------------------------------------------


def _tile_weights(s, vis, causal: bool):
    """ReLU(s) of one tile of scores. Padded keys need no mask here: the public functions zero their rows of k
    (zero_masked_rows) and key_blocks pads with zero rows, so their scores are 0 and ReLU(0) = 0 exactly. Only a
    tile that crosses the causal diagonal selects (the select cost 0-6% of the op's time at T 2,001)."""
    return jnp.where(vis, jax.nn.relu(s), 0.0) if causal else jax.nn.relu(s)


def _causal_forward(qh, kb, vb, mb, bk, nb, factor, out_dtype):
    """Query block i against key blocks j ≤ i, tile by tile: `[B, H, nb·bk, d_v]` float32, factor applied."""
    qp = pad_rows(qh, nb * bk)
    out_blocks = []
    for i in range(nb):
        rows = qp[:, :, i * bk : (i + 1) * bk]
        acc = None
        for j in range(i + 1):
            s, vis = block_scores(rows, kb[j], mb[j], j, bk, j == i, q_offset=i * bk)
            p = _tile_weights(s, vis, j == i)  # below the diagonal: all causal-visible
            pv = jnp.einsum("bhqk,bhkd->bhqd", p.astype(out_dtype), vb[j], preferred_element_type=jnp.float32)
            acc = pv if acc is None else acc + pv
        out_blocks.append(acc)
    return jnp.concatenate(out_blocks, axis=2) * pad_rows(factor, nb * bk)[..., None]


def _xla_forward(q, k, v, key_mask, gamma_h, causal, row_scale, block_k):
    """The output `[B, T, H, d_v]` in float32 (cast by the caller)."""
    b, tq, h, _ = q.shape
    factor = _mask_factor(key_mask, gamma_h, causal, row_scale, tq)
    kb, vb, mb, bk, nb = key_blocks(k, v, key_mask, block_k)
    qh = q.transpose(0, 2, 1, 3)
    if block_causal(q, k, causal, block_k):
        acc = _causal_forward(qh, kb, vb, mb, bk, nb, factor, v.dtype)[:, :, :tq]
        return acc.transpose(0, 2, 1, 3)

    def body(acc, xs):
        kj, vj, mj, j = xs
        s, vis = block_scores(qh, kj, mj, j, bk, causal)
        p = _tile_weights(s, vis, causal)
        acc = acc + jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), vj, preferred_element_type=jnp.float32)
        return acc, None

    acc0 = jnp.zeros((b, h, tq, v.shape[-1]), jnp.float32)
    acc, _ = lax.scan(body, acc0, (kb, vb, mb, jnp.arange(nb)))
    return (acc * factor[..., None]).transpose(0, 2, 1, 3)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _xla(q, k, v, key_mask, gamma_h, causal, row_scale, block_k):
    return _xla_forward(q, k, v, key_mask, gamma_h, causal, row_scale, block_k).astype(v.dtype)


def _xla_fwd(q, k, v, key_mask, gamma_h, causal, row_scale, block_k):
    out = _xla_forward(q, k, v, key_mask, gamma_h, causal, row_scale, block_k)
    # out_i ∝ 1/γ_h, so dγ_h = −Σ_i do_i·out_i / γ_h: one sum over the saved output instead of a pass over every tile.
    return out.astype(v.dtype), (q, k, v, key_mask, gamma_h, out)


def _xla_bwd(causal, row_scale, block_k, residuals, d_out):
    """Recomputes scores per key block, five matmuls a block. The row factor f_i and 1/√d scale whole rows, so
    they are applied to dO (dO_i f_i) and to dQ, dK once instead of to every tile: with p = ReLU(s) ⊙ m,
    dV = Σ_i p_ijᵀ (f_i dO_i), and dS' = 1[s>0] ⊙ m ⊙ ((f_i dO_i) · v_j) gives dQ = dS' K / √d, dK = dS'ᵀ Q / √d."""
    q, k, v, key_mask, gamma_h, out = residuals
    b, tq, h, d = q.shape
    tk = k.shape[1]
    factor = _mask_factor(key_mask, gamma_h, causal, row_scale, tq)
    kb, vb, mb, bk, nb = key_blocks(k, v, key_mask, block_k)
    qh = q.transpose(0, 2, 1, 3)
    do_f = (d_out.transpose(0, 2, 1, 3) * factor[..., None]).astype(d_out.dtype)
    # q and f·dO once more with the query axis last: dK and dV contract the query axis, and as [d, q] @ [q, k]
    # XLA:CPU hands those products to its matmul library instead of Eigen (op fwd+bwd at B4 T2001 H8: 5-7% faster).
    q_t, do_f_t = q.transpose(0, 2, 3, 1), do_f.transpose(0, 1, 3, 2)

    def block(qr, qr_t, dor, dor_t, kj, vj, mj, j, q_offset, causal=causal):
        """One key block against query rows `qr` (from position `q_offset`; `qr_t`, `dor_t`: q and f·dO with the
        query axis last): the block's five matmuls. dQ, dK unscaled by 1/√d; dK and dV transposed, `[B, H, d, bk]`."""
        s, vis = block_scores(qr, kj, mj, j, bk, causal, q_offset=q_offset)
        p = _tile_weights(s, vis, causal)
        dv_t = jnp.einsum("bhdq,bhqk->bhdk", dor_t, p.astype(dor.dtype), preferred_element_type=jnp.float32)
        dp = jnp.einsum("bhqd,bhkd->bhqk", dor, vj, preferred_element_type=jnp.float32)
        ds = jnp.where((vis & (s > 0)) if causal else s > 0, dp, 0.0).astype(q.dtype)
        dq_rows = jnp.einsum("bhqk,bhkd->bhqd", ds, kj, preferred_element_type=jnp.float32)
        dk_t = jnp.einsum("bhdq,bhqk->bhdk", qr_t, ds, preferred_element_type=jnp.float32)
        return dq_rows, dk_t, dv_t

    if block_causal(q, k, causal, block_k):  # tiles (i, j) with query block i ≥ key block j only
        rows = nb * bk
        qp, dop = pad_rows(qh, rows), pad_rows(do_f, rows)
        qp_t, dop_t = pad_rows(q_t, rows, axis=3), pad_rows(do_f_t, rows, axis=3)

        def tile(i, j):
            r = slice(i * bk, (i + 1) * bk)
            rows_i = (qp[:, :, r], qp_t[..., r], dop[:, :, r], dop_t[..., r])
            return block(*rows_i, kb[j], vb[j], mb[j], j, i * bk, causal=j == i)  # only diagonal tiles mask

        dq, dk_b, dv_b = lower_triangle_gradients(nb, tq, tile)
    else:

        def body(dq, xs):
            kj, vj, mj, j = xs
            dq_rows, dk_j, dv_j = block(qh, q_t, do_f, do_f_t, kj, vj, mj, j, 0)
            return dq + dq_rows, (dk_j, dv_j)

        dq, (dk_b, dv_b) = lax.scan(body, jnp.zeros((b, h, tq, d), jnp.float32), (kb, vb, mb, jnp.arange(nb)))

    scale = 1.0 / math.sqrt(d)
    d_gamma = -jnp.einsum("bthd,bthd->h", d_out.astype(jnp.float32), out) / gamma_h
    return (
        (dq.transpose(0, 2, 1, 3) * scale).astype(q.dtype),
        (unblock(jnp.swapaxes(dk_b, -1, -2), tk) * scale).astype(k.dtype),
        unblock(jnp.swapaxes(dv_b, -1, -2), tk).astype(v.dtype),
        None,
        d_gamma.astype(gamma_h.dtype),
    )


_xla.defvjp(_xla_fwd, _xla_bwd)


# ----------------------------------------------------------------------------------------------
# Which implementation runs, and the kernels
# ----------------------------------------------------------------------------------------------


def _mosaic_refusal(q, k, v, options: ReluAttentionOptions, causal: bool, fused_row_stats: bool = False):
    """Why the Mosaic GPU kernels cannot take these inputs (None: they can)."""

    def refusal():
        sizes = options.pallas_block_sizes
        if fused_row_stats:
            return "the row statistics come out of the Triton forward kernel only"
        if sizes is not None and not isinstance(sizes, MgpuBlockSizes):
            return f"block sizes {type(sizes).__name__} are for other kernels"
        return supported(q, k, v, sizes or MgpuBlockSizes(), causal)

    return refusal


def _kernels(backend: str, options: ReluAttentionOptions, q, k, v, key_mask, factor, causal: bool, row_stats=False):
    """Runs the kernels `backend` names (`ReluAttentionOptions.plan`). What every ReLU backend takes: q, k, v
    `[batch, length, heads, dim]` with padded keys' rows zeroed, key_mask `[batch, key_length]` bool, the row
    factor 1/(γ_h r(n_i)) `[batch, heads, q_length]` float32 (differentiable: dγ flows through it), `causal`, and
    its own block-size dataclass; it returns Σ_j factor_i · ReLU(q_i·k_j/√d) · m_ij · v_j in v's dtype. With
    `row_stats` (Triton only) also Σ_j p_ij and Σ_j p_ij log p_ij of the unscaled p, `[batch, heads, q_length]`."""
    sizes = options.block_sizes_for(backend)
    if backend == "mosaic_gpu":  # Hopper kernels (MgpuBlockSizes.backward picks the backward)
        return relu_attention_mgpu(q, k, v, key_mask, factor, causal=causal, block_sizes=sizes)
    interpret = options.interpret()
    if backend == "tpu":
        return relu_attention_tpu(q, k, v, key_mask, factor, causal=causal, block_sizes=sizes, interpret=interpret)
    return relu_attention_pallas(
        q, k, v, key_mask, factor, causal=causal, block_sizes=sizes, backend=backend, interpret=interpret,
        row_stats=row_stats,
    )  # fmt: skip


def _attend(q, k, v, key_mask, gamma_h, causal, row_scale, options: ReluAttentionOptions, impl, backend):
    """The output by `impl` (and `backend` for "pallas"), on prepared inputs (`_prepare`)."""
    if impl == "reference":
        return _reference(q, k, v, key_mask, gamma_h, causal, row_scale)
    if impl == "xla":
        block_k = causal_block_k(q, k, causal, options.block_k(causal=causal))
        return _xla(q, k, v, key_mask, gamma_h, causal, row_scale, block_k)
    factor = _mask_factor(key_mask, gamma_h, causal, row_scale, q.shape[1])  # differentiable: dγ flows through it
    return _kernels(backend, options, q, k, v, key_mask, factor, causal)


def _row_stats(q, k, key_mask, gamma_h, causal, row_scale, impl, block_k):
    """(S_i, E_i) `[batch, q_length, heads]` on prepared inputs: dense for "reference", else key-blocked XLA."""
    if impl == "reference":
        a = _reference_weights(q, k, key_mask, gamma_h, causal, row_scale)
        return a.sum(-1).transpose(0, 2, 1), xlogx(a).sum(-1).transpose(0, 2, 1)

    b, tq, h, _ = q.shape
    factor = _mask_factor(key_mask, gamma_h, causal, row_scale, tq)
    kb, _, mb, bk, nb = key_blocks(k, k, key_mask, block_k)
    qh = q.transpose(0, 2, 1, 3)

    @jax.checkpoint
    def body(carry, xs):
        row_sum, row_xlogx = carry
        kj, mj, j = xs
        s, vis = block_scores(qh, kj, mj, j, bk, causal)
        a = _tile_weights(s, vis, causal) * factor[..., None]
        return (row_sum + a.sum(-1), row_xlogx + xlogx(a).sum(-1)), None

    zeros = jnp.zeros((b, h, tq), jnp.float32)
    (row_sum, row_xlogx), _ = lax.scan(body, (zeros, zeros), (kb, mb, jnp.arange(nb)))
    return row_sum.transpose(0, 2, 1), row_xlogx.transpose(0, 2, 1)


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------


def relu_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    key_mask: jax.Array | None = None,
    gamma: jax.Array | float = 1.0,
    row_scale: str = "sqrt_half",
    options: ReluAttentionOptions | None = None,
) -> jax.Array:
    """ReLU attention (docs/mixers.md). q, k, v: `[batch, length, heads, head_dim]`; returns v's shape and dtype.

    Args:
      key_mask: `[batch, key_length]` bool, True = real token; None means every key is real.
      gamma: scalar or `[heads]`, the per-head temperature γ_h (positive).
      row_scale: "sqrt_half" divides row i by √(n_i/2) (ReLUFormer); "count" by n_i (ReLU/L);
        "none" by 1 (ReLA, and ReLUFormer's non-converging ablation).
      options: which implementation runs and how it is tiled (`kernels.options`); None: the defaults (impl "auto").
    """
    options = check_options(options, ReluAttentionOptions, "relu_attention")
    _check_inputs(q, k, v, key_mask, gamma, causal, row_scale)
    refusal = _mosaic_refusal(q, k, v, options, causal)
    impl, backend = options.plan(k.shape[1], refusal, causal=causal, dtype=v.dtype, head_dim=largest_head_dim(q, v))
    k, v = zero_masked_rows(k, key_mask), zero_masked_rows(v, key_mask)
    key_mask, gamma_h = _prepare(q, k, key_mask, gamma)
    return _attend(q, k, v, key_mask, gamma_h, causal, row_scale, options, impl, backend)


def relu_attention_row_stats(
    q: jax.Array,
    k: jax.Array,
    *,
    causal: bool = False,
    key_mask: jax.Array | None = None,
    gamma: jax.Array | float = 1.0,
    row_scale: str = "sqrt_half",
    options: ReluAttentionOptions | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Row sums S_i = Σ_j a_ij and E_i = Σ_j a_ij log a_ij, each `[batch, q_length, heads]` float32.

    These are what ReLUFormer's normalisation and entropy regularisers need (the entropy of
    p = a / (S + ε) is −E/(S+ε) + S/(S+ε)·log(S+ε)). Every impl but "reference" recomputes each key block of
    the XLA impl under `jax.checkpoint`, so neither forward nor backward holds the T×T matrix. Arguments as
    `relu_attention`.
    """
    options = check_options(options, ReluAttentionOptions, "relu_attention")
    _check_inputs(q, k, k, key_mask, gamma, causal, row_scale)
    k = zero_masked_rows(k, key_mask)
    key_mask, gamma_h = _prepare(q, k, key_mask, gamma)
    return _row_stats(q, k, key_mask, gamma_h, causal, row_scale, options.impl, options.block_k(causal=causal))


def relu_attention_and_row_stats(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    key_mask: jax.Array | None = None,
    gamma: jax.Array | float = 1.0,
    row_scale: str = "sqrt_half",
    options: ReluAttentionOptions | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`relu_attention`'s output and `relu_attention_row_stats`' (S_i, E_i), `[batch, q_length, heads]`.

    With impl="pallas" on a GPU (the Triton kernels, which pallas_backend "gpu" picks here on Hopper too;
    interpret mode on a CPU) the forward kernel accumulates
    Σ_j p_ij and Σ_j p_ij log p_ij of the unscaled p = ReLU(s)·m in the pass that computes the output, and
    the backward kernels take their cotangents: no second T² pass. With a row factor f_i > 0,
    S_i = f_i Σ p and E_i = Σ f p log(f p) = f_i (log f_i · Σ p + Σ p log p). Other impls (and the TPU and
    Mosaic GPU kernels) compute the two separately. Arguments as `relu_attention`.
    """
    options = check_options(options, ReluAttentionOptions, "relu_attention")
    _check_inputs(q, k, v, key_mask, gamma, causal, row_scale)
    refusal = _mosaic_refusal(q, k, v, options, causal, fused_row_stats=True)
    impl, backend = options.plan(k.shape[1], refusal, causal=causal, dtype=v.dtype, head_dim=largest_head_dim(q, v))
    k, v = zero_masked_rows(k, key_mask), zero_masked_rows(v, key_mask)
    key_mask, gamma_h = _prepare(q, k, key_mask, gamma)
    if impl != "pallas" or backend in ("tpu", "mosaic_gpu"):
        out = _attend(q, k, v, key_mask, gamma_h, causal, row_scale, options, impl, backend)
        return out, *_row_stats(q, k, key_mask, gamma_h, causal, row_scale, impl, options.block_k(causal=causal))
    factor = _mask_factor(key_mask, gamma_h, causal, row_scale, q.shape[1])
    out, p_sum, p_xlogx = _kernels(backend, options, q, k, v, key_mask, factor, causal, row_stats=True)
    row_sum = factor * p_sum
    row_xlogx = factor * (jnp.log(factor) * p_sum + p_xlogx)
    return out, row_sum.transpose(0, 2, 1), row_xlogx.transpose(0, 2, 1)
