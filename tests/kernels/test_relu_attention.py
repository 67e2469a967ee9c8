"""kernels.relu_attention: every impl agrees with the reference; the variance-reduction factor works."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

import kernels
from kernels import ReluAttentionOptions
from tests.kernels.tolerances import bound, fp32


def _inputs(b=2, t=37, h=3, d=16, dtype=jnp.float32, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    q, k, v = (jax.random.normal(key, (b, t, h, d)).astype(dtype) for key in (kq, kk, kv))
    lengths = jnp.array([t, t // 2 + 1] + [t - 3] * (b - 2))[:b]
    mask = jnp.arange(t)[None] < lengths[:, None]
    return q, k, v, mask


XLA = ReluAttentionOptions(impl="xla")


def _numpy_relu_attention(q, k, v, mask, gamma, causal, row_scale):
    """The module docstring's formulas, written out in float64 numpy, one query row at a time."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, t, h, d = q.shape
    gamma = np.broadcast_to(np.asarray(gamma, np.float64).reshape(-1), (h,))
    out = np.zeros_like(v)
    for n in range(b):
        for i in range(t):
            visible = np.asarray(mask[n]) & ((np.arange(t) <= i) if causal else True)
            count = max(1, int(visible.sum()))
            r = {"sqrt_half": np.sqrt(count / 2), "count": count, "none": 1.0}[row_scale]
            for head in range(h):
                scores = k[n, :, head] @ q[n, i, head] / np.sqrt(d)
                weights = np.where(visible, np.maximum(scores, 0.0), 0.0) / (gamma[head] * r)
                out[n, i, head] = weights @ v[n, :, head]
    return out


@pytest.mark.parametrize("row_scale", ["sqrt_half", "count", "none"])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_is_the_definition_written_out(row_scale, causal):
    # Every impl is tested against "reference"; this pins the reference itself (the row factor, γ per head, the
    # visible-key count under the key mask and causality) to the formulas, computed independently.
    q, k, v, mask = _inputs(b=3, t=13, h=3, d=8)
    gamma = jnp.array([1.0, 0.5, 2.0])
    options = ReluAttentionOptions(impl="reference")
    out = kernels.relu_attention(q, k, v, causal=causal, key_mask=mask, gamma=gamma, row_scale=row_scale,
                                 options=options)  # fmt: skip
    expected = _numpy_relu_attention(q, k, v, np.asarray(mask), gamma, causal, row_scale)
    np.testing.assert_allclose(np.asarray(out, np.float64), expected, rtol=2e-5, atol=2e-6)


TOLS = {dtype: dict(atol=bound(dtype), rtol=bound(dtype)) for dtype in (jnp.float32, jnp.bfloat16)}


class ReluAttentionTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(causal=[False, True], dtype=[jnp.float32, jnp.bfloat16], block=[8, 16, 64])
    def test_xla_matches_reference(self, causal, dtype, block):
        q, k, v, mask = _inputs(dtype=dtype)
        gamma = jnp.array([1.0, 0.5, 2.0])

        def run(impl):
            @self.variant
            def attend(q, k, v, mask):
                options = ReluAttentionOptions(impl=impl, xla_block_k=block)
                return kernels.relu_attention(q, k, v, causal=causal, key_mask=mask, gamma=gamma, options=options)

            return attend(q, k, v, mask)

        ref, out = run("reference"), run("xla")
        chex.assert_shape(out, q.shape)
        chex.assert_type(out, dtype)
        # bf16 inputs: compare against the fp32 definition evaluated on the same (rounded) inputs.
        chex.assert_trees_all_close(out.astype(jnp.float32), ref.astype(jnp.float32), **TOLS[dtype])

    @parameterized.product(causal=[False, True], dtype=[jnp.float32, jnp.bfloat16], gamma_kind=["heads", "scalar"])
    def test_gradients_match_reference(self, causal, dtype, gamma_kind):
        q, k, v, mask = _inputs(dtype=dtype, t=29)
        gamma = jnp.array([1.0, 0.7, 1.6]) if gamma_kind == "heads" else jnp.array(1.3)
        w = jax.random.normal(jax.random.key(9), q.shape)

        def loss(q, k, v, gamma, impl):
            options = ReluAttentionOptions(impl=impl, xla_block_k=8)
            out = kernels.relu_attention(q, k, v, causal=causal, key_mask=mask, gamma=gamma, options=options)
            return jnp.sum(out.astype(jnp.float32) * w)

        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)), static_argnums=4)
        ref = grad(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), gamma, "reference")
        got = grad(q, k, v, gamma, "xla")
        for name, r, g in zip(("dq", "dk", "dv", "dgamma"), ref, got, strict=True):
            assert g.dtype == (dtype if name != "dgamma" else jnp.float32), name
            scale = float(jnp.max(jnp.abs(r))) + 1e-6
            tol = bound(dtype, "grad")
            err = float(jnp.max(jnp.abs(g.astype(jnp.float32) - r))) / scale
            assert err < tol, f"{name}: relative error {err:.2e} > {tol}"

    def test_padded_keys_and_values_do_not_matter(self):
        q, k, v, mask = _inputs()
        blocks_of_8 = ReluAttentionOptions(impl="xla", xla_block_k=8)
        out = kernels.relu_attention(q, k, v, key_mask=mask, options=blocks_of_8)
        noise = jax.random.normal(jax.random.key(5), k.shape) * 100
        pad = ~mask[:, :, None, None]
        out2 = kernels.relu_attention(
            q,
            jnp.where(pad, noise, k),
            jnp.where(pad, noise, v),
            key_mask=mask,
            options=blocks_of_8,
        )
        real = mask[:, :, None, None]
        chex.assert_trees_all_close(jnp.where(real, out, 0), jnp.where(real, out2, 0), atol=fp32(1e-5))

    @parameterized.parameters("reference", "xla")
    def test_causal_cannot_see_the_future(self, impl):
        q, k, v, _ = _inputs(b=1, t=24)
        out = kernels.relu_attention(q, k, v, causal=True, options=ReluAttentionOptions(impl=impl))
        t0 = 10
        k2 = k.at[:, t0 + 1 :].add(5.0)
        v2 = v.at[:, t0 + 1 :].add(5.0)
        out2 = kernels.relu_attention(q, k2, v2, causal=True, options=ReluAttentionOptions(impl=impl))
        chex.assert_trees_all_close(out[:, : t0 + 1], out2[:, : t0 + 1], atol=fp32(1e-6))
        assert not np.allclose(out[:, t0 + 1 :], out2[:, t0 + 1 :])

    def test_block_causal_xla_past_outputs_and_their_gradients_ignore_future_keys(self):
        q, k, v, mask = _inputs(b=2, t=45)
        blocks = ReluAttentionOptions(impl="xla", xla_block_k=8)  # 6 key blocks: the block-causal path
        t0 = 20

        def past_loss(k, v):
            out = kernels.relu_attention(q, k, v, causal=True, key_mask=mask, options=blocks)
            return jnp.sum(jnp.sin(out[:, : t0 + 1]))

        k2, v2 = k.at[:, t0 + 1 :].multiply(-3.0), v.at[:, t0 + 1 :].add(7.0)
        chex.assert_trees_all_close(past_loss(k, v), past_loss(k2, v2), atol=fp32(1e-5))
        dk, dv = jax.grad(past_loss, argnums=(0, 1))(k, v)
        dk2, dv2 = jax.grad(past_loss, argnums=(0, 1))(k2, v2)
        chex.assert_trees_all_close(
            (dk[:, : t0 + 1], dv[:, : t0 + 1]), (dk2[:, : t0 + 1], dv2[:, : t0 + 1]), atol=fp32(1e-5)
        )
        # Future keys get no gradient from past outputs.
        assert float(jnp.abs(dk[:, t0 + 1 :]).max()) == 0.0 and float(jnp.abs(dv[:, t0 + 1 :]).max()) == 0.0

    def test_block_causal_xla_does_about_half_the_work_of_the_full_square(self):
        q, k, v, mask = _inputs(b=1, t=512, h=2, d=32)
        blocks = ReluAttentionOptions(impl="xla", xla_block_k=64)  # 8 blocks: 36 of the 64 tiles

        def counted(options):
            def loss(q, k, v):
                return jnp.sum(kernels.relu_attention(q, k, v, causal=True, key_mask=mask, options=options))

            # value_and_grad: the forward's output is used, so XLA keeps its matmuls.
            analysis = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile().cost_analysis()
            return (analysis[0] if isinstance(analysis, list) else analysis)["flops"]

        # One key block of the whole length computes the full square (masked), with the same operations.
        square = counted(ReluAttentionOptions(impl="xla", xla_block_k=512))
        # 36 of 64 tiles' matmuls; a little less in all, as tiles below the diagonal build no causal mask.
        assert 0.4 < counted(blocks) / square < 36 / 64 + 0.05, counted(blocks) / square

    def test_causal_counts_exclude_padding(self):
        mask = jnp.array([[True, True, False, True, False]])
        counts = kernels.visible_key_counts(mask, causal=True)
        np.testing.assert_array_equal(counts, [[1, 2, 2, 3, 3]])
        np.testing.assert_array_equal(kernels.visible_key_counts(mask, causal=False), [[3, 3, 3, 3, 3]])
        np.testing.assert_array_equal(kernels.visible_key_counts(jnp.zeros((1, 3), bool), causal=False), [[1, 1, 1]])

    @parameterized.parameters(16, 64, 256, 1024, 4096)
    def test_output_variance_is_about_one_with_the_factor(self, n):
        # q·k/√d ~ N(0, 1) and v ~ N(0, 1): E[ReLU(s)^2] = 1/2, so √(n/2) restores unit variance.
        b, h, d = max(1, 2048 // n), 4, 64
        kq, kk, kv = jax.random.split(jax.random.key(n), 3)
        q, k, v = (jax.random.normal(key, (b, n, h, d)) for key in (kq, kk, kv))
        out = kernels.relu_attention(q, k, v, options=XLA)
        var = float(jnp.var(out))
        assert 0.8 < var < 1.25, f"n={n}: variance {var:.3f}"
        raw = kernels.relu_attention(q, k, v, row_scale="none", options=XLA)
        raw_var = float(jnp.var(raw))
        assert raw_var == pytest.approx(n / 2 * var, rel=1e-3)

    def test_variance_without_the_factor_grows_with_n(self):
        variances = []
        for n in (16, 256, 4096):
            kq, kk, kv = jax.random.split(jax.random.key(n), 3)
            q, k, v = (jax.random.normal(key, (1, n, 2, 64)) for key in (kq, kk, kv))
            variances.append(float(jnp.var(kernels.relu_attention(q, k, v, row_scale="none", options=XLA))))
        assert variances[0] * 10 < variances[1] and variances[1] * 10 < variances[2], variances

    @parameterized.product(causal=[False, True])
    def test_row_stats_match_reference_with_gradients(self, causal):
        q, k, _, mask = _inputs(t=21)
        gamma = jnp.array([1.0, 0.8, 1.2])

        def f(q, k, impl):
            options = ReluAttentionOptions(impl=impl, xla_block_k=8)
            s, e = kernels.relu_attention_row_stats(q, k, causal=causal, key_mask=mask, gamma=gamma, options=options)
            return jnp.sum(jnp.sin(s)) + jnp.sum(jnp.cos(e)), (s, e)

        (_, ref_stats), ref_grads = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(q, k, "reference")
        (_, stats), grads = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(q, k, "xla")
        chex.assert_trees_all_close(stats, ref_stats, atol=fp32(1e-5), rtol=fp32(1e-5))
        chex.assert_trees_all_close(grads, ref_grads, atol=fp32(1e-4), rtol=fp32(1e-4))
        # The row sums are the sums of the attention weights: Σ_j a_ij applied to v = 1 gives S_i.
        ones = jnp.ones_like(q)
        reference = ReluAttentionOptions(impl="reference")
        out = kernels.relu_attention(q, k, ones, causal=causal, key_mask=mask, gamma=gamma, options=reference)
        chex.assert_trees_all_close(out[..., 0], ref_stats[0], atol=fp32(1e-5))

    def test_bad_inputs_are_clear_errors(self):
        q, k, v, mask = _inputs()
        with self.assertRaisesRegex(ValueError, "unknown relu_attention impl 'cuda'; valid: auto, reference, xla"):
            kernels.relu_attention(q, k, v, options=ReluAttentionOptions(impl="cuda"))
        with self.assertRaisesRegex(ValueError, r"key_mask shape \(2, 5\)"):
            kernels.relu_attention(q, k, v, key_mask=mask[:, :5])
        with self.assertRaisesRegex(ValueError, "gamma must be a scalar or have shape"):
            kernels.relu_attention(q, k, v, gamma=jnp.ones(5))
        with self.assertRaisesRegex(ValueError, "causal attention needs equal query and key lengths"):
            kernels.relu_attention(q[:, :5], k, v, causal=True)
        with self.assertRaisesRegex(ValueError, r"\[batch, length, heads, head_dim\]"):
            kernels.relu_attention(q[0], k[0], v[0])
