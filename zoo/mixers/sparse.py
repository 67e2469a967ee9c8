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
_FLOOR = -1e4  # shifted scores are clipped here (anything below −2 is outside the support anyway)


def _rows_last(x: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
    """(x as float32 with `axis` last minus each row's max, the rows with no finite entry): both maps are
    shift-invariant, and float32 loses the support at large offsets otherwise. An empty row becomes zeros."""
    x = jnp.moveaxis(x.astype(jnp.float32), axis, -1)
    row_max = jnp.max(x, axis=-1, keepdims=True)
    empty = ~jnp.isfinite(row_max)
    shifted = x - jnp.where(empty, 0.0, jax.lax.stop_gradient(row_max))
    # Entries more than 2 below the row max are outside both supports; a floor keeps −inf out of the sums.
    return jnp.where(empty, 0.0, jnp.maximum(shifted, _FLOOR)), empty


@jax.custom_vjp
def _sparsemax_last(x: jax.Array) -> jax.Array:
    """Sparsemax over the last axis of a shifted, finite-max row (sorting, Martins & Astudillo 2016)."""
    z = jnp.flip(jnp.sort(x, axis=-1), axis=-1)
    k = jnp.arange(1, x.shape[-1] + 1, dtype=jnp.float32)
    cumsum = jnp.cumsum(z, axis=-1)
    support = (1.0 + k * z) > cumsum
    k_star = jnp.maximum(jnp.sum(support, axis=-1, keepdims=True), 1)
    tau = (jnp.take_along_axis(cumsum, k_star - 1, axis=-1) - 1.0) / k_star
    return jnp.maximum(x - tau, 0.0)


def _sparsemax_fwd(x):
    p = _sparsemax_last(x)
    return p, p


def _sparsemax_bwd(p, g):
    # Jacobian diag(s) − s sᵀ/|S| with S = {p > 0}: entries at a tie (x_i = τ, p_i = 0) are outside the
    # support, so every column sums to 0 (autodiff through `maximum` would split ½/½ there).
    support = (p > 0).astype(g.dtype)
    mean = jnp.sum(g * support, axis=-1, keepdims=True) / jnp.maximum(jnp.sum(support, -1, keepdims=True), 1.0)
    return (support * (g - mean),)


_sparsemax_last.defvjp(_sparsemax_fwd, _sparsemax_bwd)


def sparsemax(x: jax.Array, axis: int = -1) -> jax.Array:
    """Euclidean projection of each row onto the probability simplex; −inf entries are never in the
    support and a row of only −inf gives zeros. Float32 out."""
    x, empty = _rows_last(x, axis)
    return jnp.moveaxis(jnp.where(empty, 0.0, _sparsemax_last(x)), -1, axis)


def entmax15(x: jax.Array, axis: int = -1) -> jax.Array:
    """Exact 1.5-entmax: p_i = [x_i/2 − τ]_+², Σ p = 1, by sorting; −inf rows as in `sparsemax`."""
    x, empty = _rows_last(x, axis)
    x = x / 2.0
    z = jnp.flip(jnp.sort(x, axis=-1), axis=-1)
    k = jnp.arange(1, x.shape[-1] + 1, dtype=jnp.float32)
    mean = jnp.cumsum(z, axis=-1) / k
    mean_sq = jnp.cumsum(z * z, axis=-1) / k
    delta = (1.0 - k * (mean_sq - mean * mean)) / k
    # sqrt has an infinite slope at 0: guard it so rows outside the support back-propagate zeros, not NaN.
    positive = delta > 0
    tau = mean - jnp.where(positive, jnp.sqrt(jnp.where(positive, delta, 1.0)), 0.0)
    k_star = jnp.sum(tau <= z, axis=-1, keepdims=True)
    tau_star = jnp.take_along_axis(tau, jnp.maximum(k_star, 1) - 1, axis=-1)
    return jnp.moveaxis(jnp.where(empty, 0.0, jnp.maximum(x - tau_star, 0.0) ** 2), -1, axis)


class SparseAttention(MultiHeadMixer):
    normaliser = staticmethod(sparsemax)
    has_attention_weights = True

    def attend(self, q, k, v, mask, causal, rngs=None):
        def weights(s, visible):
            return jnp.where(visible, self.normaliser(jnp.where(visible, s, _MASKED)), 0.0)

        return self.attend_densely(q, k, v, mask, causal, weights, rngs)


class EntmaxAttention(SparseAttention):
    normaliser = staticmethod(entmax15)


register("sparsemax", SparseAttention)
register("entmax15", EntmaxAttention)
