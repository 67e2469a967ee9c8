"""kernels.linear_attention: "xla" equals "reference" (outputs and gradients), O(T) memory, the decode step."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

import kernels
from kernels import LinearAttentionOptions
from tests.kernels.tolerances import bound, fp32

XLA, REFERENCE = LinearAttentionOptions(impl="xla"), LinearAttentionOptions(impl="reference")


def _inputs(b=2, t=45, h=3, m=8, d=6, dtype=jnp.float32, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    phi_q = jax.nn.softplus(jax.random.normal(kq, (b, t, h, m))).astype(dtype)
    phi_k = jax.nn.softplus(jax.random.normal(kk, (b, t, h, m))).astype(dtype)
    v = jax.random.normal(kv, (b, t, h, d)).astype(dtype)
    mask = jnp.arange(t)[None] < jnp.array([t, t // 2 + 3] + [t] * (b - 2))[:b, None]
    return phi_q, phi_k, v, mask


class LinearAttentionTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(causal=[False, True], chunk=[8, 16, 64], dtype=[jnp.float32, jnp.bfloat16])
    def test_xla_matches_reference(self, causal, chunk, dtype):
        phi_q, phi_k, v, mask = _inputs(dtype=dtype)  # 45 tokens: not a multiple of any chunk

        def run(impl):
            @self.variant
            def f(phi_q, phi_k, v, mask):
                options = LinearAttentionOptions(impl=impl, chunk_size=chunk)
                return kernels.linear_attention(phi_q, phi_k, v, causal=causal, key_mask=mask, options=options)

            return f(phi_q, phi_k, v, mask)

        out, ref = run("xla"), run("reference")
        chex.assert_shape(out, v.shape)
        chex.assert_type(out, dtype)
        tol = bound(dtype)
        chex.assert_trees_all_close(out.astype(jnp.float32), ref.astype(jnp.float32), atol=tol, rtol=tol)

    @parameterized.product(causal=[False, True])
    def test_gradients_match_reference_including_dk_through_normaliser(self, causal):
        phi_q, phi_k, v, mask = _inputs(t=37)
        w = jax.random.normal(jax.random.key(3), v.shape)

        def loss(phi_q, phi_k, v, impl):
            options = LinearAttentionOptions(impl=impl, chunk_size=8)
            out = kernels.linear_attention(phi_q, phi_k, v, causal=causal, key_mask=mask, options=options)
            return jnp.sum(out * w)

        ref = jax.grad(loss, argnums=(0, 1, 2))(phi_q, phi_k, v, "reference")
        got = jax.grad(loss, argnums=(0, 1, 2))(phi_q, phi_k, v, "xla")
        chex.assert_trees_all_close(got, ref, atol=fp32(1e-5), rtol=fp32(1e-4))

        # dk through the normaliser alone: with v = 1 everywhere the output is 1 − ε/(den+ε), so the
        # only path from φ(k) to the loss is the denominator z. A kernel that drops it gets dk = 0.
        ones = jnp.ones_like(v)

        def norm_only(phi_k, impl):
            options = LinearAttentionOptions(impl=impl, chunk_size=8)
            out = kernels.linear_attention(phi_q, phi_k, ones, causal=causal, key_mask=mask, eps=1.0, options=options)
            return jnp.sum(out)

        dk_ref = jax.grad(norm_only)(phi_k, "reference")
        dk = jax.grad(norm_only)(phi_k, "xla")
        assert float(jnp.abs(dk_ref).max()) > 1e-4
        chex.assert_trees_all_close(dk, dk_ref, atol=fp32(1e-6), rtol=fp32(1e-4))
        # Padded keys get no gradient: they do not take part.
        assert float(jnp.abs(jnp.where(mask[:, :, None, None], 0, dk)).max()) == 0.0

    def test_padded_keys_contribute_nothing(self):
        phi_q, phi_k, v, mask = _inputs()
        pad = ~mask[:, :, None, None]
        noisy_k = jnp.where(pad, 50.0, phi_k)
        noisy_v = jnp.where(pad, -50.0, v)
        for causal in (False, True):
            a = kernels.linear_attention(phi_q, phi_k, v, causal=causal, key_mask=mask, options=XLA)
            b = kernels.linear_attention(phi_q, noisy_k, noisy_v, causal=causal, key_mask=mask, options=XLA)
            chex.assert_trees_all_close(jnp.where(pad, 0, a), jnp.where(pad, 0, b), atol=fp32(1e-6))

    def test_step_equals_causal_forward(self):
        phi_q, phi_k, v, mask = _inputs(t=20)
        full = kernels.linear_attention(phi_q, phi_k, v, causal=True, key_mask=mask, options=REFERENCE)
        state = kernels.linear_attention_init_state(2, 3, 8, 6)
        outs = []
        for t in range(20):
            state, out = kernels.linear_attention_step(state, phi_q[:, t], phi_k[:, t], v[:, t], key_mask=mask[:, t])
            outs.append(out)
        chex.assert_trees_all_close(jnp.stack(outs, 1), full, atol=fp32(1e-5))

    def test_causal_cannot_see_the_future(self):
        phi_q, phi_k, v, _ = _inputs(b=1, t=30)
        chunks = LinearAttentionOptions(chunk_size=8)
        a = kernels.linear_attention(phi_q, phi_k, v, causal=True, options=chunks)
        b = kernels.linear_attention(
            phi_q, phi_k.at[:, 12:].mul(3.0), v.at[:, 12:].add(1.0), causal=True, options=chunks
        )
        chex.assert_trees_all_close(a[:, :12], b[:, :12], atol=fp32(1e-6))
        assert not np.allclose(a[:, 12:], b[:, 12:])

    def test_bad_inputs(self):
        phi_q, phi_k, v, mask = _inputs()
        with self.assertRaisesRegex(ValueError, "unknown linear_attention impl 'fast'"):
            kernels.linear_attention(phi_q, phi_k, v, options=LinearAttentionOptions(impl="fast"))
        with self.assertRaisesRegex(ValueError, r"key_mask shape"):
            kernels.linear_attention(phi_q, phi_k, v, key_mask=mask[:, :3])


def _temp_bytes(t, causal=True):
    phi = jax.ShapeDtypeStruct((1, t, 2, 32), jnp.float32)
    v = jax.ShapeDtypeStruct((1, t, 2, 32), jnp.float32)

    def loss(phi_q, phi_k, v):
        options = LinearAttentionOptions(impl="xla", chunk_size=64)
        return jnp.sum(kernels.linear_attention(phi_q, phi_k, v, causal=causal, options=options))

    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(phi, phi, v).compile()
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("causal", [False, True])
def test_xla_temporary_memory_grows_linearly(causal):
    """Forward + backward from 4K to 16K tokens: 4× the tokens must cost about 4× the memory, not 16×."""
    m4, m8, m16 = (_temp_bytes(t, causal) for t in (4096, 8192, 16384))
    assert m16 / m4 < 4.6, (m4, m8, m16)
    assert m16 / m8 < 2.3, (m4, m8, m16)
    # The quadratic baseline for scale: a dense 16K×16K float32 matrix alone is 1 GiB.
    assert m16 < (16384**2 * 4) / 8
