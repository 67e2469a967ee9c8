"""Sparsemax and exact 1.5-entmax: simplex outputs that match brute-force solutions."""

import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.mixers.sparse import entmax15, sparsemax


def _brute_sparsemax(z):
    z = np.asarray(z, np.float64)
    best = None
    for r in range(1, len(z) + 1):
        for support in itertools.combinations(range(len(z)), r):
            s = list(support)
            tau = (z[s].sum() - 1) / len(s)
            p = np.maximum(z - tau, 0)
            outside = [j for j in range(len(z)) if j not in s]
            if np.all(z[s] > tau) and np.all(z[outside] <= tau + 1e-12):
                best = p
    return best


def _brute_entmax15(z):
    # p_i = max(z_i/2 − τ, 0)², Σ p = 1: bisection on τ in float64.
    z = np.asarray(z, np.float64) / 2
    lo, hi = z.max() - 1.0, z.max()
    for _ in range(200):
        tau = (lo + hi) / 2
        if np.sum(np.maximum(z - tau, 0) ** 2) > 1:
            lo = tau
        else:
            hi = tau
    return np.maximum(z - (lo + hi) / 2, 0) ** 2


@pytest.mark.parametrize("fn, brute", [(sparsemax, _brute_sparsemax), (entmax15, _brute_entmax15)])
def test_matches_brute_force_and_sums_to_one(fn, brute):
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 5, 7):
        for scale in (0.3, 1.0, 4.0):
            z = rng.normal(size=(n,)) * scale
            p = np.asarray(fn(jnp.asarray(z, jnp.float32)))
            np.testing.assert_allclose(p, brute(z), atol=2e-5)
            assert abs(p.sum() - 1) < 1e-5 and (p >= 0).all()


@pytest.mark.parametrize("fn", [sparsemax, entmax15])
def test_rows_sum_to_one_on_batches_and_are_sparse(fn):
    z = jax.random.normal(jax.random.key(0), (4, 3, 50)) * 3
    p = fn(z, axis=-1)
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-5)
    assert float((p == 0).mean()) > 0.3  # unlike softmax, most entries are exactly zero
    p_axis = fn(jnp.moveaxis(z, -1, 1), axis=1)
    np.testing.assert_allclose(jnp.moveaxis(p_axis, 1, -1), p, atol=1e-6)


@pytest.mark.parametrize("fn", [sparsemax, entmax15])
def test_gradients_are_finite_with_masked_entries(fn):
    z = jnp.array([[0.5, -1e9, 0.2, -1e9], [-1e9, -1e9, 3.0, -1e9]])
    g = jax.grad(lambda z: jnp.sum(fn(z) * jnp.arange(4.0)))(z)
    assert bool(jnp.all(jnp.isfinite(g)))


@pytest.mark.parametrize("fn, brute", [(sparsemax, _brute_sparsemax), (entmax15, _brute_entmax15)])
def test_large_score_offsets_lose_nothing(fn, brute):
    # Scores of ~1000 (long-context logits, unscaled dot products): both maps are shift-invariant.
    z = np.random.default_rng(1).normal(size=(7,))
    x = jnp.asarray(z + 1000.0, jnp.float32)
    np.testing.assert_allclose(np.asarray(fn(x)), brute(np.asarray(x, np.float64)), atol=2e-6)


@pytest.mark.parametrize("fn", [sparsemax, entmax15])
def test_minus_infinity_is_masked_and_a_fully_masked_row_is_zero(fn):
    z = jnp.array([[0.5, -jnp.inf, 0.2, -jnp.inf], [-jnp.inf] * 4])
    p = fn(z)
    chex.assert_tree_all_finite(p)
    np.testing.assert_allclose(p[0], np.asarray(fn(jnp.array([0.5, 0.2])))[[0, 0, 1, 1]] * [1, 0, 1, 0], atol=1e-6)
    np.testing.assert_array_equal(p[1], 0.0)
    g = jax.grad(lambda z: jnp.sum(fn(z) * jnp.arange(4.0)))(z)
    np.testing.assert_array_equal(g[1], 0.0)
    np.testing.assert_array_equal(g[0, [1, 3]], 0.0)


def test_sparsemax_jacobian_at_an_exact_tie():
    # x = (1, ½, ¼): support {0, 1}, τ = ¼ = x_2 exactly (dyadic, so exact in float32). The entmax package's
    # backward treats p_2 = 0 as outside the support: J = diag(s) − s sᵀ/|S|, whose columns sum to 0.
    x = jnp.array([1.0, 0.5, 0.25])
    p = sparsemax(x)
    np.testing.assert_array_equal(p, [0.75, 0.25, 0.0])
    jac = jax.jacrev(sparsemax)(x)
    np.testing.assert_allclose(jac, [[0.5, -0.5, 0.0], [-0.5, 0.5, 0.0], [0.0, 0.0, 0.0]], atol=1e-7)


@pytest.mark.parametrize("fn", [sparsemax, entmax15])
def test_jacobian_columns_sum_to_zero_and_match_finite_differences(fn):
    # Σ_i p_i = 1 for every input, so Σ_i ∂p_i/∂x_j = 0; and the Jacobian is the true derivative.
    x = jax.random.normal(jax.random.key(3), (6,), jnp.float32) * 2
    jac = np.asarray(jax.jacrev(fn)(x))
    np.testing.assert_allclose(jac.sum(0), 0.0, atol=1e-6)
    x64 = np.asarray(x, np.float64)
    h = 1e-3
    brute = _brute_sparsemax if fn is sparsemax else _brute_entmax15
    numeric = np.stack([(brute(x64 + h * e) - brute(x64 - h * e)) / (2 * h) for e in np.eye(6)], axis=1)
    np.testing.assert_allclose(jac, numeric, atol=2e-3)
