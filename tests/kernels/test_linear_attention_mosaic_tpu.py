"""The Mosaic TPU linear-attention kernels: equal to "reference" in interpret mode (outputs and every gradient,
the normaliser's path into dφ(k) included) and in Pallas's TPU interpret mode (simulated memory spaces, DMAs and
two cores, with no race), and lowered for TPU by cross-platform export on this CPU; the
Triton kernels' CUDA lowering is checked the same way."""

import chex
import jax
import jax.numpy as jnp
import pytest

import kernels
from kernels import LinearAttentionOptions, LinearBlockSizes, TpuChunkSizes
from tests.kernels.lowering import BACKEND, every_lowering_case, layout_copies, lowered_kernels
from tests.kernels.tolerances import assert_matches_reference, fp32, pallas_against_reference


def _options(impl: str, interpret: bool | str = True, **sizes) -> LinearAttentionOptions:
    """`impl`, where "pallas" is the Mosaic TPU kernels in interpret mode on this machine."""
    impl = "mosaic_tpu" if impl == "pallas" else impl
    return LinearAttentionOptions(impl=impl, pallas_interpret=interpret, **sizes)


CASES = [
    # (causal, dtype, length, m, d_v, chunk, eps_mode): ragged lengths, widths that are not 128.
    (True, jnp.float32, 45, 12, 6, 128, "add"),
    (False, jnp.float32, 45, 12, 6, 128, "add"),
    (True, jnp.float32, 300, 16, 24, 128, "add"),
    (True, jnp.float32, 300, 64, 64, 256, "guard"),
    (False, jnp.bfloat16, 260, 32, 64, 128, "add"),
    (True, jnp.bfloat16, 260, 32, 64, 128, "guard"),
]


@pytest.mark.parametrize("causal, dtype, t, m, d, chunk, eps_mode", CASES)
def test_interpret_mode_matches_reference(causal, dtype, t, m, d, chunk, eps_mode):
    _matches_reference(causal, dtype, t, m, d, chunk, eps_mode, interpret=True)


@pytest.mark.parametrize("causal, dtype, t, m, d, chunk, eps_mode", [CASES[1], CASES[3], CASES[5]])
def test_tpu_interpret_mode_matches_reference_without_races(causal, dtype, t, m, d, chunk, eps_mode, capfd):
    _matches_reference(causal, dtype, t, m, d, chunk, eps_mode, interpret="tpu")
    assert "RACE DETECTED" not in capfd.readouterr().out


def _matches_reference(causal, dtype, t, m, d, chunk, eps_mode, interpret):
    k0, k1, k2, k3 = jax.random.split(jax.random.key(t + m), 4)
    phi_q = jax.nn.softplus(jax.random.normal(k0, (2, t, 2, m))).astype(dtype)
    phi_k = jax.nn.softplus(jax.random.normal(k1, (2, t, 2, m))).astype(dtype)
    v = jax.random.normal(k2, (2, t, 2, d)).astype(dtype)
    mask = jnp.arange(t)[None] < jnp.array([[t], [t // 2]])
    w = jax.random.normal(k3, v.shape)
    f32 = lambda x: x.astype(jnp.float32)

    def loss(a, b, c, impl):
        options = _options(impl, interpret, pallas_block_sizes=TpuChunkSizes(chunk))
        out = kernels.linear_attention(a, b, c, causal=causal, key_mask=mask, eps_mode=eps_mode, options=options)
        return jnp.sum(f32(out) * w), out

    out, ref, errors = pallas_against_reference(loss, (phi_q, phi_k, v), ("dphi_q", "dphi_k", "dv"))
    chex.assert_shape(out, v.shape)
    assert_matches_reference(out, ref, errors, dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_dk_through_the_normaliser(causal):
    # v = 1: the output is 1 − ε/(den+ε), so φ(k) reaches the loss only through z (the r term).
    k0, k1 = jax.random.split(jax.random.key(3))
    phi_q = jax.nn.softplus(jax.random.normal(k0, (1, 40, 2, 8)))
    phi_k = jax.nn.softplus(jax.random.normal(k1, (1, 40, 2, 8)))
    ones = jnp.ones((1, 40, 2, 4))

    def f(phi_k, impl):
        return jnp.sum(kernels.linear_attention(phi_q, phi_k, ones, causal=causal, eps=1.0, options=_options(impl)))

    ref = jax.grad(f)(phi_k, "reference")
    got = jax.grad(f)(phi_k, "pallas")
    assert float(jnp.abs(ref).max()) > 1e-4
    chex.assert_trees_all_close(got, ref, atol=fp32(1e-6), rtol=fp32(1e-4))


def test_chunk_must_be_a_lane_multiple():
    with pytest.raises(ValueError, match=r"TpuChunkSizes.chunk=64 must be a positive multiple of 128"):
        TpuChunkSizes(64)


KERNELS = {  # the gradient needs the forward's output and denominator too
    ("tpu", False): ["linear_attention_fwd_tpu"],
    ("tpu", True): ["linear_attention_fwd_tpu", "linear_attention_bwd_dq_tpu", "linear_attention_bwd_dkdv_tpu"],
    ("cuda", False): ["linear_attention_fwd"],
    ("cuda", True): ["linear_attention_fwd", "linear_attention_bwd_dq", "linear_attention_bwd_dkdv"],
}


@every_lowering_case
def test_lowers_to_the_kernels_for_each_platform(platform, grad, dtype, causal, t, d):
    def attend(a, b, c):
        options = LinearAttentionOptions(impl="pallas", pallas_backend=BACKEND[platform], pallas_interpret=False)
        return kernels.linear_attention(a, b, c, causal=causal, options=options)

    calls, names, text = lowered_kernels(attend, platform, (2, t, 4, d), dtype, grad=grad, prefix="linear_attention_")
    expected = KERNELS[platform, grad]
    assert calls == len(expected) and set(expected) <= names, names
    if platform == "cuda":  # the Triton kernels read and write [B, T, H, D] in place
        assert not layout_copies(text), layout_copies(text)


@pytest.mark.lowering
@pytest.mark.parametrize("causal", [False, True])
def test_column_split_lowers_to_the_triton_kernels(causal):
    """block_dv (grid batch × heads × column blocks, for a batch · heads smaller than the SM count) still
    lowers to the three kernels for CUDA, gradient included, at a long sequence."""

    def attend(a, b, c):
        options = LinearAttentionOptions(
            impl="pallas", pallas_backend="triton", pallas_interpret=False,
            pallas_block_sizes=LinearBlockSizes(chunk=64, block_dv=32),
        )  # fmt: skip
        return kernels.linear_attention(a, b, c, causal=causal, options=options)

    calls, names, text = lowered_kernels(attend, "cuda", (1, 8192, 2, 128), jnp.bfloat16, grad=True, prefix="linear_")
    assert calls == 3 and set(KERNELS["cuda", True]) <= names, names
    assert not layout_copies(text), layout_copies(text)
