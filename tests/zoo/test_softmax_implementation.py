"""The softmax mixer's implementation choice (what `kernels.auto`'s table picks: cuDNN on Hopper where it applies,
the blocked XLA softmax otherwise), what `zoo.parameter_counts` says about it, and the routing it makes."""

import dataclasses
import importlib

import chex
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from kernels import auto, platforms
from zoo import mixers, models
from zoo.mixers.softmax import softmax_attention_path, softmax_implementation


@pytest.fixture(autouse=True)
def committed_table_under_this_jax(monkeypatch):
    """The committed table as if its runs had passed under the running jax (they ran under 0.11)."""
    minor = ".".join(jax.__version__.split(".")[:2])
    monkeypatch.setattr(auto, "TABLE", tuple(dataclasses.replace(e, jax_minor=minor) for e in auto.TABLE))


def _queries(dtype, head_dim, length=16):
    return jax.ShapeDtypeStruct((2, length, 4, head_dim), jnp.dtype(dtype))


@pytest.mark.parametrize(
    "option, device, dtype, head_dim, length, bias, expected",
    [
        ("auto", "cuda-sm90", jnp.bfloat16, 64, 16, False, "cudnn"),
        ("auto", "cuda-sm90", jnp.float16, 128, 16, False, "cudnn"),
        ("auto", "cuda-sm90", jnp.float32, 64, 16, False, "xla"),  # cuDNN flash attention is half precision only
        ("auto", "cuda-sm90", jnp.bfloat16, 256, 16, False, "xla"),
        ("auto", "cuda-sm90", jnp.bfloat16, 60, 16, False, "xla"),
        ("auto", "cuda-sm90", jnp.bfloat16, 64, 1, False, "xla"),  # a decoding step: one query
        ("auto", "cuda-sm90", jnp.bfloat16, 64, 16, True, "dense"),  # a learned position bias: JAX's dense attention
        ("auto", "cpu", jnp.bfloat16, 64, 16, False, "xla"),
        ("auto", "tpu-v5e", jnp.bfloat16, 64, 16, False, "xla"),  # splash has no entry yet
        ("auto", "cuda-sm80", jnp.bfloat16, 64, 16, False, "xla"),  # cuDNN has not run under test on an A100
        ("dense", "cuda-sm90", jnp.bfloat16, 64, 16, False, "dense"),
        ("xla", "cuda-sm90", jnp.bfloat16, 64, 16, False, "xla"),
        ("splash", "cpu", jnp.float32, 64, 16, False, "splash"),  # asked for: interpret mode on a CPU
        ("cudnn", "cpu", jnp.float32, 64, 16, False, "cudnn"),  # asked for: the op names why it cannot run
    ],
)
def test_implementation_choice(option, device, dtype, head_dim, length, bias, expected):
    q = _queries(dtype, head_dim, length)
    assert softmax_implementation(option, device, q, q, bias, causal=False) == expected
    assert softmax_implementation(option, device, q, q, bias, causal=True) == expected  # one entry for both modes


def test_unknown_implementation_is_an_error_naming_the_option():
    cfg = mixers.default_config("softmax")
    cfg.update(d_model=32, num_heads=4, max_length=16, implementation="flash")
    valid = "auto, xla, dense, cudnn, splash"
    with pytest.raises(ValueError, match=rf"mixer_options.softmax.implementation='flash' must be one of {valid}"):
        mixers.build(cfg, rngs=nnx.Rngs(0))


def test_a_kernel_with_a_position_bias_is_refused_when_built():
    cfg = mixers.default_config("softmax")
    cfg.update(d_model=32, num_heads=4, max_length=16, implementation="splash", relative_buckets=32)
    with pytest.raises(ValueError, match="implementation='splash' takes no position bias; with relative_buckets=32"):
        mixers.build(cfg, rngs=nnx.Rngs(0))


def _model_cfg(dtype="bfloat16", **options):
    cfg = models.model_config(mixer="softmax", num_layers=1, d_model=64, num_heads=4, max_length=32, dtype=dtype)
    cfg.mixer_options.softmax.update(options)
    return cfg


def test_describe_says_which_path_and_why():
    path = softmax_attention_path(_model_cfg(), "cuda-sm90")
    assert path.startswith("cuDNN flash attention (cuda-sm90, bfloat16, head dim 16")
    why = softmax_attention_path(_model_cfg("float32"), "cuda-sm90")
    assert why.startswith("XLA blocked softmax: cuDNN flash attention is bfloat16/float16 only, not float32")
    assert "no entry for tpu-v5e under jax" in softmax_attention_path(_model_cfg(), "tpu-v5e")
    assert "no entry for cpu under jax" in softmax_attention_path(_model_cfg(), "cpu")
    dense = softmax_attention_path(_model_cfg(implementation="dense"), "cuda-sm90")
    assert dense == "XLA dense softmax (implementation=dense)"
    assert "relative_buckets=32" in softmax_attention_path(_model_cfg(relative_buckets=32), "cuda-sm90")


def test_on_gpu_the_mixer_takes_the_key_length_path_except_for_single_query_steps(monkeypatch):
    """Routing as it would be on an H100 (device "cuda-sm90", cuDNN replaced by XLA's key-length path):
    same outputs as the blocked XLA softmax; decoding steps (one query) stay on XLA."""
    op = importlib.import_module("kernels.softmax_attention.api")

    calls = []
    dense = op._dense

    def fake_dense(q, k, v, key_mask, causal, implementation):
        calls.append((q.shape[1], implementation))
        lengths = jnp.sum(key_mask, axis=-1, dtype=jnp.int32)  # what the cuDNN path passes
        out = jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths, is_causal=causal)
        chex.assert_trees_all_close(out, dense(q, k, v, key_mask, causal, "xla"))
        return out

    def build(implementation):
        cfg = mixers.default_config("softmax")
        cfg.update(d_model=64, num_heads=4, max_length=16, dtype="bfloat16", implementation=implementation)
        return mixers.build(cfg, rngs=nnx.Rngs(0))

    x = jax.random.normal(jax.random.key(1), (2, 16, 64))
    mask = jnp.arange(16)[None] < jnp.array([[16], [9]])
    reference = build("xla")(x, mask=mask, causal=True)
    monkeypatch.setattr(op, "_dense", fake_dense)
    monkeypatch.setattr(platforms, "device_class", lambda device=None: "cuda-sm90")
    routed = build("auto")
    out = routed(x, mask=mask, causal=True)
    assert calls == [(16, "cudnn")]
    chex.assert_trees_all_close(out.astype(jnp.float32), reference.astype(jnp.float32), atol=2e-2)
    cache = routed.init_cache(2, 16)
    routed.decode(x[:, :1], cache)
    assert calls == [(16, "cudnn")]  # the one-query step did not take the cuDNN path
