"""The key blocks and causal tiles that the blocked XLA impls of every op share.

An op's "xla" impl never builds the T×T matrix: it splits the keys into blocks of `block_k`
(`key_blocks`), forms one block's scores at a time (`block_scores`) and, in causal self-attention with at most
`MAX_CAUSAL_BLOCKS` key blocks (`block_causal`), meets key block j only with the query rows from its own start,
so the work is the lower triangle plus the diagonal blocks. This module imports only jax.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

# The key-block length of the XLA impls by platform when the options leave it unset, causal and not, from
# measurement on a 2-core CPU (fwd+bwd, fp32, D 64; docs/performance.md). Non-causal, 256 is as fast as 128 or faster
# at every shape measured: ReLU 5-6% faster at B4 T2001 H8 (the lra_code ListOps shape; 384, 512 and 1,024 slower
# again), up to 15% at T 4096 (in the whole lra_code ListOps train step, 1-2 MFU points at most: inside its spread
# between rounds). Causal, the tile-by-tile lower triangle wastes less with short blocks: 128 is 8-16% faster at
# B4 T2000 H8, 5% slower at T 4096 B1 H4. GPU and TPU run their kernels; their XLA impls (for inputs the kernels
# refuse) keep 512, not measured there.
XLA_BLOCK_K = {"cpu": 256}
XLA_CAUSAL_BLOCK_K = {"cpu": 128}
DEFAULT_XLA_BLOCK_K = 512


def default_block_k(backend: str | None = None, *, causal: bool) -> int:
    """The key-block length of the XLA impls on `backend` (default: the running one's), causal or not."""
    return (XLA_CAUSAL_BLOCK_K if causal else XLA_BLOCK_K).get(backend or jax.default_backend(), DEFAULT_XLA_BLOCK_K)


# Causal self-attention with at most this many key blocks is unrolled tile by tile, each key block meeting only
# the query rows at or after it. Beyond it a scan over every key block keeps the program's size bounded.
MAX_CAUSAL_BLOCKS = 32


def visible(key_mask: jax.Array, q_pos: jax.Array, k_pos: jax.Array, causal: bool) -> jax.Array:
    """Visibility `[batch, 1, len(q_pos), len(k_pos)]` of keys to queries."""
    vis = key_mask[:, None, None, :]
    if causal:
        vis = vis & (q_pos[:, None] >= k_pos[None, :])[None, None]
    return vis


def key_blocks(k: jax.Array, v: jax.Array, key_mask: jax.Array, block_k: int):
    """Keys padded to a multiple of block_k and split into `[num_blocks, batch, heads, block, dim]`; returns
    (k blocks, v blocks, mask blocks `[num_blocks, batch, block]`, block length, number of blocks)."""
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


def unblock(x: jax.Array, length: int) -> jax.Array:
    """`[num_blocks, batch, heads, block, dim]` (as `key_blocks` splits) back to `[batch, length, heads, dim]`."""
    nb, b, h, bk, dim = x.shape
    return x.transpose(1, 0, 3, 2, 4).reshape(b, nb * bk, h, dim)[:, :length]


def block_scores(qh, kj, mj, j, bk, causal, *, q_offset=0):
    """Scores and visibility of key block j against query rows `qh` `[B, H, rows, d]` that start at position
    `q_offset`: s `[B, H, rows, bk]` float32 (q·k/√d), vis broadcastable to it."""
    scale = 1.0 / math.sqrt(qh.shape[-1])
    s = jnp.einsum("bhqd,bhkd->bhqk", qh, kj, preferred_element_type=jnp.float32) * scale
    vis = visible(mj, q_offset + jnp.arange(qh.shape[2]), j * bk + jnp.arange(bk), causal)
    return s, vis


def causal_block_k(q: jax.Array, k: jax.Array, causal: bool, block_k: int) -> int:
    """The key-block length the XLA impls use: `block_k`, grown for long causal self-attention so that it has at
    most MAX_CAUSAL_BLOCKS blocks (a multiple of 8), which keeps the tile-by-tile lower triangle at any length."""
    if not (causal and q.shape[1] == k.shape[1]):
        return block_k
    least = -(-k.shape[1] // MAX_CAUSAL_BLOCKS)
    return max(block_k, -(-least // 8) * 8)


def block_causal(q: jax.Array, k: jax.Array, causal: bool, block_k: int) -> bool:
    """Whether causal self-attention of these inputs runs tile by tile (the lower triangle only)."""
    nb = -(-k.shape[1] // min(block_k, k.shape[1]))
    return causal and q.shape[1] == k.shape[1] and 1 < nb <= MAX_CAUSAL_BLOCKS


def pad_rows(x: jax.Array, rows: int, axis: int = 2) -> jax.Array:
    """`x` zero-padded to `rows` along `axis`: query rows up to whole blocks (cut off after)."""
    pad = rows - x.shape[axis]
    if not pad:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def lower_triangle_gradients(num_blocks: int, block: int, length: int, tile, *rows):
    """The backward of block-causal self-attention from its tiles (query block i, key block j ≤ i).

    `rows`: (array, query axis) pairs, zero-padded to whole blocks (padded rows have dO = 0: they add nothing).
    `tile(i, j, *their rows of query block i)` returns that tile's (dQ rows `[B, H, block, d]`, dK, dV of key
    block j). Returns dQ `[B, H, length, d]` and dK, dV stacked over key blocks; tiles in a block's future are never
    computed. Unrolled in Python, as each query block has its own number of tiles: `block_causal` keeps it to
    MAX_CAUSAL_BLOCKS blocks."""
    rows = [(pad_rows(x, num_blocks * block, axis), axis) for x, axis in rows]
    dq_blocks, dk_acc, dv_acc = [], [None] * num_blocks, [None] * num_blocks
    for i in range(num_blocks):
        rows_i = [lax.slice_in_dim(x, i * block, (i + 1) * block, axis=axis) for x, axis in rows]
        dq_i = None
        for j in range(i + 1):
            dq_ij, dk_ij, dv_ij = tile(i, j, *rows_i)
            dq_i = dq_ij if dq_i is None else dq_i + dq_ij
            dk_acc[j] = dk_ij if dk_acc[j] is None else dk_acc[j] + dk_ij
            dv_acc[j] = dv_ij if dv_acc[j] is None else dv_acc[j] + dv_ij
        dq_blocks.append(dq_i)
    return jnp.concatenate(dq_blocks, axis=2)[:, :, :length], jnp.stack(dk_acc), jnp.stack(dv_acc)
