"""The softmax mixer's implementation choice (cuDNN on GPU where it applies, XLA otherwise) and the key-length
form of the mask that the cuDNN path uses, checked through XLA's own support for key lengths."""

import chex
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from zoo import mixers, models
from zoo.describe import softmax_attention_path
from zoo.mixers.softmax import attend_with_key_lengths, softmax_implementation


@pytest.mark.parametrize(
    "option, backend, dtype, head_dim, bias, expected",
    [
        ("auto", "gpu", jnp.bfloat16, 64, False, "cudnn"),
        ("auto", "gpu", jnp.float16, 128, False, "cudnn"),
        ("auto", "gpu", jnp.float32, 64, False, "xla"),  # cuDNN flash attention is half precision only
        ("auto", "gpu", jnp.bfloat16, 256, False, "xla"),
        ("auto", "gpu", jnp.bfloat16, 60, False, "xla"),
        ("auto", "gpu", jnp.bfloat16, 64, True, "xla"),  # a learned position bias: XLA
        ("auto", "cpu", jnp.bfloat16, 64, False, "xla"),
        ("auto", "tpu", jnp.bfloat16, 64, False, "xla"),
        ("xla", "gpu", jnp.bfloat16, 64, False, "xla"),
        ("cudnn", "cpu", jnp.float32, 64, False, "cudnn"),  # asked for: jax raises its own error if it cannot
    ],
)
def test_implementation_choice(option, backend, dtype, head_dim, bias, expected):
    assert softmax_implementation(option, backend, dtype, head_dim, bias) == expected


def test_unknown_implementation_is_an_error_naming_the_option():
    cfg = mixers.default_config("softmax")
    cfg.update(d_model=32, num_heads=4, max_length=16, implementation="flash")
    with pytest.raises(ValueError, match=r"softmax implementation='flash' is unknown; valid: auto, xla, cudnn"):
        mixers.build(cfg, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("causal", [False, True])
def test_key_lengths_equal_the_trailing_padding_mask(causal):
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    shape = (3, 24, 4, 16)
    q, k, v = (jax.random.normal(key, shape) for key in (kq, kk, kv))
    mask = jnp.arange(24)[None] < jnp.array([[24], [17], [1]])
    by_lengths = attend_with_key_lengths(q, k, v, mask, causal, implementation="xla")
    by_mask = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None, None, :], is_causal=causal)
    chex.assert_trees_all_close(by_lengths, by_mask, atol=1e-6)
    chex.assert_trees_all_close(attend_with_key_lengths(q, k, v, None, causal, implementation="xla"),
                                jax.nn.dot_product_attention(q, k, v, is_causal=causal), atol=1e-6)  # fmt: skip


def _model_cfg(dtype="bfloat16", **options):
    cfg = models.model_config(mixer="softmax", num_layers=1, d_model=64, num_heads=4, max_length=32, dtype=dtype)
    cfg.mixer_options.softmax.update(options)
    return cfg


def test_describe_says_which_path_and_why():
    assert softmax_attention_path(_model_cfg(), "gpu").startswith("cuDNN flash attention (gpu, bfloat16, head dim 16")
    why = softmax_attention_path(_model_cfg("float32"), "gpu")
    assert why.startswith("XLA: cuDNN needs") and "float32" in why
    assert softmax_attention_path(_model_cfg(implementation="xla"), "gpu") == "XLA (implementation=xla)"
    assert "relative_buckets=32" in softmax_attention_path(_model_cfg(relative_buckets=32), "gpu")


def test_on_gpu_the_mixer_takes_the_key_length_path_except_for_single_query_steps(monkeypatch):
    """Routing as it would be on a GPU (backend reported as "gpu", cuDNN replaced by XLA's key-length path):
    same outputs as implementation=xla with the boolean mask; decoding steps (one query) stay on XLA."""
    import zoo.mixers.softmax as softmax_module

    calls = []

    def fake_cudnn(q, k, v, mask, causal, *, implementation):
        calls.append((q.shape[1], implementation))
        return attend_with_key_lengths(q, k, v, mask, causal, implementation="xla")

    def build(implementation):
        cfg = mixers.default_config("softmax")
        cfg.update(d_model=64, num_heads=4, max_length=16, dtype="bfloat16", implementation=implementation)
        return mixers.build(cfg, rngs=nnx.Rngs(0))

    x = jax.random.normal(jax.random.key(1), (2, 16, 64))
    mask = jnp.arange(16)[None] < jnp.array([[16], [9]])
    reference = build("xla")(x, mask=mask, causal=True)
    monkeypatch.setattr(softmax_module, "attend_with_key_lengths", fake_cudnn)
    monkeypatch.setattr(softmax_module.jax, "default_backend", lambda: "gpu")
    routed = build("auto")
    out = routed(x, mask=mask, causal=True)
    assert calls == [(16, "cudnn")]
    chex.assert_trees_all_close(out.astype(jnp.float32), reference.astype(jnp.float32), atol=2e-2)
    cache = routed.init_cache(2, 16)
    routed.decode(x[:, :1], cache)
    assert calls == [(16, "cudnn")]  # the one-query step did not take the cuDNN path
