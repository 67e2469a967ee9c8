"""The ops' options dataclasses: a bad value is an error naming the class and the field when the options are built;
block sizes must be those of the op and of the kernels that run; options are frozen and hashable, so a model can
hold them and `jax.jit` can take them as a static argument."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import kernels
from kernels import (
    LinearAttentionOptions,
    LinearBlockSizes,
    MgpuBlockSizes,
    MgpuChunkSizes,
    PallasBlockSizes,
    ReluAttentionOptions,
    TpuBlockSizes,
    TpuChunkSizes,
)
from tests.kernels.tolerances import fp32

BAD = [
    (
        dict(impl="cuda"),
        r"\.impl: unknown {op} impl 'cuda'; valid: auto, reference, xla, triton, mosaic_gpu, mosaic_tpu",
    ),
    (dict(impl="triton", pallas_backend="tpu"), r"\.pallas_backend: goes with impl 'pallas' only; impl 'triton' names"),
    (dict(pallas_backend="cuda"), r"\.pallas_backend: unknown pallas_backend 'cuda'; valid: tpu, gpu, triton"),
    (dict(pallas_interpret="yes"), r"\.pallas_interpret: must be True, False, 'tpu' or None, got 'yes'"),
    (dict(pallas_interpret=1), r"\.pallas_interpret: must be True, False, 'tpu' or None, got 1"),
]


@pytest.mark.parametrize("kwargs, message", BAD)
@pytest.mark.parametrize("cls", [ReluAttentionOptions, LinearAttentionOptions])
def test_a_bad_shared_field_is_an_error_naming_the_class_and_the_field(cls, kwargs, message):
    with pytest.raises(ValueError, match=cls.__name__ + message.format(op=cls.OP)):
        cls(**kwargs)


@pytest.mark.parametrize("value", [0, -64, 2.5, True, "512"])
def test_block_and_chunk_lengths_must_be_positive_whole_numbers(value):
    with pytest.raises(
        ValueError, match=r"ReluAttentionOptions\.xla_block_k: must be a positive whole number or None, got"
    ):
        ReluAttentionOptions(xla_block_k=value)
    with pytest.raises(ValueError, match=r"LinearAttentionOptions\.chunk_size: must be a positive whole number or"):
        LinearAttentionOptions(chunk_size=value)
    assert LinearAttentionOptions(chunk_size=None).chunk_size is None  # None: each impl's default


@pytest.mark.parametrize(
    "cls, other_ops_sizes",
    [(ReluAttentionOptions, LinearBlockSizes()), (LinearAttentionOptions, PallasBlockSizes())],
)
def test_block_sizes_of_the_other_op_are_refused(cls, other_ops_sizes):
    name = type(other_ops_sizes).__name__
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.pallas_block_sizes: {name} are not {cls.OP}'s"):
        cls(pallas_block_sizes=other_ops_sizes)


@pytest.mark.parametrize(
    "cls, build, sizes, wanted",
    [
        (ReluAttentionOptions, "mosaic_tpu", PallasBlockSizes(), "TpuBlockSizes"),
        (ReluAttentionOptions, "triton", MgpuBlockSizes(), "PallasBlockSizes"),
        (ReluAttentionOptions, "mosaic_gpu", TpuBlockSizes(), "MgpuBlockSizes"),
        (LinearAttentionOptions, "mosaic_tpu", LinearBlockSizes(), "TpuChunkSizes"),
        (LinearAttentionOptions, "triton", TpuChunkSizes(), "LinearBlockSizes"),
        (LinearAttentionOptions, "mosaic_gpu", LinearBlockSizes(), "MgpuChunkSizes"),
    ],
)
def test_block_sizes_must_be_those_of_the_kernels_named(cls, build, sizes, wanted):
    with pytest.raises(ValueError, match=rf"are not the {build} kernels' \({wanted}\)"):
        cls(impl=build, pallas_block_sizes=sizes)
    with pytest.raises(ValueError, match=rf"are not the {build} kernels' \({wanted}\)"):  # the older spelling
        cls(impl="pallas", pallas_backend={"mosaic_tpu": "tpu"}.get(build, build), pallas_block_sizes=sizes)
    # "gpu" picks Mosaic GPU or Triton by the device: either build's sizes are taken when the options are built.
    assert cls(pallas_backend="gpu", pallas_block_sizes=cls.BLOCK_SIZES["mosaic_gpu"]()).pallas_backend == "gpu"


def test_sizes_for_kernels_that_do_not_run_are_an_error_when_the_op_runs():
    """pallas_backend None on this CPU runs the Triton kernels interpreted: Mosaic GPU tile sizes cannot reach
    them (they have other fields), and the error says whose sizes they are and what runs."""
    q = jnp.ones((1, 64, 2, 64), jnp.float32)
    options = ReluAttentionOptions(impl="pallas", pallas_block_sizes=MgpuBlockSizes(), pallas_interpret=True)
    with pytest.raises(ValueError, match=r"pallas_block_sizes: MgpuBlockSizes are not for the triton kernels"):
        kernels.relu_attention(q, q, q, options=options)
    linear = LinearAttentionOptions(impl="pallas", pallas_block_sizes=MgpuChunkSizes(), pallas_interpret=True)
    with pytest.raises(ValueError, match=r"pallas_block_sizes: MgpuChunkSizes are not for the triton kernels"):
        kernels.linear_attention(q, q, q, options=linear)


def test_options_are_frozen_hashable_and_a_static_argument_of_jit():
    a = ReluAttentionOptions(impl="xla", xla_block_k=16)
    assert a == ReluAttentionOptions(impl="xla", xla_block_k=16) and hash(a) == hash(
        ReluAttentionOptions(impl="xla", xla_block_k=16)
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.impl = "pallas"
    with pytest.raises(TypeError):  # keyword-only: no positional mix-ups between fields
        ReluAttentionOptions("xla")
    q = jax.random.normal(jax.random.key(0), (1, 40, 2, 8))
    attend = jax.jit(lambda q, options: kernels.relu_attention(q, q, q, options=options), static_argnums=1)
    assert jnp.allclose(
        attend(q, a), kernels.relu_attention(q, q, q, options=ReluAttentionOptions(impl="reference")), atol=fp32(1e-5)
    )


def test_the_defaults_are_auto_with_each_builds_own_tiles():
    for cls in (ReluAttentionOptions, LinearAttentionOptions):
        options = cls()
        assert (options.impl, options.pallas_backend, options.pallas_block_sizes) == ("auto", None, None)
        assert options.interpret() == (jax.default_backend() == "cpu")
        assert cls(pallas_interpret=False).interpret() is False


def test_the_xla_block_defaults_to_the_platforms_measured_length():
    from kernels.blocking import DEFAULT_XLA_BLOCK_K, XLA_BLOCK_K, XLA_CAUSAL_BLOCK_K, default_block_k

    assert default_block_k("cpu", causal=False) == XLA_BLOCK_K["cpu"] == 256
    assert default_block_k("cpu", causal=True) == XLA_CAUSAL_BLOCK_K["cpu"] == 128
    for causal in (False, True):
        assert default_block_k("gpu", causal=causal) == default_block_k("tpu", causal=causal) == DEFAULT_XLA_BLOCK_K
        assert ReluAttentionOptions().block_k(causal=causal) == default_block_k(causal=causal)
        assert kernels.SoftmaxAttentionOptions(xla_block_k=64).block_k(causal=causal) == 64
