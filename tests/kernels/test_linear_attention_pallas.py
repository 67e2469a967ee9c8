"""impl="pallas" linear attention (interpret mode on CPU) equals "reference": outputs and every gradient."""

import chex
import jax
import jax.numpy as jnp
import pytest

import kernels
from tests.kernels.tolerances import fp32, pallas_against_reference

F32_TOL = fp32(2e-5)  # tests/kernels/tolerances.py: exact fp32 on the CPU, TF32 / bf16 passes elsewhere


def _inputs(t=45, m=12, d=6, dtype=jnp.float32):
    k0, k1, k2 = jax.random.split(jax.random.key(0), 3)
    phi_q = jax.nn.softplus(jax.random.normal(k0, (2, t, 2, m))).astype(dtype)
    phi_k = jax.nn.softplus(jax.random.normal(k1, (2, t, 2, m))).astype(dtype)
    v = jax.random.normal(k2, (2, t, 2, d)).astype(dtype)
    mask = jnp.arange(t)[None] < jnp.array([[t], [t // 2]])
    return phi_q, phi_k, v, mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype, t, chunk", [(jnp.float32, 45, 16), (jnp.bfloat16, 37, 16), (jnp.float32, 20, 32)])
def test_pallas_matches_reference(causal, dtype, t, chunk):
    phi_q, phi_k, v, mask = _inputs(t=t, dtype=dtype)
    w = jax.random.normal(jax.random.key(5), v.shape)
    f32 = lambda x: x.astype(jnp.float32)

    def loss(a, b, c, impl):
        out = kernels.linear_attention(a, b, c, causal=causal, key_mask=mask, impl=impl, chunk_size=chunk)
        return jnp.sum(f32(out) * w), out

    out, ref, errors = pallas_against_reference(loss, (phi_q, phi_k, v), ("dphi_q", "dphi_k", "dv"))
    chex.assert_type(out, dtype)
    tol = F32_TOL if dtype == jnp.float32 else 3e-2
    chex.assert_trees_all_close(f32(out), ref, atol=tol, rtol=tol)
    for name, err in errors.items():
        assert err < (F32_TOL if dtype == jnp.float32 else 4e-2), f"{name}: relative error {err:.2e}"


@pytest.mark.parametrize("causal", [False, True])
def test_dk_through_the_normaliser(causal):
    # v = 1: the output is 1 − ε/(den+ε), so φ(k) reaches the loss only through z (the r term).
    phi_q, phi_k, v, mask = _inputs()
    ones = jnp.ones_like(v)

    def f(phi_k, impl):
        return jnp.sum(kernels.linear_attention(phi_q, phi_k, ones, causal=causal, key_mask=mask, eps=1.0, impl=impl))

    ref = jax.grad(f)(phi_k, "reference")
    got = jax.grad(f)(phi_k, "pallas")
    assert float(jnp.abs(ref).max()) > 1e-4
    chex.assert_trees_all_close(got, ref, atol=fp32(1e-6), rtol=fp32(1e-4))
