"""The Mosaic TPU ReLU-attention kernels: equal to "reference" in interpret mode (outputs and every gradient,
γ included) and in Pallas's TPU interpret mode (simulated memory spaces, DMAs and two cores, with no race), and
lowered for TPU by cross-platform export on this CPU — kernels, not an XLA fallback. The Triton kernels' CUDA
lowering is checked the same way."""

import chex
import jax
import jax.numpy as jnp
import pytest

import kernels
from kernels import ReluAttentionOptions, TpuBlockSizes
from tests.kernels.lowering import BACKEND, every_lowering_case, layout_copies, lowered_kernels
from tests.kernels.tolerances import bound, pallas_against_reference

CASES = [
    # (causal, dtype, length, head_dim, row_scale, block sizes): ragged lengths, head dims that are not 128.
    (False, jnp.float32, 45, 24, "sqrt_half", None),
    (True, jnp.float32, 45, 24, "sqrt_half", None),
    (True, jnp.float32, 300, 64, "count", TpuBlockSizes(block_q=128, block_k=256, block_q_dkv=256, block_k_dkv=128)),
    (True, jnp.float32, 300, 192, "sqrt_half", TpuBlockSizes(block_q=256, block_k=128)),
    (False, jnp.float32, 130, 256, "none", None),
    (True, jnp.bfloat16, 200, 128, "sqrt_half", None),
]


@pytest.mark.parametrize("causal, dtype, t, d, row_scale, sizes", CASES)
def test_interpret_mode_matches_reference(causal, dtype, t, d, row_scale, sizes):
    _matches_reference(causal, dtype, t, d, row_scale, sizes, interpret=True)


@pytest.mark.parametrize("causal, dtype, t, d, row_scale, sizes", [CASES[1], CASES[2], CASES[5]])
def test_tpu_interpret_mode_matches_reference_without_races(causal, dtype, t, d, row_scale, sizes, capfd):
    _matches_reference(causal, dtype, t, d, row_scale, sizes, interpret="tpu")
    assert "RACE DETECTED" not in capfd.readouterr().out


def test_the_tpu_interpreter_reports_a_race_where_there_is_one(capfd):
    """The check above is only as good as this: two cores adding into one output block along a "parallel" axis."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from kernels.numerics import tpu_interpret

    def add_into(x_ref, o_ref):
        o_ref[...] = o_ref[...] + x_ref[...]

    for semantics, races in (("parallel", True), ("arbitrary", False)):
        racy = pl.pallas_call(
            add_into, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), grid=(4,),
            in_specs=[pl.BlockSpec((None, 8, 128), lambda i: (i, 0, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (0, 0)),
            compiler_params=pltpu.CompilerParams(dimension_semantics=(semantics,)), interpret=tpu_interpret("tpu"),
        )  # fmt: skip
        jax.block_until_ready(racy(jnp.ones((4, 8, 128))))
        assert ("RACE DETECTED" in capfd.readouterr().out) == races, semantics


def _matches_reference(causal, dtype, t, d, row_scale, sizes, interpret):
    kq, kk, kv, kw = jax.random.split(jax.random.key(t + d), 4)
    q, k, v = (jax.random.normal(key, (2, t, 2, d)).astype(dtype) for key in (kq, kk, kv))
    mask = jnp.arange(t)[None] < jnp.array([[t], [t // 2 + 1]])
    gamma = jnp.array([1.0, 0.6])
    w = jax.random.normal(kw, (2, t, 2, d))

    def loss(q, k, v, gamma, impl):
        # "pallas": the Mosaic TPU kernels in interpret mode on this machine
        impl = "mosaic_tpu" if impl == "pallas" else impl
        options = ReluAttentionOptions(impl=impl, pallas_interpret=interpret, pallas_block_sizes=sizes)
        out = kernels.relu_attention(
            q, k, v, causal=causal, key_mask=mask, gamma=gamma, row_scale=row_scale, options=options
        )
        return jnp.sum(out.astype(jnp.float32) * w), out

    out, ref_out, errors = pallas_against_reference(loss, (q, k, v, gamma), ("dq", "dk", "dv", "dgamma"))
    chex.assert_type(out, dtype)
    chex.assert_shape(out, q.shape)
    tol = bound(dtype)
    real = mask[:, :, None, None]
    scale = float(jnp.max(jnp.abs(ref_out)))
    assert float(jnp.max(jnp.abs(jnp.where(real, out.astype(jnp.float32) - ref_out, 0)))) / scale < tol
    for name, err in errors.items():
        # dγ sums B·T·D products with cancellation: fp32 rounding alone reaches 3e-5 there (the "xla" impl
        # is 3.4e-5 off on the T 300, D 192 case).
        limit = bound(dtype, "grad", cpu_fp32=1e-4 if name == "dgamma" else 2e-5)
        assert err < limit, f"{name}: relative error {err:.2e}"


def test_block_sizes_must_be_lane_multiples():
    with pytest.raises(ValueError, match=r"TpuBlockSizes.block_k=64 must be a positive multiple of 128"):
        TpuBlockSizes(block_k=64)


KERNELS = {
    ("tpu", False): ["relu_attention_fwd_tpu"],
    ("tpu", True): ["relu_attention_bwd_dq_tpu", "relu_attention_bwd_dkdv_tpu"],
    ("cuda", False): ["relu_attention_fwd"],
    ("cuda", True): ["relu_attention_bwd_dq", "relu_attention_bwd_dkdv"],
}


@every_lowering_case
def test_lowers_to_the_kernels_for_each_platform(platform, grad, dtype, causal, t, d):
    mask = jnp.arange(t)[None] < jnp.array([[t], [t // 2]])  # padding masked in the kernels

    def attend(q, k, v):
        options = ReluAttentionOptions(impl="pallas", pallas_backend=BACKEND[platform], pallas_interpret=False)
        return kernels.relu_attention(q, k, v, causal=causal, key_mask=mask, options=options)

    calls, names, text = lowered_kernels(attend, platform, (2, t, 4, d), dtype, grad=grad, prefix="relu_attention_")
    expected = KERNELS[platform, grad]
    assert calls == len(expected) and set(expected) <= names, names
    # Nothing of the attention itself left to XLA: no dot products outside the kernels.
    assert "stablehlo.dot_general" not in text
    if platform == "cuda":  # and no transposed or padded copies of q, k, v, dO around them
        assert not layout_copies(text), layout_copies(text)


@pytest.mark.lowering
@pytest.mark.parametrize("grad", [False, True])
def test_row_stats_kernel_lowers_for_cuda(grad):
    """relu_attention_and_row_stats: one forward kernel for the output and the row statistics, the two
    backward kernels for all three cotangents, no XLA dot products and no layout copies, at T 4K, bf16."""
    t = 4096
    mask = jnp.arange(t)[None] < jnp.array([[t], [t // 2]])

    def attend(q, k, v):
        options = ReluAttentionOptions(impl="pallas", pallas_backend="triton", pallas_interpret=False)
        out, row_sum, row_xlogx = kernels.relu_attention_and_row_stats(
            q, k, v, causal=True, key_mask=mask, options=options
        )
        return out + (row_sum + row_xlogx)[..., None].astype(out.dtype)

    calls, names, text = lowered_kernels(attend, "cuda", (2, t, 4, 128), jnp.bfloat16, grad=grad, prefix="relu_")
    expected = ["relu_attention_bwd_dq", "relu_attention_bwd_dkdv"] if grad else ["relu_attention_fwd_row_stats"]
    assert calls == len(expected) and set(expected) <= names, names
    assert "stablehlo.dot_general" not in text
    assert not layout_copies(text), layout_copies(text)
