"""ReLU attention by its definition: dense, float32, the T×T weights materialised (for tests and as the
reference every other impl is compared with; docs/mixers.md).

    a_ij = m_ij · ReLU(q_i·k_j / √d) / (γ_h · r(n_i)),   h_i = Σ_j a_ij v_j,   r = √(n/2), n or 1 (`ROW_SCALES`)
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from kernels.blocking import visible
from kernels.numerics import xlogx


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


def mask_factor(key_mask: jax.Array, gamma_h: jax.Array, causal: bool, row_scale: str, q_length: int) -> jax.Array:
    """The row factor 1 / (γ_h · r(n_i)) `[batch, heads, q_length]` float32 for a key mask, r = √(n/2), n or 1 by
    `row_scale` (n_i: `visible_key_counts`)."""
    counts = visible_key_counts(key_mask, causal=causal, q_length=q_length)[:, None, :]
    inv_gamma = 1.0 / gamma_h.astype(jnp.float32)[None, :, None]
    if row_scale == "sqrt_half":
        return inv_gamma * lax.rsqrt(counts / 2.0)
    if row_scale == "count":
        return inv_gamma / counts
    return jnp.broadcast_to(inv_gamma, (counts.shape[0], gamma_h.shape[0], q_length))


def reference_weights(q, k, key_mask, gamma_h, causal, row_scale):
    """Dense a_ij `[batch, heads, q_length, k_length]` in float32."""
    qf, kf = q.astype(jnp.float32), k.astype(jnp.float32)
    s = jnp.einsum("bqhd,bkhd->bhqk", qf, kf, precision=lax.Precision.HIGHEST) / math.sqrt(q.shape[-1])
    vis = visible(key_mask, jnp.arange(q.shape[1]), jnp.arange(k.shape[1]), causal)
    factor = mask_factor(key_mask, gamma_h, causal, row_scale, q.shape[1])
    return jnp.where(vis, jax.nn.relu(s), 0.0) * factor[..., None]


def reference(q, k, v, key_mask, gamma_h, causal, row_scale):
    a = reference_weights(q, k, key_mask, gamma_h, causal, row_scale)
    out = jnp.einsum("bhqk,bkhd->bqhd", a, v.astype(jnp.float32), precision=lax.Precision.HIGHEST)
    return out.astype(v.dtype)


def reference_row_stats(q, k, key_mask, gamma_h, causal, row_scale):
    """(S_i, E_i) `[batch, q_length, heads]`: Σ_j a_ij and Σ_j a_ij log a_ij of the dense weights."""
    a = reference_weights(q, k, key_mask, gamma_h, causal, row_scale)
    return a.sum(-1).transpose(0, 2, 1), xlogx(a).sum(-1).transpose(0, 2, 1)
