"""Softmax attention through JAX's Pallas TPU splash attention: equal to "reference" in interpret mode (outputs
and gradients, with causal and key-padding masks, ragged lengths), and lowered for TPU by cross-platform export
on this CPU — the splash kernels, not an XLA fallback."""

import re

import chex
import jax
import jax.numpy as jnp
import pytest

import kernels
from kernels import SoftmaxAttentionOptions, SplashBlockSizes
from tests.kernels.lowering import lowered_kernels
from tests.kernels.tolerances import bound, pallas_against_reference

SMALL_TILES = SplashBlockSizes(block_q=128, block_kv=128, block_q_bwd=128, block_kv_bwd=128)
CASES = [
    # (causal, dtype, q length, key length, head dim, tiles): ragged lengths, several tiles, cross-attention.
    (False, jnp.float32, 45, 45, 32, None),
    (True, jnp.float32, 45, 45, 32, None),
    (True, jnp.float32, 300, 300, 64, SMALL_TILES),
    (False, jnp.float32, 70, 260, 64, SMALL_TILES),
    (True, jnp.bfloat16, 200, 200, 128, SMALL_TILES),
]


@pytest.mark.parametrize("causal, dtype, tq, tk, d, sizes", CASES)
def test_interpret_mode_matches_reference(causal, dtype, tq, tk, d, sizes):
    kq, kk, kv, kw = jax.random.split(jax.random.key(tq + tk + d), 4)
    q = jax.random.normal(kq, (2, tq, 2, d)).astype(dtype)
    k, v = (jax.random.normal(key, (2, tk, 2, d)).astype(dtype) for key in (kk, kv))
    mask = jnp.arange(tk)[None] < jnp.array([[tk], [tk // 2 + 1]])
    w = jax.random.normal(kw, q.shape)

    def loss(q, k, v, impl):
        impl = "splash" if impl == "pallas" else impl  # the kernels, in interpret mode on this machine
        options = SoftmaxAttentionOptions(impl=impl, splash_block_sizes=sizes, pallas_interpret=True)
        out = kernels.softmax_attention(q, k, v, causal=causal, key_mask=mask, options=options)
        return jnp.sum(out.astype(jnp.float32) * w), out

    out, ref_out, errors = pallas_against_reference(loss, (q, k, v), ("dq", "dk", "dv"))
    chex.assert_type(out, dtype)
    chex.assert_shape(out, q.shape)
    err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref_out))) / float(jnp.max(jnp.abs(ref_out)))
    assert err < bound(dtype)
    for name, err in errors.items():
        assert err < bound(dtype, "grad"), f"{name}: relative error {err:.2e}"


def test_tiles_must_be_lane_multiples():
    with pytest.raises(ValueError, match=r"SplashBlockSizes.block_kv: must be a positive multiple of 128, got 64"):
        SplashBlockSizes(block_kv=64)


def test_float16_is_refused_naming_the_dtype():
    x = jnp.zeros((1, 8, 1, 8), jnp.float16)
    with pytest.raises(ValueError, match="softmax impl 'splash': the TPU kernels take bfloat16 or float32"):
        kernels.softmax_attention(x, x, x, options=SoftmaxAttentionOptions(impl="splash"))


@pytest.mark.lowering
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("t, d", [(1000, 64), (4096, 128)])
def test_lowers_to_the_splash_kernels_for_tpu(grad, causal, t, d):
    mask = jnp.arange(t)[None] < jnp.array([[t], [t // 2]])

    def attend(q, k, v):
        options = SoftmaxAttentionOptions(impl="splash", pallas_interpret=False)
        return kernels.softmax_attention(q, k, v, causal=causal, key_mask=mask, options=options)

    calls, _, text = lowered_kernels(attend, "tpu", (2, t, 4, d), jnp.bfloat16, grad=grad, prefix="splash")
    assert calls == (3 if grad else 1), calls  # the forward; for gradients also the dq and dk/dv kernels
    # The attention itself is not left to XLA: no dot product outside the kernels forms length × length scores
    # (the backward's Δ_i = dO_i·O_i is an O(T·d) row sum, and stays).
    for line in re.findall(r"stablehlo\.dot_general [^\n]*-> tensor<([\dx]+)x\w+>", text):
        assert sum(int(n) >= t for n in line.split("x")) < 2, line
