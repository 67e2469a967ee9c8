"""Softmax attention by its definition: dense, float32 (for tests; the reference every other impl is compared
with), and which weights dropout keeps — a function of (key, example, head, i, j) alone that every impl shares."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from kernels.blocking import visible
from kernels.numerics import VALUES_PER_HASH, dropout_keep_bits, dropout_levels, keep_scale, keep_threshold


def keep_mask(seed, rate: float, heads: int, q_length: int, batch: int, rows, col_start, num_cols: int) -> jax.Array:
    """Which weights dropout keeps: bool `[batch, heads, len(rows), num_cols]` for query positions `rows` and the
    keys from `col_start`. Weight (b, h, i, j) takes quarter j % 4 of the hash of (its row's number, j // 4): the
    same wherever a block starts."""
    column = (col_start + jnp.arange(num_cols)).astype(jnp.uint32)
    row_id = row_numbers(heads, q_length, batch, rows)
    return dropout_levels(seed, row_id, column >> 2, column & 3) >= jnp.uint32(keep_threshold(rate))


def keep_bits(seed, rate: float, heads: int, q_length: int, batch: int, rows, col_start, num_cols: int) -> jax.Array:
    """`keep_mask` of the same weights packed four to a byte, uint8 `[batch, heads, len(rows), num_cols // 4]`
    (`kernels.numerics.unpack_keep_bits` reads it back); `col_start` and `num_cols` multiples of 4."""
    group = (col_start // VALUES_PER_HASH + jnp.arange(num_cols // VALUES_PER_HASH)).astype(jnp.uint32)
    return dropout_keep_bits(seed, rate, row_numbers(heads, q_length, batch, rows), group)


def row_numbers(heads: int, q_length: int, batch: int, rows) -> jax.Array:
    """The hash counter of each (example, head, query row): uint32 `[batch, heads, len(rows), 1]`."""
    row_id = (jnp.arange(batch)[:, None, None] * heads + jnp.arange(heads)[None, :, None]) * q_length
    return (row_id + rows[None, None, :]).astype(jnp.uint32)[..., None]


def reference(q, k, v, key_mask, causal, seed=None, rate=0.0):
    qf, kf = q.astype(jnp.float32), k.astype(jnp.float32)
    s = jnp.einsum("bqhd,bkhd->bhqk", qf, kf, precision=lax.Precision.HIGHEST) / jnp.sqrt(float(q.shape[-1]))
    vis = visible(key_mask, jnp.arange(q.shape[1]), jnp.arange(k.shape[1]), causal)
    s = jnp.where(vis, s, -jnp.inf)
    row_max = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.where(vis, jnp.exp(s - jnp.where(jnp.isfinite(row_max), row_max, 0.0)), 0.0)
    total = p.sum(-1, keepdims=True)
    a = p / jnp.where(total > 0, total, 1.0)
    if rate:
        b, tq, h, _ = q.shape
        keep = keep_mask(seed, rate, h, tq, b, jnp.arange(tq), 0, k.shape[1])
        a = jnp.where(keep, a * keep_scale(rate), 0.0)
    out = jnp.einsum("bhqk,bkhd->bqhd", a, v.astype(jnp.float32), precision=lax.Precision.HIGHEST)
    return out.astype(v.dtype)
