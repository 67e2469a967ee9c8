"""Dropout's random bits (kernels/numerics.py): the elementwise Threefry is JAX's, each value takes the quarter of
its group's hash that the scheme assigns it, the packed decisions are the same bits and are hashed once for every
use, and the masks of tensors past 2^32 values are the same function."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry_2x32

from kernels import numerics


@pytest.mark.parametrize("seed", [0, 7])
def test_the_elementwise_threefry_is_jaxs(seed):
    key = jax.random.bits(jax.random.key(seed), (2,), jnp.uint32)
    x0, x1 = jax.random.bits(jax.random.key(seed + 1), (2, 1000), jnp.uint32)
    words = threefry_2x32(key, jnp.concatenate([x0, x1]))
    y0, y1 = numerics.threefry_2x32_pair(key, x0, x1)
    chex.assert_trees_all_equal((y0, y1), (words[:1000], words[1000:]))
    # Broadcast counters, as the ops pass them (a row number against a row of columns).
    y0, _ = numerics.threefry_2x32_pair(key, x0[:3, None], x1[None, :5])
    expected = threefry_2x32(key, jnp.concatenate([jnp.repeat(x0[:3], 5), jnp.tile(x1[:5], 3)]))[:15]
    chex.assert_trees_all_equal(y0, expected.reshape(3, 5))


def _quarters_of_the_hashes(seed, shape):
    """The scheme as it reads: hash each group (0, i // 4) once, lay its four 16-bit quarters side by side."""
    size = int(np.prod(shape))
    groups = -(-size // 4)
    counters = jnp.arange(groups, dtype=jnp.uint32)
    words = np.asarray(threefry_2x32(seed, jnp.concatenate([jnp.zeros_like(counters), counters])))
    y0, y1 = words[:groups], words[groups:]
    levels = np.stack([y0 & 0xFFFF, y0 >> 16, y1 & 0xFFFF, y1 >> 16], axis=-1).reshape(-1)
    return levels[:size].reshape(shape)


# Last axes of 8, 16 and 24 take the packed loop; 5 and 13 hash each value where it is used.
@pytest.mark.parametrize("shape", [(3, 7, 5), (2, 8), (13,), (3, 5, 16), (24,)])
def test_each_value_takes_its_quarter_of_its_groups_hash(shape):
    seed = numerics.dropout_seed(jax.random.key(2))
    levels = _quarters_of_the_hashes(seed, shape)
    rate = 0.3
    keep = numerics.dropout_keep_mask(seed, rate, shape)
    np.testing.assert_array_equal(np.asarray(keep), levels >= numerics.keep_threshold(rate))


def test_past_2_32_values_the_groups_come_from_rows_and_columns_and_match_the_flat_index():
    shape = (3, 5, 8)
    flat = numerics._groups_and_quarters(shape)
    split = numerics._groups_and_quarters(shape, index_limit=16)  # as a tensor of more than 2^32 values is
    chex.assert_trees_all_equal(split, flat)
    with pytest.raises(ValueError, match=r"shape \(3, 5, 6\): 90 values need a last axis that is a multiple of 4"):
        numerics._groups_and_quarters((3, 5, 6), index_limit=16)
    with pytest.raises(ValueError, match=r"at most 2\^34 values"):
        numerics._groups_and_quarters((1 << 33, 4))
    # 2^32 values behind an axis of length 1 (the packed loop), and 2^34 in rows of 4: traced, not allocated.
    mask = jax.eval_shape(lambda: numerics.dropout_keep_mask(jnp.zeros(2, jnp.uint32), 0.1, (1, 1 << 32)))
    assert mask.shape == (1, 1 << 32) and mask.dtype == jnp.bool_
    for shape in [(1, 1 << 32), (1, 1 << 32, 4)]:
        groups, _ = jax.eval_shape(lambda shape=shape: numerics._groups_and_quarters(shape))
        assert groups.shape == shape and groups.dtype == jnp.uint32


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_packed_decisions_are_the_quarters_bits_and_unpack_to_the_elementwise_mask(rate):
    seed = numerics.dropout_seed(jax.random.key(5))
    shape = (6, 40)  # 6 rows of 10 groups (hash counter 0, group i // 4 of the row-major index)
    bits = numerics.dropout_keep_bits(seed, rate, jnp.uint32(0), jnp.arange(60, dtype=jnp.uint32).reshape(6, 10))
    assert bits.dtype == jnp.uint8 and bits.shape == (6, 10) and int(bits.max()) < 16
    levels = _quarters_of_the_hashes(seed, shape)
    expected = levels >= numerics.keep_threshold(rate)
    np.testing.assert_array_equal(np.asarray(numerics.unpack_keep_bits(bits)), expected)
    np.testing.assert_array_equal(np.asarray(numerics.dropout_keep_mask(seed, rate, shape)), expected)


def _hashing_computations(fn, *args) -> int:
    """How many computations of `fn`'s optimised program hash arrays: rotate uint32 arrays (a shift-left of a
    non-scalar u32) — one per fusion XLA put the Threefry rounds in."""
    hlo = jax.jit(fn).lower(*args).compile().as_text()
    computations = hlo.split("\n\n")
    return sum(bool(re.search(r"u32\[\d[^\]]*\][^\n]*shift-left\(", c)) for c in computations)


def test_a_masked_products_forward_and_backward_hash_once_with_the_packed_mask():
    # XLA fuses an elementwise hash into every operation that reads the mask (the forward's select, the backward's
    # products); the packed mask's loop keeps the hashing in one place, which is what makes it cheaper.
    seed = jnp.array([1, 2], jnp.uint32)

    def grad_of_masked_product(last):
        w = jnp.ones((last, 32))

        def loss(x, seed):
            keep = numerics.dropout_keep_mask(seed, 0.1, x.shape)
            h = jnp.where(keep, jax.nn.gelu(x) * 1.1, 0.0)
            return jnp.sum((h @ w) ** 2)

        return _hashing_computations(jax.grad(loss), jnp.ones((4, 16, last)), seed)

    assert grad_of_masked_product(64) == 1  # the packed loop's body
    assert grad_of_masked_product(63) > 1  # hashed where used: in the forward and again in the backward
