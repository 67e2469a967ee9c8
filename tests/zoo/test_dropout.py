"""zoo.layers.Dropout: nnx.Dropout's interface with masks from hashed 16-bit levels (kernels.numerics)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kernels.numerics import DROPOUT_LEVELS, dropout_keep_mask, dropout_seed, keep_scale
from zoo.layers import Dropout


def _keep(rate, shape, key=0):
    return np.asarray(dropout_keep_mask(dropout_seed(jax.random.key(key)), rate, shape))


def test_the_keep_rate_is_the_rounded_rate_at_every_position_of_a_hash():
    rate, shape = 0.1, (1000, 1000)
    keep = _keep(rate, shape).reshape(-1, 4)  # the four values of one hash per row
    p = 1 - round(rate * DROPOUT_LEVELS) / DROPOUT_LEVELS
    sigma = np.sqrt(p * (1 - p) / keep.shape[0])
    np.testing.assert_allclose(keep.mean(axis=0), p, atol=5 * sigma)  # each 16-bit quarter of the 64 bits


def test_values_that_share_a_hash_are_uncorrelated():
    keep = _keep(0.5, (4 * 250_000,)).reshape(-1, 4).astype(np.float64)
    bound = 5 / np.sqrt(keep.shape[0])  # 5 standard errors of a correlation coefficient
    for a, b in ((0, 1), (1, 2), (2, 3), (0, 3)):  # same word, across the two words
        assert abs(np.corrcoef(keep[:, a], keep[:, b])[0, 1]) < bound, (a, b)
    # and neighbouring hashes
    assert abs(np.corrcoef(keep[:-1, 3], keep[1:, 0])[0, 1]) < bound


def test_a_values_mask_depends_on_its_index_only():
    long, short = _keep(0.3, (1003,)), _keep(0.3, (997,))
    np.testing.assert_array_equal(long[:997], short)
    np.testing.assert_array_equal(_keep(0.3, (17, 59)).ravel(), _keep(0.3, (17 * 59,)))
    assert not np.array_equal(_keep(0.3, (997,), key=1), short)


class DropoutTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_kept_values_are_scaled_so_the_expectation_is_exact_and_the_gradient_is_the_mask(self):
        rate = 0.3
        x = jax.random.normal(jax.random.key(1), (64, 33, 40))
        layer = Dropout(rate)

        @self.variant
        def apply(x, key):
            return layer(x, rngs=key)

        key = jax.random.key(7)
        y = apply(x, key)
        keep = dropout_keep_mask(dropout_seed(key), rate, x.shape)
        chex.assert_trees_all_close(y, jnp.where(keep, x * keep_scale(rate), 0.0))
        grad = self.variant(jax.grad(lambda x, key: layer(x, rngs=key).sum()))(x, key)
        chex.assert_trees_all_close(grad, jnp.where(keep, keep_scale(rate), 0.0))
        ones = apply(jnp.ones((400, 1000)), key)
        assert abs(float(ones.mean()) - 1.0) < 5 * np.sqrt(rate / (1 - rate) / ones.size)

    def test_keys_come_from_the_dropout_stream_as_nnx_dropout_draws_them(self):
        x = jnp.ones((8, 100))
        from_rngs = Dropout(0.5)(x, rngs=nnx.Rngs(dropout=3))
        from_key = Dropout(0.5)(x, rngs=nnx.Rngs(dropout=3).dropout())
        chex.assert_trees_all_equal(from_rngs, from_key)
        stream = nnx.Rngs(dropout=3)
        layer = Dropout(0.5)
        assert not np.array_equal(layer(x, rngs=stream), layer(x, rngs=stream))  # the stream advances
        own = Dropout(0.5, rngs=nnx.Rngs(dropout=3))  # a stream of its own, as nnx.Dropout keeps one
        assert not np.array_equal(own(x), own(x))

    def test_eval_rate_zero_and_low_precision(self):
        x = jax.random.normal(jax.random.key(0), (4, 16), jnp.bfloat16)
        layer = Dropout(0.2)
        assert layer(x, rngs=nnx.Rngs(dropout=0)).dtype == jnp.bfloat16
        layer.eval()
        chex.assert_trees_all_equal(layer(x), x)
        chex.assert_trees_all_equal(Dropout(0.0)(x, rngs=nnx.Rngs(dropout=0)), x)

    def test_training_without_rngs_is_an_error_naming_the_stream(self):
        with pytest.raises(ValueError, match="'dropout' stream"):
            Dropout(0.1)(jnp.ones((2, 4)))


def test_a_dropout_stream_given_at_build_is_used_at_call_and_changes_no_parameter():
    """A model built with `nnx.Rngs(0, dropout=1)` trains without rngs at each call; its parameters equal those
    built with `nnx.Rngs(0)`, which still asks for rngs at the call and says how to avoid it."""
    from zoo import mixers

    cfg = mixers.default_config("softmax")
    cfg.update(d_model=16, num_heads=2, max_length=8, attention_dropout=0.5)
    x = jax.random.normal(jax.random.key(0), (2, 8, 16))
    with_stream = mixers.build(cfg, rngs=nnx.Rngs(0, dropout=1))
    without = mixers.build(cfg, rngs=nnx.Rngs(0))
    chex.assert_trees_all_equal(nnx.state(with_stream, nnx.Param), nnx.state(without, nnx.Param))
    first, second = with_stream(x), with_stream(x)  # the stored stream advances: two different masks
    assert first.shape == x.shape and not jnp.allclose(first, second)
    with pytest.raises(ValueError, match=r"or build the model with nnx.Rngs\(\.\.\., dropout=SEED\)"):
        without(x)
    chex.assert_trees_all_close(without(x, rngs=nnx.Rngs(dropout=3)), with_stream(x, rngs=nnx.Rngs(dropout=3)))
