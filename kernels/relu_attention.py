"""ReLU attention with ReLUFormer's variance-reduction factor (docs/mixers.md).

    s_ij = q_i·k_j / √d
    m_ij = 1 if key j is visible to query i (key mask, and j ≤ i when causal)
    n_i  = max(1, Σ_j m_ij)
    a_ij = m_ij · ReLU(s_ij) / (γ_h · √(n_i / 2))
    h_i  = Σ_j a_ij v_j

`row_scale` swaps √(n_i/2) for n_i (ReLU/L, Wortsman et al. 2023) or 1 (ReLA; the ablation).

Implementations:
  "reference"  dense fp32 definition (materialises the T×T matrix; for tests).
  "xla"        blocked over keys with a `lax.scan`; the T×T matrix is never built, forward or
               backward (custom VJP that recomputes scores per key block).
  "pallas"     tiled kernels: `relu_attention_tpu` (Mosaic) for TPU, `relu_attention_pallas` (Triton) for
               GPU; interpret mode on CPU.
  "auto"       "pallas" where `kernels/kernel_passes.json` records that these kernels passed their tests on
               this device class (and jax minor) and beat "xla" from this length on; "xla" everywhere else
               (`kernels.platforms`). A kernel that only lowered, or ran in interpret mode, is never chosen.

Unlike softmax there is no running max or log-sum-exp: the per-row factor depends only on i and
the mask, so it is applied once after the sum over key blocks.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from kernels.checks import check_causal, check_floating, check_key_mask, check_lengths, check_positive
from kernels.masking import zero_masked_rows
from kernels.numerics import xlogx
from kernels.platforms import auto_pallas_backend, resolve_pallas_backend
from kernels.relu_attention_mgpu import MgpuBlockSizes, relu_attention_mgpu, supported
from kernels.relu_attention_pallas import relu_attention_pallas
from kernels.relu_attention_tpu import relu_attention_tpu

IMPLS = ("auto", "reference", "xla", "pallas")


@dataclasses.dataclass(frozen=True)
class XlaBlockSizes:
    """Key-block length of the blocked XLA implementation; memory is O(T_q · block_k) per step."""

    block_k: int = 512


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


def _visible(key_mask: jax.Array, q_pos: jax.Array, k_pos: jax.Array, causal: bool) -> jax.Array:
    """Visibility `[batch, 1, len(q_pos), len(k_pos)]` of keys to queries."""
    vis = key_mask[:, None, None, :]
    if causal:
        vis = vis & (q_pos[:, None] >= k_pos[None, :])[None, None]
    return vis


def _check_inputs(q, k, v, key_mask, gamma, causal, row_scale="sqrt_half"):
    check_causal(causal)
    check_key_mask(key_mask)
    if row_scale not in ROW_SCALES:
        raise ValueError(f"unknown row_scale {row_scale!r}; valid: {', '.join(ROW_SCALES)}")
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"q, k, v must be [batch, length, heads, head_dim]; got shapes {q.shape}, {k.shape}, {v.shape}"
        )
    check_floating(q=q, k=k, v=v)
    b, tq, h, d = q.shape
    check_lengths(query_length=tq, key_length=k.shape[1], head_dim=d)
    if k.shape[0] != b or k.shape[2] != h or k.shape[3] != d:
        raise ValueError(f"k shape {k.shape} does not match q shape {q.shape} (batch, heads, head_dim)")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v shape {v.shape} does not match k shape {k.shape} (batch, length, heads)")
    if key_mask is not None and key_mask.shape != k.shape[:2]:
        raise ValueError(f"key_mask shape {key_mask.shape} must be [batch, key_length] = {k.shape[:2]}")
    if causal and tq != k.shape[1]:
        raise ValueError(f"causal attention needs equal query and key lengths, got {tq} and {k.shape[1]}")
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
    vis = _visible(key_mask, jnp.arange(q.shape[1]), jnp.arange(k.shape[1]), causal)
    factor = _mask_factor(key_mask, gamma_h, causal, row_scale, q.shape[1])
    return jnp.where(vis, jax.nn.relu(s), 0.0) * factor[..., None]


def _reference(q, k, v, key_mask, gamma_h, causal, row_scale):
    a = _reference_weights(q, k, key_mask, gamma_h, causal, row_scale)
    out = jnp.einsum("bhqk,bkhd->bqhd", a, v.astype(jnp.float32), precision=lax.Precision.HIGHEST)
    return out.astype(v.dtype)


# ----------------------------------------------------------------------------------------------
# Blocked XLA implementation with a custom VJP
# ----------------------------------------------------------------------------------------------


def _key_blocks(k, v, key_mask, block_k):
    """Pads keys to a multiple of block_k and splits them into `[num_blocks, batch, heads, block, dim]`."""
    b, tk, h, _ = k.shape
    bk = min(block_k, tk)
    nb = -(-tk // bk)
    pad = nb * bk - tk
    if pad:
        k = jnp.pad(k, ((0, 0), (0, pad), (0, 0), (0, 0)))
        v = jnp.pad(v, ((0, 0), (0, pad), (0, 0), (0, 0)))
        key_mask = jnp.pad(key_mask, ((0, 0), (0, pad)))  # padded keys are invisible

    def split(x):
        return x.reshape(b, nb, bk, h, x.shape[-1]).transpose(1, 0, 3, 2, 4)

    return split(k), split(v), key_mask.reshape(b, nb, bk).transpose(1, 0, 2), bk, nb


def _block_scores(qh, kj, mj, j, bk, causal):
    """Scores and visibility of one key block: s `[B, H, Tq, bk]` float32, vis broadcastable to it."""
    scale = 1.0 / math.sqrt(qh.shape[-1])
    s = jnp.einsum("bhqd,bhkd->bhqk", qh, kj, preferred_element_type=jnp.float32) * scale
    vis = _visible(mj, jnp.arange(qh.shape[2]), j * bk + jnp.arange(bk), causal)
    return s, vis


def _xla_forward(q, k, v, key_mask, gamma_h, causal, row_scale, block_k):
    b, tq, h, _ = q.shape
    factor = _mask_factor(key_mask, gamma_h, causal, row_scale, tq)
    kb, vb, mb, bk, nb = _key_blocks(k, v, key_mask, block_k)
    qh = q.transpose(0, 2, 1, 3)

    def body(acc, xs):
        kj, vj, mj, j = xs
        s, vis = _block_scores(qh, kj, mj, j, bk, causal)
        p = jnp.where(vis, jax.nn.relu(s), 0.0)
        acc = acc + jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), vj, preferred_element_type=jnp.float32)
        return acc, None

    acc0 = jnp.zeros((b, h, tq, v.shape[-1]), jnp.float32)
    acc, _ = lax.scan(body, acc0, (kb, vb, mb, jnp.arange(nb)))
    return (acc * factor[..., None]).transpose(0, 2, 1, 3).astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _xla(q, k, v, key_mask, gamma_h, causal, row_scale, block_k):
    return _xla_forward(q, k, v, key_mask, gamma_h, causal, row_scale, block_k)


def _xla_fwd(q, k, v, key_mask, gamma_h, causal, row_scale, block_k):
    out = _xla_forward(q, k, v, key_mask, gamma_h, causal, row_scale, block_k)
    return out, (q, k, v, key_mask, gamma_h)


def _xla_bwd(causal, row_scale, block_k, residuals, d_out):
    """Recomputes scores per key block: dS = dP ⊙ 1[s>0] ⊙ m ⊙ factor / √d, five matmuls a block."""
    q, k, v, key_mask, gamma_h = residuals
    b, tq, h, d = q.shape
    tk = k.shape[1]
    factor = _mask_factor(key_mask, gamma_h, causal, row_scale, tq)
    kb, vb, mb, bk, nb = _key_blocks(k, v, key_mask, block_k)
    qh = q.transpose(0, 2, 1, 3)
    do = d_out.transpose(0, 2, 1, 3)
    scale = 1.0 / math.sqrt(d)

    def body(carry, xs):
        dq, p_dot_dp = carry
        kj, vj, mj, j = xs
        s, vis = _block_scores(qh, kj, mj, j, bk, causal)
        p = jnp.where(vis, jax.nn.relu(s), 0.0)
        a = p * factor[..., None]
        dv_j = jnp.einsum("bhqk,bhqd->bhkd", a.astype(do.dtype), do, preferred_element_type=jnp.float32)
        dp = jnp.einsum("bhqd,bhkd->bhqk", do, vj, preferred_element_type=jnp.float32)
        p_dot_dp = p_dot_dp + jnp.sum(p * dp, axis=-1)
        ds = jnp.where(vis & (s > 0), dp * factor[..., None], 0.0) * scale
        dq = dq + jnp.einsum("bhqk,bhkd->bhqd", ds.astype(q.dtype), kj, preferred_element_type=jnp.float32)
        dk_j = jnp.einsum("bhqk,bhqd->bhkd", ds.astype(q.dtype), qh, preferred_element_type=jnp.float32)
        return (dq, p_dot_dp), (dk_j, dv_j)

    carry0 = (jnp.zeros((b, h, tq, d), jnp.float32), jnp.zeros((b, h, tq), jnp.float32))
    (dq, p_dot_dp), (dk_b, dv_b) = lax.scan(body, carry0, (kb, vb, mb, jnp.arange(nb)))

    def unblock(x):
        return x.transpose(1, 0, 3, 2, 4).reshape(b, nb * bk, h, x.shape[-1])[:, :tk]

    # out_i ∝ 1/γ, so dγ = −Σ_i do_i·out_i / γ = −Σ_i factor_i Σ_j p_ij dp_ij / γ.
    d_gamma = -jnp.sum(factor * p_dot_dp, axis=(0, 2)) / gamma_h
    return (
        dq.transpose(0, 2, 1, 3).astype(q.dtype),
        unblock(dk_b).astype(k.dtype),
        unblock(dv_b).astype(v.dtype),
        None,
        d_gamma.astype(gamma_h.dtype),
    )


_xla.defvjp(_xla_fwd, _xla_bwd)


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------


def _mosaic_refusal(q, k, v, block_sizes, causal: bool, fused_row_stats: bool = False):
    """Why the Mosaic GPU kernels cannot take these inputs (None: they can)."""

    def refusal():
        if fused_row_stats:
            return "the row statistics come out of the Triton forward kernel only"
        if block_sizes is not None and not isinstance(block_sizes, MgpuBlockSizes):
            return f"block sizes {type(block_sizes).__name__} are for other kernels"
        return supported(q, k, v, block_sizes or MgpuBlockSizes(), causal)

    return refusal


def _pallas_backend(requested, q, k, v, block_sizes, causal: bool, fused_row_stats: bool = False) -> str:
    """The kernels "pallas" runs (`kernels.platforms.resolve_pallas_backend`)."""
    refusal = _mosaic_refusal(q, k, v, block_sizes, causal, fused_row_stats)
    return resolve_pallas_backend(requested, refusal, op="relu_attention")


def _resolve_impl(impl: str) -> str:
    if impl not in IMPLS:
        raise ValueError(f"unknown relu_attention impl {impl!r}; valid: {', '.join(IMPLS)}")
    return impl


def _choose_impl(
    impl: str, q, k, v, block_sizes, causal: bool, fused_row_stats: bool = False
) -> tuple[str, str | None]:
    """(impl, pallas_backend) to run: "auto" is "pallas" with the backend `kernels.platforms` records as passed
    and faster on this device class from this length on, else "xla"."""
    impl = _resolve_impl(impl)
    if impl != "auto":
        return impl, None
    refusal = _mosaic_refusal(q, k, v, block_sizes, causal, fused_row_stats)
    backend = auto_pallas_backend("relu_attention", k.shape[1], {"mosaic_gpu": refusal})
    return ("pallas", backend) if backend else ("xla", None)


def relu_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    key_mask: jax.Array | None = None,
    gamma: jax.Array | float = 1.0,
    impl: str = "auto",
    row_scale: str = "sqrt_half",
    block_sizes: XlaBlockSizes | None = None,
    pallas_block_sizes=None,
    pallas_backend: str | None = None,
    pallas_interpret: bool | None = None,
) -> jax.Array:
    """ReLU attention (docs/mixers.md). q, k, v: `[batch, length, heads, head_dim]`; returns v's shape and dtype.

    Args:
      key_mask: `[batch, key_length]` bool, True = real token; None means every key is real.
      gamma: scalar or `[heads]`, the per-head temperature γ_h (positive).
      row_scale: "sqrt_half" divides row i by √(n_i/2) (ReLUFormer); "count" by n_i (ReLU/L);
        "none" by 1 (ReLA, and ReLUFormer's non-converging ablation).
      block_sizes: key-block length for impl="xla"; pallas_block_sizes: a PallasBlockSizes ("pallas" on GPU
        or in interpret mode) or a TpuBlockSizes ("pallas" for TPU).
      pallas_backend: the kernels "pallas" runs (`kernels.platforms`) — "tpu" (Mosaic TPU,
        `relu_attention_tpu`), "triton" (`relu_attention_pallas`), "mosaic_gpu" (Hopper, `relu_attention_mgpu`;
        experimental), "gpu" (by compute capability: Mosaic GPU on Hopper for the inputs it takes and
        `pallas_block_sizes` None or an MgpuBlockSizes, Triton otherwise) — default: the running backend's.
        Lowering for another platform than the running one (e.g. `jax.export(..., platforms=["tpu"])` on a CPU)
        needs it.
      pallas_interpret: run the kernels in Pallas interpret mode (default: on a CPU backend).
    """
    _check_inputs(q, k, v, key_mask, gamma, causal, row_scale)
    k, v = zero_masked_rows(k, key_mask), zero_masked_rows(v, key_mask)
    key_mask, gamma_h = _prepare(q, k, key_mask, gamma)
    impl, auto_backend = _choose_impl(impl, q, k, v, pallas_block_sizes, causal)
    pallas_backend = auto_backend or pallas_backend
    if impl == "reference":
        return _reference(q, k, v, key_mask, gamma_h, causal, row_scale)
    if impl == "pallas":
        factor = _mask_factor(key_mask, gamma_h, causal, row_scale, q.shape[1])  # differentiable: dγ flows through it
        backend = _pallas_backend(pallas_backend, q, k, v, pallas_block_sizes, causal)
        interpret = jax.default_backend() == "cpu" if pallas_interpret is None else pallas_interpret
        if backend == "mosaic_gpu":  # Hopper kernels (MgpuBlockSizes.backward picks the backward)
            return relu_attention_mgpu(q, k, v, key_mask, factor, causal=causal, block_sizes=pallas_block_sizes)
        if backend == "tpu":
            return relu_attention_tpu(
                q, k, v, key_mask, factor, causal=causal, block_sizes=pallas_block_sizes, interpret=interpret
            )
        return relu_attention_pallas(
            q, k, v, key_mask, factor, causal=causal, block_sizes=pallas_block_sizes, backend=backend,
            interpret=interpret,
        )  # fmt: skip
    block_k = (block_sizes or XlaBlockSizes()).block_k
    return _xla(q, k, v, key_mask, gamma_h, causal, row_scale, block_k)


def relu_attention_row_stats(
    q: jax.Array,
    k: jax.Array,
    *,
    causal: bool = False,
    key_mask: jax.Array | None = None,
    gamma: jax.Array | float = 1.0,
    impl: str = "auto",
    row_scale: str = "sqrt_half",
    block_sizes: XlaBlockSizes | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Row sums S_i = Σ_j a_ij and E_i = Σ_j a_ij log a_ij, each `[batch, q_length, heads]` float32.

    These are what ReLUFormer's normalisation and entropy regularisers need (the entropy of
    p = a / (S + ε) is −E/(S+ε) + S/(S+ε)·log(S+ε)). "xla" recomputes each key block under
    `jax.checkpoint`, so neither forward nor backward holds the T×T matrix.
    """
    _check_inputs(q, k, k, key_mask, gamma, causal, row_scale)
    k = zero_masked_rows(k, key_mask)
    key_mask, gamma_h = _prepare(q, k, key_mask, gamma)

    if _resolve_impl(impl) == "reference":
        a = _reference_weights(q, k, key_mask, gamma_h, causal, row_scale)
        return a.sum(-1).transpose(0, 2, 1), xlogx(a).sum(-1).transpose(0, 2, 1)

    b, tq, h, _ = q.shape
    factor = _mask_factor(key_mask, gamma_h, causal, row_scale, tq)
    kb, _, mb, bk, nb = _key_blocks(k, k, key_mask, (block_sizes or XlaBlockSizes()).block_k)
    qh = q.transpose(0, 2, 1, 3)

    @jax.checkpoint
    def body(carry, xs):
        row_sum, row_xlogx = carry
        kj, mj, j = xs
        s, vis = _block_scores(qh, kj, mj, j, bk, causal)
        a = jnp.where(vis, jax.nn.relu(s), 0.0) * factor[..., None]
        return (row_sum + a.sum(-1), row_xlogx + xlogx(a).sum(-1)), None

    zeros = jnp.zeros((b, h, tq), jnp.float32)
    (row_sum, row_xlogx), _ = lax.scan(body, (zeros, zeros), (kb, mb, jnp.arange(nb)))
    return row_sum.transpose(0, 2, 1), row_xlogx.transpose(0, 2, 1)


def relu_attention_and_row_stats(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    key_mask: jax.Array | None = None,
    gamma: jax.Array | float = 1.0,
    impl: str = "auto",
    row_scale: str = "sqrt_half",
    block_sizes: XlaBlockSizes | None = None,
    pallas_block_sizes=None,
    pallas_backend: str | None = None,
    pallas_interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`relu_attention`'s output and `relu_attention_row_stats`' (S_i, E_i), `[batch, q_length, heads]`.

    With impl="pallas" on a GPU (the Triton kernels, which pallas_backend "gpu" picks here on Hopper too;
    interpret mode on a CPU) the forward kernel accumulates
    Σ_j p_ij and Σ_j p_ij log p_ij of the unscaled p = ReLU(s)·m in the pass that computes the output, and
    the backward kernels take their cotangents: no second T² pass. With a row factor f_i > 0,
    S_i = f_i Σ p and E_i = Σ f p log(f p) = f_i (log f_i · Σ p + Σ p log p). Other impls (and the TPU and
    Mosaic GPU kernels) compute the two separately. Arguments as `relu_attention`.
    """
    _check_inputs(q, k, v, key_mask, gamma, causal, row_scale)
    impl, auto_backend = _choose_impl(impl, q, k, v, pallas_block_sizes, causal, fused_row_stats=True)
    pallas_backend = auto_backend or pallas_backend
    opts = dict(causal=causal, key_mask=key_mask, gamma=gamma, impl=impl, row_scale=row_scale)
    pallas = impl == "pallas"
    backend = _pallas_backend(pallas_backend, q, k, v, pallas_block_sizes, causal, True) if pallas else None
    if not pallas or backend in ("tpu", "mosaic_gpu"):
        out = relu_attention(
            q, k, v, block_sizes=block_sizes, pallas_block_sizes=pallas_block_sizes, pallas_backend=backend,
            pallas_interpret=pallas_interpret, **opts,
        )  # fmt: skip
        return out, *relu_attention_row_stats(q, k, block_sizes=block_sizes, **opts)
    k, v = zero_masked_rows(k, key_mask), zero_masked_rows(v, key_mask)
    key_mask, gamma_h = _prepare(q, k, key_mask, gamma)
    factor = _mask_factor(key_mask, gamma_h, causal, row_scale, q.shape[1])
    interpret = jax.default_backend() == "cpu" if pallas_interpret is None else pallas_interpret
    out, p_sum, p_xlogx = relu_attention_pallas(
        q, k, v, key_mask, factor, causal=causal, block_sizes=pallas_block_sizes, backend=backend,
        interpret=interpret, row_stats=True,
    )  # fmt: skip
    row_sum = factor * p_sum
    row_xlogx = factor * (jnp.log(factor) * p_sum + p_xlogx)
    return out, row_sum.transpose(0, 2, 1), row_xlogx.transpose(0, 2, 1)
