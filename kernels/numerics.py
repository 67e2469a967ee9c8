"""Numerics and shapes that the ops and their kernel backends share.

The dispatchers (`relu_attention`, `linear_attention`) and every backend (`*_pallas`, `*_tpu`, `*_mgpu`) import
what they share from here, and this module imports only jax: no backend needs a dispatcher or another backend
for a helper, so the package's imports cannot form a circle (tests/kernels/test_import_graph.py).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.random import threefry_2x32

# ----------------------------------------------------------------------------------------------
# Linear attention's denominator
# ----------------------------------------------------------------------------------------------

EPS_MODES = ("add", "guard")


def stabilise_denominator(den: jax.Array, eps: float, eps_mode: str) -> jax.Array:
    """The normaliser with ε applied by `eps_mode` (kernels/linear_attention.py); its derivative is 1 either way.

    "add": den + ε everywhere (fast-transformers). "guard": den + 2ε only where |den| ≤ ε (FAVOR+).
    """
    if eps_mode == "add":
        return den + eps
    return den + jnp.where(jnp.abs(den) <= eps, 2 * eps, 0.0).astype(den.dtype)


# ----------------------------------------------------------------------------------------------
# ReLU attention's row statistics
# ----------------------------------------------------------------------------------------------


def xlogx(a: jax.Array) -> jax.Array:
    """a log a, 0 where a ≤ 0 (the entropy regulariser's convention)."""
    return jnp.where(a > 0, a * jnp.log(jnp.where(a > 0, a, 1.0)), 0.0)


# ----------------------------------------------------------------------------------------------
# Tiles and grids
# ----------------------------------------------------------------------------------------------

LANES = 128  # the lanes of a TPU vector register: the last dim of a Mosaic TPU tile is a multiple of this
TRANS_B = (((1,), (1,)), ((), ()))  # `lax.dot_general` dimension numbers of x @ yᵀ


def round_up(x: int, m: int) -> int:
    """The least multiple of m that is ≥ x."""
    return -(-x // m) * m


def padded_lengths(
    tq: int, tk: int, causal: bool, q_blocks: tuple[int, ...], k_blocks: tuple[int, ...]
) -> tuple[int, int]:
    """(query, key) lengths padded to whole blocks of every kernel; causal pads both to one length so that
    query and key positions stay aligned."""
    if causal:
        unit = math.lcm(*q_blocks, *k_blocks)
        return round_up(tq, unit), round_up(tq, unit)
    return round_up(tq, math.lcm(*q_blocks)), round_up(tk, math.lcm(*k_blocks))


def lower_triangle(c: int) -> jax.Array:
    """The `[c, c]` mask of row ≥ column: which keys of a chunk each of its queries sees when causal."""
    return lax.broadcasted_iota(jnp.int32, (c, c), 0) >= lax.broadcasted_iota(jnp.int32, (c, c), 1)


def triton_compiler_params(platform: str, num_warps: int | None, num_stages: int, head_dim: int):
    """`pl.pallas_call`'s compiler_params for the Triton kernels built for `platform` ("gpu"; anything else but
    "tpu" is interpret mode, which takes none). `num_warps` None: 4 for head dims ≤ 64, else 8."""
    if platform == "gpu":
        from jax.experimental.pallas import triton as plgpu

        warps = num_warps or (4 if head_dim <= 64 else 8)
        return plgpu.CompilerParams(num_warps=warps, num_stages=num_stages)
    if platform == "tpu":
        raise ValueError(
            "these are the GPU (Triton) kernels; TPU has its own in relu_attention_tpu / linear_attention_tpu"
        )
    return None


# ----------------------------------------------------------------------------------------------
# Dropout's random bits
# ----------------------------------------------------------------------------------------------

# A value is kept when its 16 random bits are ≥ round(rate · 2^16): one Threefry hash (64 bits) decides four
# values, where `jax.random.bernoulli` spends one hash on each (JAX's partitionable Threefry): ~4.5× fewer hashes,
# the bulk of a dropout's cost on a CPU. The rate is rounded to a multiple of 2^-16; `keep_scale` uses the rounded
# one, so the expectation is exact.
DROPOUT_LEVELS = 1 << 16
VALUES_PER_HASH = 4


def dropout_seed(key: jax.Array) -> jax.Array:
    """The `uint32[2]` Threefry key of dropout masks, from a JAX PRNG key of any implementation."""
    return jax.random.bits(key, (2,), jnp.uint32)


def hashed_levels(seed: jax.Array, hi: jax.Array, lo: jax.Array) -> jax.Array:
    """Four 16-bit random levels per counter (hi, lo): uint32 `[*hi.shape, 4]` from one Threefry hash each."""
    words = threefry_2x32(seed, jnp.concatenate([hi.ravel(), lo.ravel()]))
    y0, y1 = words[: hi.size].reshape(hi.shape), words[hi.size :].reshape(hi.shape)
    return jnp.stack([y0 & 0xFFFF, y0 >> 16, y1 & 0xFFFF, y1 >> 16], axis=-1)


def keep_threshold(rate: float) -> int:
    """The smallest level a kept value has: the rate rounded to a multiple of 1 / DROPOUT_LEVELS."""
    return round(rate * DROPOUT_LEVELS)


def keep_scale(rate: float) -> float:
    """1 / the probability of keeping a value (the rate as `keep_threshold` rounds it)."""
    return DROPOUT_LEVELS / (DROPOUT_LEVELS - keep_threshold(rate))


def dropout_keep_mask(seed: jax.Array, rate: float, shape: tuple[int, ...]) -> jax.Array:
    """Which values of a tensor of `shape` dropout keeps, bool: value i (row-major) has the level
    `VALUES_PER_HASH · (i // 4) + i % 4` of the hashes of counters (0, i // 4)."""
    size = math.prod(shape)
    groups = -(-size // VALUES_PER_HASH)
    if groups >= 1 << 32:
        raise ValueError(f"dropout on a tensor of shape {shape}: more than 2^34 values (the counter is 32 bits)")
    lo = jnp.arange(groups, dtype=jnp.uint32)
    levels = hashed_levels(seed, jnp.zeros_like(lo), lo).reshape(-1)[:size].reshape(shape)
    return levels >= jnp.uint32(keep_threshold(rate))
