"""Softmax attention on TPU through JAX's own Pallas splash attention kernels (what MaxText runs).

Our layout `[batch, length, heads, dim]` goes in as the kernel's `[heads, length, dim]` per example (vmapped over
the batch); the causal mask is the kernel's static `CausalMask` (it skips the blocks above the diagonal), and the
key mask is segment ids (queries 0, real keys 0, padded keys 1), which hides padded keys anywhere in the
sequence. Lengths are padded to whole tiles (tiles are multiples of the 128 TPU lanes) and q is scaled by
1/√d before the kernel, which takes the scores unscaled. In interpret mode (a CPU) the same kernels run as
jnp, which is how the tests check them against the reference; `jax.export(..., platforms=["tpu"])` checks that
they lower for a TPU.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from kernels.numerics import LANES, round_up

# JAX's splash kernels are imported by `softmax_attention_splash`, not here (linear_attention/mosaic_tpu.py).


@dataclasses.dataclass(frozen=True, kw_only=True)
class SplashBlockSizes:
    """Splash attention's tiles, each a positive multiple of 128 (the TPU lanes); shorter sequences use one tile
    of their padded length. block_q, block_kv: the forward's; *_bwd: the dq and dk/dv kernels'."""

    block_q: int = 512
    block_kv: int = 512
    block_q_bwd: int = 512
    block_kv_bwd: int = 512

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < LANES or value % LANES:
                message = f"must be a positive multiple of {LANES}, got {value!r}"
                raise ValueError(f"SplashBlockSizes.{field.name}: {message}")


def splash_refusal(q: jax.Array, k: jax.Array, v: jax.Array) -> str | None:
    """Why the splash kernels cannot take these inputs (None: they can)."""
    if jnp.dtype(q.dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)):
        return f"the TPU kernels take bfloat16 or float32, not {jnp.dtype(q.dtype).name}"
    return None


def _tiles(length: int, blocks: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
    """(padded length, tiles): each tile at most the length rounded up to the lanes, the length a multiple of all."""
    longest = round_up(length, LANES)
    tiles = tuple(min(block, longest) for block in blocks)
    return round_up(length, math.lcm(*tiles)), tiles


def softmax_attention_splash(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array,
    *,
    causal: bool,
    block_sizes: SplashBlockSizes | None,
    interpret: bool,
) -> jax.Array:
    """Softmax attention `[batch, q_length, heads, d_v]` in v's dtype through the splash kernels. key_mask:
    `[batch, key_length]` bool. A row that sees no key is not defined here (the caller zeroes it)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    sizes = block_sizes or SplashBlockSizes()
    b, tq, h, d = q.shape
    tk = k.shape[1]
    if causal:  # one padded length, so query and key positions stay aligned
        length, (bq, bkv, bq_bwd, bkv_bwd) = _tiles(
            tq, (sizes.block_q, sizes.block_kv, sizes.block_q_bwd, sizes.block_kv_bwd)
        )
        lq = lk = length
    else:
        lq, (bq, bq_bwd) = _tiles(tq, (sizes.block_q, sizes.block_q_bwd))
        lk, (bkv, bkv_bwd) = _tiles(tk, (sizes.block_kv, sizes.block_kv_bwd))
    tiles = splash.BlockSizes(
        block_q=bq, block_kv=bkv, block_kv_compute=bkv,
        block_q_dkv=bq_bwd, block_kv_dkv=bkv_bwd, block_kv_dkv_compute=bkv_bwd,
        block_q_dq=bq_bwd, block_kv_dq=bkv_bwd,
    )  # fmt: skip
    head_mask = splash.CausalMask((lq, lk)) if causal else splash.FullMask((lq, lk))
    kernel = splash.make_splash_mha_single_device(
        splash.MultiHeadMask([head_mask] * h), block_sizes=tiles, interpret=interpret
    )

    def heads_first(x, length):
        x = jnp.pad(x, ((0, 0), (0, length - x.shape[1]), (0, 0), (0, 0)))
        return x.transpose(0, 2, 1, 3)

    qh = heads_first(q * jnp.asarray(1.0 / math.sqrt(d), q.dtype), lq)
    kh, vh = heads_first(k, lk), heads_first(v, lk)
    padded_mask = jnp.pad(key_mask, ((0, 0), (0, lk - tk)))
    segments = splash.SegmentIds(q=jnp.zeros((b, lq), jnp.int32), kv=jnp.where(padded_mask, 0, 1).astype(jnp.int32))
    out = jax.vmap(kernel)(qh, kh, vh, segments)
    return out.transpose(0, 2, 1, 3)[:, :tq].astype(v.dtype)
