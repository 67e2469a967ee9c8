"""kernels.softmax_attention: the blocked XLA softmax and JAX's dense one agree with the reference, outputs and
gradients; padded and future keys cannot matter; the causal tiling skips the upper triangle; bad options and
inputs are errors that name them."""

import importlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

import kernels
from kernels import SoftmaxAttentionOptions, auto, platforms
from kernels.numerics import dropout_seed, unpack_keep_bits
from tests.kernels.tolerances import assert_bf16_matches_reference, bound, fp32

OP = importlib.import_module("kernels.softmax_attention.reference")  # dropout's keep masks


def _inputs(b=2, t=37, h=3, d=16, dtype=jnp.float32, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    q, k, v = (jax.random.normal(key, (b, t, h, d)).astype(dtype) for key in (kq, kk, kv))
    lengths = jnp.array([t, t // 2 + 1] + [t - 3] * (b - 2))[:b]
    return q, k, v, jnp.arange(t)[None] < lengths[:, None]


def _attend(impl, causal, mask, **options):
    return lambda q, k, v: kernels.softmax_attention(
        q, k, v, causal=causal, key_mask=mask, options=SoftmaxAttentionOptions(impl=impl, **options)
    )


class SoftmaxAttentionTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(causal=[False, True], dtype=[jnp.float32, jnp.bfloat16], block=[8, 16, 64])
    def test_xla_matches_reference(self, causal, dtype, block):
        q, k, v, mask = _inputs(dtype=dtype)
        ref = _attend("reference", causal, mask)(q, k, v)
        out = self.variant(_attend("xla", causal, mask, xla_block_k=block))(q, k, v)
        chex.assert_shape(out, q.shape)
        chex.assert_type(out, dtype)
        tol = bound(dtype)
        chex.assert_trees_all_close(out.astype(jnp.float32), ref.astype(jnp.float32), atol=tol, rtol=tol)

    @parameterized.product(causal=[False, True], impl=["xla", "dense"], dtype=[jnp.float32, jnp.bfloat16])
    def test_gradients_match_reference(self, causal, impl, dtype):
        q, k, v, mask = _inputs(dtype=dtype, t=29)
        w = jax.random.normal(jax.random.key(9), q.shape)

        def loss(q, k, v, impl):
            return jnp.sum(_attend(impl, causal, mask, xla_block_k=8)(q, k, v).astype(jnp.float32) * w)

        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)
        ref = grad(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), "reference")
        for name, r, g in zip(("dq", "dk", "dv"), ref, grad(q, k, v, impl), strict=True):
            assert g.dtype == dtype, name
            err = float(jnp.max(jnp.abs(g.astype(jnp.float32) - r))) / (float(jnp.max(jnp.abs(r))) + 1e-6)
            assert err < bound(dtype, "grad"), f"{name}: relative error {err:.2e}"

    def test_reference_is_the_softmax_of_the_visible_scores(self):
        q, k, v, mask = _inputs(b=2, t=7, h=1, d=4)
        s = np.einsum("bqhd,bkhd->bhqk", q, k) / 2.0
        s = np.where(np.asarray(mask)[:, None, None, :], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        expected = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v)
        np.testing.assert_allclose(_attend("reference", False, mask)(q, k, v), expected, atol=1e-5, rtol=1e-5)

    @parameterized.parameters("reference", "xla", "dense")
    def test_padded_keys_and_values_do_not_matter(self, impl):
        q, k, v, mask = _inputs()
        attend = _attend(impl, False, mask, xla_block_k=8)
        noise = jax.random.normal(jax.random.key(5), k.shape) * 100
        pad = ~mask[:, :, None, None]
        chex.assert_trees_all_close(
            attend(q, k, v), attend(q, jnp.where(pad, noise, k), jnp.where(pad, jnp.nan, v)), atol=fp32(1e-5)
        )

    @parameterized.parameters(("xla", 8), ("xla", 64), ("dense", 8))
    def test_past_outputs_and_their_gradients_ignore_future_keys(self, impl, block):
        q, k, v, mask = _inputs(b=2, t=45)
        attend, t0 = _attend(impl, True, mask, xla_block_k=block), 20  # block 8: the tiled path; 64: one block

        def past_loss(k, v):
            return jnp.sum(jnp.sin(attend(q, k, v)[:, : t0 + 1]))

        k2, v2 = k.at[:, t0 + 1 :].multiply(-3.0), v.at[:, t0 + 1 :].add(7.0)
        chex.assert_trees_all_close(past_loss(k, v), past_loss(k2, v2), atol=fp32(1e-5))
        dk, dv = jax.grad(past_loss, argnums=(0, 1))(k, v)
        dk2, dv2 = jax.grad(past_loss, argnums=(0, 1))(k2, v2)
        past = slice(0, t0 + 1)
        chex.assert_trees_all_close((dk[:, past], dv[:, past]), (dk2[:, past], dv2[:, past]), atol=fp32(1e-5))
        assert float(jnp.abs(dk[:, t0 + 1 :]).max()) == 0.0 and float(jnp.abs(dv[:, t0 + 1 :]).max()) == 0.0
        assert not np.allclose(attend(q, k, v)[:, t0 + 1 :], attend(q, k2, v2)[:, t0 + 1 :])

    @parameterized.parameters("reference", "xla", "dense")
    def test_a_row_that_sees_no_key_is_zero_and_its_gradients_finite(self, impl):
        q, k, v, _ = _inputs(b=2, t=12)
        mask = jnp.arange(12)[None] >= jnp.array([[0], [5]])  # example 1: keys 0–4 hidden, so causal rows 0–4 see none
        attend = _attend(impl, True, mask, xla_block_k=4)
        out = attend(q, k, v)
        assert float(jnp.abs(out[1, :5]).max()) == 0.0
        assert float(jnp.abs(out[1, 5:]).min()) > 0.0
        grads = jax.grad(lambda q, k, v: jnp.sum(attend(q, k, v)), argnums=(0, 1, 2))(q, k, v)
        assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
        assert float(jnp.abs(grads[0][1, :5]).max()) == 0.0

    def test_large_scores_do_not_overflow(self):
        q, k, v, mask = _inputs(t=40)
        q = q * 300.0  # scores in the thousands: a softmax without a running maximum gives inf/NaN
        ref = _attend("reference", True, mask)(q, k, v)
        out = _attend("xla", True, mask, xla_block_k=8)(q, k, v)
        assert bool(jnp.all(jnp.isfinite(out)))
        chex.assert_trees_all_close(out, ref, atol=fp32(1e-4))

    def test_block_causal_xla_does_about_half_the_work_of_the_full_square(self):
        q, k, v, mask = _inputs(b=1, t=512, h=2, d=32)

        def counted(block):
            def loss(q, k, v):
                return jnp.sum(_attend("xla", True, mask, xla_block_k=block)(q, k, v))

            analysis = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile().cost_analysis()
            return (analysis[0] if isinstance(analysis, list) else analysis)["flops"]

        ratio = counted(64) / counted(512)  # 8 blocks: 36 of 64 tiles; one block: the whole square, masked
        assert 0.4 < ratio < 36 / 64 + 0.05, ratio

    def test_cross_attention_with_other_lengths(self):
        q, _, _, _ = _inputs(t=9)
        _, k, v, mask = _inputs(t=23, seed=1)
        ref = _attend("reference", False, mask)(q, k, v)
        for impl in ("xla", "dense"):
            chex.assert_trees_all_close(_attend(impl, False, mask, xla_block_k=8)(q, k, v), ref, atol=fp32(1e-5))


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(impl="flash"), r"SoftmaxAttentionOptions.impl: unknown softmax impl 'flash'; valid: auto, reference"),
        (dict(xla_block_k=0), r"SoftmaxAttentionOptions.xla_block_k: must be a positive whole number or None, got 0"),
        (dict(splash_block_sizes=kernels.TpuBlockSizes()), r"splash_block_sizes: TpuBlockSizes are not Splash"),
        (dict(pallas_interpret="yes"), r"pallas_interpret: must be True, False or None"),
    ],
)
def test_bad_options_name_the_field(options, message):
    with pytest.raises(ValueError, match=message):
        SoftmaxAttentionOptions(**options)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda q, k, v, m: (q[0], k, v, m), r"q, k, v must be \[batch, length, heads, head_dim\]"),
        (lambda q, k, v, m: (q, k[..., :8], v, m), r"k shape .* does not match q shape"),
        (lambda q, k, v, m: (q, k, v[:, :5], m), r"v shape .* does not match k shape"),
        (lambda q, k, v, m: (q, k, v, m.astype(jnp.int32)), r"key_mask must be a bool array"),
        (lambda q, k, v, m: (q, k, v, m[:, :5]), r"key_mask shape \(2, 5\) must be \[batch, key_length\]"),
        (lambda q, k, v, m: (q.astype(jnp.int32), k, v, m), r"q must be a floating-point array"),
    ],
)
def test_bad_inputs_name_the_argument(change, message):
    q, k, v, mask = change(*_inputs())
    with pytest.raises(ValueError, match=message):
        kernels.softmax_attention(q, k, v, key_mask=mask)


def test_causal_cross_attention_and_cudnn_in_float32_are_refused():
    q, k, v, _ = _inputs()
    with pytest.raises(ValueError, match="causal attention needs equal query and key lengths, got 10 and 37"):
        kernels.softmax_attention(q[:, :10], k, v, causal=True)
    with pytest.raises(ValueError, match="softmax impl 'cudnn': cuDNN flash attention is bfloat16/float16 only"):
        kernels.softmax_attention(q, k, v, options=SoftmaxAttentionOptions(impl="cudnn"))


@pytest.mark.parametrize("causal", [False, True])
def test_key_lengths_that_the_cudnn_path_passes_equal_the_trailing_padding_mask(causal):
    """cuDNN takes the key mask as per-example lengths: checked through XLA's own support for key lengths."""
    q, k, v, mask = _inputs(b=3, t=24)
    mask = jnp.arange(24)[None] < jnp.array([[24], [17], [1]])
    lengths = jnp.sum(mask, axis=-1, dtype=jnp.int32)
    by_lengths = jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths, is_causal=causal)
    chex.assert_trees_all_close(by_lengths, _attend("reference", causal, mask)(q, k, v), atol=fp32(1e-5))


@pytest.mark.parametrize("impl", ["cudnn", "auto"])
@pytest.mark.parametrize("causal", [False, True])
def test_cudnn_matches_the_reference_where_it_runs(causal, impl):
    """cuDNN flash attention, which "auto" picks on a GPU: there, outputs and gradients against the fp32 reference,
    padded keys included. Anywhere else cuDNN is absent, "cudnn" says so and "auto" does not pick it."""
    q, k, v, mask = _inputs(b=2, t=256, h=4, d=128, dtype=jnp.bfloat16, seed=3)

    def loss(q, k, v, impl):
        out = _attend(impl, causal, mask)(q, k, v)
        return jnp.sum(jnp.where(mask[:, :, None, None], out.astype(jnp.float32), 0) ** 2), out

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True), static_argnums=3)
    if jax.default_backend() != "gpu":
        assert SoftmaxAttentionOptions(impl="auto").plan(q, k, causal=causal) == "xla"
        if impl == "cudnn":
            with pytest.raises(Exception, match="cuDNN"):
                grad(q, k, v, impl)
        return
    expected = "cudnn" if auto.passed("softmax_attention", "cudnn", platforms.device_class()) else "xla"
    assert SoftmaxAttentionOptions(impl="auto").plan(q, k, causal=causal) == expected
    (_, out), grads = grad(q, k, v, impl)
    (_, ref), ref_grads = grad(*(x.astype(jnp.float32) for x in (q, k, v)), "reference")
    assert_bf16_matches_reference(out, ref, grads, ref_grads, mask[:, :, None, None])


class DropoutTest(parameterized.TestCase):
    """Dropout on the weights inside the blocked softmax: the reference's mask, whatever the blocks."""

    # A block of 6 splits the mask's groups of four weights between blocks, so each weight is hashed where it is
    # used; blocks of 8 and 64 carry each next block's packed decisions through the non-causal key loop.
    @parameterized.product(causal=[False, True], block=[6, 8, 64])
    def test_xla_with_dropout_matches_reference_with_the_same_mask(self, causal, block):
        q, k, v, mask = _inputs(t=45)
        w = jax.random.normal(jax.random.key(9), q.shape)
        key = jax.random.key(11)

        def loss(q, k, v, impl):
            options = SoftmaxAttentionOptions(impl=impl, xla_block_k=block)
            out = kernels.softmax_attention(
                q, k, v, causal=causal, key_mask=mask, dropout_rate=0.3, dropout_key=key, options=options
            )
            return jnp.sum(out * w), out

        grad = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)
        (_, ref), ref_grads = grad(q, k, v, "reference")
        (_, out), grads = jax.jit(grad, static_argnums=3)(q, k, v, "xla")
        chex.assert_trees_all_close(out, ref, atol=fp32(2e-6))
        chex.assert_trees_all_close(grads, ref_grads, atol=fp32(1e-5))
        plain = _attend("reference", causal, mask)(q, k, v)
        assert float(jnp.max(jnp.abs(out - plain))) > 0.1  # weights really dropped

    def test_the_mask_keeps_one_minus_the_rate_and_does_not_depend_on_the_blocks(self):
        seed = dropout_seed(jax.random.key(3))
        keep_mask = OP.keep_mask
        full = keep_mask(seed, 0.1, 8, 512, 4, jnp.arange(512), 0, 512)
        assert abs(float(full.mean()) - 0.9) < 0.002  # 8.4M weights
        tile = keep_mask(seed, 0.1, 8, 512, 4, 128 + jnp.arange(64), 256, 32)
        assert bool(jnp.all(tile == full[:, :, 128:192, 256:288]))
        other = keep_mask(dropout_seed(jax.random.key(4)), 0.1, 8, 512, 4,
                          jnp.arange(512), 0, 512)  # fmt: skip
        assert 0.15 < float(jnp.mean(full != other)) < 0.2  # another key: another mask (2·0.1·0.9 = 0.18 differ)
        # The key loop's packed decisions, carried from the iteration before: the same weights.
        packed = OP.keep_bits(seed, 0.1, 8, 512, 4, 128 + jnp.arange(64), 256, 32)
        assert packed.shape == (4, 8, 64, 8) and bool(jnp.all(unpack_keep_bits(packed) == tile))

    def test_rate_one_drops_everything_and_rate_zero_nothing(self):
        q, k, v, mask = _inputs()
        key = jax.random.key(0)
        assert float(jnp.abs(kernels.softmax_attention(q, k, v, dropout_rate=1.0, dropout_key=key)).max()) == 0.0
        chex.assert_trees_all_close(
            kernels.softmax_attention(q, k, v, key_mask=mask, dropout_rate=0.0, dropout_key=key),
            _attend("xla", False, mask)(q, k, v),
        )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dropout_rate=1.5), r"dropout_rate must be a number in \[0, 1\], got 1.5"),
        (dict(dropout_rate=0.1), r"dropout_rate=0.1 needs a dropout_key"),
        (dict(dropout_rate=0.1, dropout_key=jax.random.key(0), options=SoftmaxAttentionOptions(impl="dense")),
         r"softmax impl 'dense' takes no dropout on the weights"),
    ],
)  # fmt: skip
def test_bad_dropout_settings_name_the_argument(kwargs, message):
    q, k, v, _ = _inputs()
    with pytest.raises(ValueError, match=message):
        kernels.softmax_attention(q, k, v, **kwargs)


def test_long_causal_inputs_keep_the_lower_triangle_with_longer_blocks():
    from kernels.blocking import MAX_CAUSAL_BLOCKS, block_causal, causal_block_k

    q = jnp.zeros((1, 8192, 1, 8))
    grown = causal_block_k(q, q, True, 128)  # 64 blocks of 128 would be too many to unroll
    assert grown == 256 and block_causal(q, q, True, grown) and 8192 // grown == MAX_CAUSAL_BLOCKS
    assert causal_block_k(q, q, False, 128) == 128 and causal_block_k(q[:, :100], q, True, 128) == 128
    assert causal_block_k(q[:, :1000], q[:, :1000], True, 16) == 32  # ⌈1000 / 32⌉ = 32, a multiple of 8


@pytest.mark.parametrize("causal", [False, True])
def test_a_nan_input_reaches_the_same_outputs_as_in_the_reference(causal):
    """A NaN in a query poisons its row, one in a visible key every row that sees it: never a silent 0."""
    q, k, v, mask = _inputs(t=21)
    q, k = q.at[0, 3, 1, 0].set(jnp.nan), k.at[1, 5, 2, 0].set(jnp.nan)
    ref = np.isnan(np.asarray(_attend("reference", causal, mask)(q, k, v)))
    assert ref.any()
    for impl in ("xla", "dense"):
        out = np.asarray(_attend(impl, causal, mask, xla_block_k=8)(q, k, v))
        np.testing.assert_array_equal(np.isnan(out), ref, err_msg=impl)
