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
