"""Numerics and shapes that the ops and their kernel backends share. It imports only jax: no backend needs a
dispatcher or another backend for a helper, so the imports form no circle (tests/kernels/test_import_graph.py).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

# Linear attention's denominator

EPS_MODES = ("add", "guard")


def check_eps_mode(eps_mode: str) -> None:
    if eps_mode not in EPS_MODES:
        raise ValueError(f"unknown linear_attention eps_mode {eps_mode!r}; valid: {', '.join(EPS_MODES)}")


def stabilise_denominator(den: jax.Array, eps: float, eps_mode: str) -> jax.Array:
    """The normaliser with ε applied by `eps_mode` (kernels/linear_attention/api.py); its derivative is 1 either way."""
    check_eps_mode(eps_mode)  # here too: the decoding step reaches it without the op's checks
    if eps_mode == "add":
        return den + eps
    return den + jnp.where(jnp.abs(den) <= eps, 2 * eps, 0.0).astype(den.dtype)


# ReLU attention's row statistics


def xlogx(a: jax.Array) -> jax.Array:
    """a log a, 0 where a ≤ 0 (the entropy regulariser's convention)."""
    return jnp.where(a > 0, a * jnp.log(jnp.where(a > 0, a, 1.0)), 0.0)


# Tiles and grids

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
        raise ValueError("these are the GPU (Triton) kernels; TPU has its own (impl mosaic_tpu)")
    return None


def tpu_interpret(interpret: bool | str):
    """What a Mosaic TPU kernel's `pl.pallas_call(interpret=...)` takes for an options' `pallas_interpret`: "tpu" is
    Pallas's TPU interpret mode — memory spaces, DMAs and semaphores simulated, two cores running the "parallel"
    grid axes, uninitialised memory read as NaN, races printed as "RACE DETECTED" — else the plain HLO interpreter
    (True) or the compiled kernel (False)."""
    if interpret != "tpu":
        return bool(interpret)
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.InterpretParams(detect_races=True, num_cores_or_threads=2)


# Dropout's random bits

# A value is kept when its 16 random bits are ≥ round(rate · 2^16); the rate is rounded to a multiple of 2^-16 and
# `keep_scale` uses the rounded one, so the expectation is exact. The bits: value c of a row (counter `hi`) takes
# quarter c % 4 of the Threefry hash of (hi, c // 4), so one hash decides four values, where
# `jax.random.bernoulli` spends one on each. Where the mask is formed and used in one place, each value computes its
# own hash (`dropout_levels`): four times the hashing, but elementwise, so XLA fuses it into the masked product
# instead of writing the hashes out and interleaving their quarters — on a CPU the masked key tile of the blocked
# softmax (B4 H8, 2,001 rows, 256 keys) 78 → 36 ms, the product alone 14 ms. Inside a loop the decisions can be
# formed one iteration ahead, one hash for four, packed four to a byte (`dropout_keep_bits`) and carried: XLA
# cannot fuse across the iterations, so the next one reads the bytes rather than hashing each value again
# (kernels/softmax_attention.py); `dropout_keep_mask` makes such a loop of two iterations for a mask that several
# operations read.
DROPOUT_LEVELS = 1 << 16
VALUES_PER_HASH = 4
_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def dropout_seed(key: jax.Array) -> jax.Array:
    """The `uint32[2]` Threefry key of dropout masks, from a JAX PRNG key of any implementation."""
    return jax.random.bits(key, (2,), jnp.uint32)


@jax.jit  # one program where it is called outside jit (the rounds are ~100 operations); inlined inside jit
def threefry_2x32_pair(key: jax.Array, x0: jax.Array, x1: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32, 20 rounds (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3"), of the counter
    pairs (x0, x1), uint32 arrays of any broadcastable shapes; `key`: uint32[2]. The hash of
    `jax.extend.random.threefry_2x32` (which takes the pairs as one array's halves), written elementwise so that
    it fuses into its consumer (tests/kernels/test_dropout_bits.py checks the two agree)."""
    k0, k1 = key[0], key[1]
    schedule = (k0, k1, k0 ^ k1 ^ jnp.uint32(0x1BD11BDA))
    x0, x1 = x0 + k0, x1 + k1
    for i in range(5):  # 5 × 4 rounds, the key injected after each four
        for r in _THREEFRY_ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = ((x1 << jnp.uint32(r)) | (x1 >> jnp.uint32(32 - r))) ^ x0
        x0 = x0 + schedule[(i + 1) % 3]
        x1 = x1 + schedule[(i + 2) % 3] + jnp.uint32(i + 1)
    return x0, x1


def dropout_levels(seed: jax.Array, hi: jax.Array, group: jax.Array, quarter: jax.Array) -> jax.Array:
    """The 16-bit random level of each value: quarter `quarter` (0 … 3) of the Threefry hash of (hi, group); uint32
    arrays of broadcastable shapes."""
    y0, y1 = threefry_2x32_pair(seed, hi, group)
    word = jnp.where(quarter < 2, y0, y1)
    return jnp.where((quarter & 1) == 0, word & 0xFFFF, word >> 16)


def dropout_keep_bits(seed: jax.Array, rate: float, hi: jax.Array, group: jax.Array) -> jax.Array:
    """The keep decisions of the four values hashed from (hi, group), packed into a uint8: bit i is quarter i's
    (`dropout_levels(seed, hi, group, i) >= keep_threshold(rate)`). One hash for four decisions, where the
    elementwise form computes it for each; `unpack_keep_bits` reads them back."""
    y0, y1 = threefry_2x32_pair(seed, hi, group)
    threshold = jnp.uint32(keep_threshold(rate))
    bits = jnp.zeros(y0.shape, jnp.uint8)
    for i, level in enumerate((y0 & 0xFFFF, y0 >> 16, y1 & 0xFFFF, y1 >> 16)):  # dropout_levels' quarters
        bits = bits | ((level >= threshold).astype(jnp.uint8) << i)
    return bits


def unpack_keep_bits(bits: jax.Array) -> jax.Array:
    """bool `[..., 4n]` from `dropout_keep_bits`' uint8 `[..., n]`: value c is bit c % 4 of byte c // 4."""
    keep = ((bits[..., None] >> jnp.arange(VALUES_PER_HASH, dtype=jnp.uint8)) & 1) != 0
    return keep.reshape(*bits.shape[:-1], bits.shape[-1] * VALUES_PER_HASH)


def keep_threshold(rate: float) -> int:
    """The smallest level a kept value has: the rate rounded to a multiple of 1 / DROPOUT_LEVELS."""
    return round(rate * DROPOUT_LEVELS)


def keep_scale(rate: float) -> float:
    """1 / the probability of keeping a value (the rate as `keep_threshold` rounds it)."""
    return DROPOUT_LEVELS / (DROPOUT_LEVELS - keep_threshold(rate))


def dropout_keep_mask(seed: jax.Array, rate: float, shape: tuple[int, ...]) -> jax.Array:
    """Which values of a tensor of `shape` dropout keeps, bool: value i (row-major) has quarter i % 4 of the hash
    of (0, i // 4). Where the last axis is a multiple of 8, the decisions are formed once, packed, in a loop
    (`_packed_keep_mask`); otherwise each value hashes where it is used."""
    if shape and shape[-1] % (2 * VALUES_PER_HASH) == 0 and math.prod(shape) // VALUES_PER_HASH <= 1 << 32:
        return _packed_keep_mask(seed, rate, shape)
    group, quarter = _groups_and_quarters(shape)
    return dropout_levels(seed, jnp.uint32(0), group, quarter) >= jnp.uint32(keep_threshold(rate))


def _packed_keep_mask(seed: jax.Array, rate: float, shape: tuple[int, ...]) -> jax.Array:
    """`dropout_keep_mask` with one hash per four values, written packed by a two-iteration loop over the halves of
    the last axis (the comment above `DROPOUT_LEVELS`: why) and read back: in a train step the forward's select and
    two or three of the backward's products would each hash every value again (a [4, 2000, 1024] float32 tensor on
    a 2-core CPU: dropout's forward+backward 18 → 5 ms over the unmasked computation)."""
    *lead, last = shape
    width = last // (2 * VALUES_PER_HASH)  # bytes of a row in each half
    half_shape = (*lead, width)

    def half(_, h):
        row = _row_major_index(tuple(lead), half_shape)
        column = lax.broadcasted_iota(jnp.uint32, half_shape, len(lead))
        group = row * jnp.uint32(last // VALUES_PER_HASH) + h.astype(jnp.uint32) * jnp.uint32(width) + column
        return None, dropout_keep_bits(seed, rate, jnp.uint32(0), group)

    _, bits = lax.scan(half, None, jnp.arange(2))  # [2, *lead, width]
    return unpack_keep_bits(jnp.moveaxis(bits, 0, -2).reshape(*lead, 2 * width))


def _groups_and_quarters(shape: tuple[int, ...], *, index_limit: int = 1 << 32) -> tuple[jax.Array, jax.Array]:
    """(i // 4, i % 4) for each value's row-major index i, uint32 `shape`. Past 2^32 values (`index_limit`) i does
    not fit 32 bits: the parts are formed from the row over the leading axes and the column, which needs a last
    axis that is a multiple of 4."""
    size = math.prod(shape)
    if size <= index_limit:
        index = _row_major_index(shape, shape)
        return index >> 2, index & 3
    if -(-size // VALUES_PER_HASH) > 1 << 32 or shape[-1] % VALUES_PER_HASH:
        raise ValueError(
            f"dropout on a tensor of shape {shape}: {size:,} values need a last axis that is a multiple of "
            f"{VALUES_PER_HASH} and at most 2^34 values (the hash's counter is 32 bits)"
        )
    row = _row_major_index(shape[:-1], shape)
    column = lax.broadcasted_iota(jnp.uint32, shape, len(shape) - 1)
    return row * jnp.uint32(shape[-1] // VALUES_PER_HASH) + (column >> 2), column & 3


def _row_major_index(axes: tuple[int, ...], shape: tuple[int, ...]) -> jax.Array:
    """The row-major index over the leading `axes` of `shape`, broadcast over the rest: uint32 `shape`."""
    index = jnp.zeros(shape, jnp.uint32)
    for axis in range(len(axes)):
        # Below 2^32 but for an axis of length 1 (index 0 along it), which may precede 2^32 values.
        stride = math.prod(axes[axis + 1 :]) % (1 << 32)
        index = index + lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride)
    return index
