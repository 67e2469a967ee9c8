"""Sparse softmax replacements, the ReLUFormer paper's baselines: sparsemax and exact 1.5-entmax attention.

Both are computed exactly by sorting each row (Martins & Astudillo 2016; Peters, Niculae & Martins 2019),
on the dense score matrix: they are baselines, not long-context mixers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from zoo.mixers.attention import MultiHeadMixer
from zoo.mixers.registry import register

_MASKED = -1e9  # finite, so the sort-based formulas stay finite; never in the support


def sparsemax(x: jax.Array, axis: int = -1) -> jax.Array:
    """Euclidean projection of each row onto the probability simplex."""
    x = jnp.moveaxis(x.astype(jnp.float32), axis, -1)
    z = jnp.flip(jnp.sort(x, axis=-1), axis=-1)
    k = jnp.arange(1, x.shape[-1] + 1, dtype=jnp.float32)
    cumsum = jnp.cumsum(z, axis=-1)
    support = (1.0 + k * z) > cumsum
    k_star = jnp.sum(support, axis=-1, keepdims=True)
    tau = (jnp.take_along_axis(cumsum, k_star.astype(jnp.int32) - 1, axis=-1) - 1.0) / k_star
    return jnp.moveaxis(jnp.maximum(x - tau, 0.0), -1, axis)


def entmax15(x: jax.Array, axis: int = -1) -> jax.Array:
    """Exact 1.5-entmax: p_i = [x_i/2 − τ]_+², Σ p = 1, by sorting."""
    x = jnp.moveaxis(x.astype(jnp.float32), axis, -1) / 2.0
    x = x - jnp.max(x, axis=-1, keepdims=True)
    z = jnp.flip(jnp.sort(x, axis=-1), axis=-1)
    k = jnp.arange(1, x.shape[-1] + 1, dtype=jnp.float32)
    mean = jnp.cumsum(z, axis=-1) / k
    mean_sq = jnp.cumsum(z * z, axis=-1) / k
    delta = (1.0 - k * (mean_sq - mean * mean)) / k
    # sqrt has an infinite slope at 0: guard it so rows outside the support back-propagate zeros, not NaN.
    positive = delta > 0
    tau = mean - jnp.where(positive, jnp.sqrt(jnp.where(positive, delta, 1.0)), 0.0)
    k_star = jnp.sum(tau <= z, axis=-1, keepdims=True)
    tau_star = jnp.take_along_axis(tau, k_star - 1, axis=-1)
    return jnp.moveaxis(jnp.maximum(x - tau_star, 0.0) ** 2, -1, axis)


def _visibility(mask, tq, tk, batch, causal):
    vis = jnp.ones((batch, 1, tq, tk), bool) if mask is None else mask[:, None, None, :]
    if causal:
        vis = vis & jnp.tril(jnp.ones((tq, tk), bool))[None, None]
    return vis


class SparseAttention(MultiHeadMixer):
    normaliser = staticmethod(sparsemax)

    def attend(self, q, k, v, mask, causal):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / jnp.sqrt(q.shape[-1])
        vis = _visibility(mask, q.shape[1], k.shape[1], q.shape[0], causal)
        p = jnp.where(vis, self.normaliser(jnp.where(vis, s, _MASKED)), 0.0)
        return jnp.einsum("bhqk,bkhd->bqhd", p.astype(v.dtype), v)


class EntmaxAttention(SparseAttention):
    normaliser = staticmethod(entmax15)


register("sparsemax", SparseAttention, lambda: {})
register("entmax15", EntmaxAttention, lambda: {})
