"""Softmax attention, the baseline (docs/mixers.md), through `kernels.softmax_attention`.

Option `relative_buckets` > 0 adds T5's learned relative position bias (the gMLP paper's "BERT + rel pos"
baseline): a dense `[heads, T, T]` term, so those models run JAX's dense attention. Option `implementation` is
the op's impl; `zoo.parameter_counts` says which runs. On the cuDNN path a key mask is passed as per-example key
lengths, exact for padding at the end of the sequence (every task's); a mask with holes needs another one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import kernels
from kernels.platforms import device_class
from kernels.softmax_attention.api import cudnn_refusal
from zoo.config_fields import Field, integer, one_of
from zoo.mixers.attention import MultiHeadMixer
from zoo.mixers.registry import register


def relative_position_buckets(
    length: int, *, num_buckets: int, max_distance: int, bidirectional: bool = True
) -> np.ndarray:
    """T5's bucket of key j relative to query i, `[length, length]` int32: half exact distances, the rest
    log-spaced up to `max_distance`; bidirectional splits them between keys before and after the query."""
    relative = np.arange(length)[None, :] - np.arange(length)[:, None]  # key − query
    n = -relative
    buckets = np.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        buckets += (n < 0) * num_buckets
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    exact = num_buckets // 2
    with np.errstate(divide="ignore"):
        log_ratio = np.log(np.maximum(n, 1) / exact) / np.log(max_distance / exact)
    large = np.minimum(exact + (log_ratio * (num_buckets - exact)).astype(np.int32), num_buckets - 1)
    return (buckets + np.where(n < exact, n, large)).astype(np.int32)


IMPLEMENTATIONS = tuple(impl for impl in kernels.SOFTMAX_IMPLS if impl != "reference")
# What runs with a learned position bias: the kernels take none.
BIAS_IMPLEMENTATIONS = ("auto", "dense")


def softmax_implementation(
    option: str, device: str, q: jax.Array, k: jax.Array, has_bias: bool, *, causal: bool
) -> str:
    """What `implementation=option` runs on `device` (`kernels.platforms.device_class`) for queries and keys like
    `q`, `k` (arrays or `jax.ShapeDtypeStruct`s): one of `kernels.SOFTMAX_IMPLS` other than "auto"."""
    if has_bias:
        return "dense"
    return kernels.SoftmaxAttentionOptions(impl=option).plan(q, k, device, causal=causal)


def softmax_attention_path(model_cfg, device: str) -> str:
    """Which implementation the softmax mixer of `model_cfg` uses on `device` (a generation) for training-length
    inputs, and why."""
    options = model_cfg.mixer_options.softmax
    head_dim = model_cfg.d_model // model_cfg.num_heads
    dtype = jnp.dtype(model_cfg.dtype)
    q = jax.ShapeDtypeStruct((1, model_cfg.max_length, model_cfg.num_heads, head_dim), dtype)
    has_bias = options.relative_buckets > 0
    # The encoders' full attention, which every task's model has (a decoder's causal layers plan their own).
    impl = softmax_implementation(options.implementation, device, q, q, has_bias, causal=False)
    here = f"{device}, {dtype.name}, head dim {head_dim}"
    if has_bias:
        return f"XLA dense (relative_buckets={options.relative_buckets}: the position bias needs the T×T scores)"
    if model_cfg.get("attention_dropout", 0.0) and options.implementation not in ("auto", "xla"):
        return (
            f"XLA dense probabilities in training (attention_dropout={model_cfg.attention_dropout} with "
            f"implementation={options.implementation}), {SOFTMAX_PATHS[impl]} in evaluation"
        )
    if model_cfg.get("attention_dropout", 0.0) and impl != "xla":
        return f"{SOFTMAX_PATHS['xla']} in training (attention_dropout={model_cfg.attention_dropout}), " + (
            f"{SOFTMAX_PATHS[impl]} in evaluation ({here})"
        )
    if options.implementation != "auto":
        return f"{SOFTMAX_PATHS[impl]} (implementation={impl})"
    if impl != "xla":
        return f"{SOFTMAX_PATHS[impl]} ({here}; decoding steps: blocked XLA)"
    refusal = cudnn_refusal(q) if device.startswith("cuda") else None
    why = refusal or f"no entry for {device} under jax {jax.__version__} in kernels.auto's table"
    return f"{SOFTMAX_PATHS['xla']}: {why} (here: {here})"


def run_softmax_path(config) -> str | None:
    """`softmax_attention_path` of a run's config on this machine, when its model is a softmax one; else None."""
    model = config.get("model")
    if model is None or model.get("mixer") != "softmax" or "softmax" not in model.get("mixer_options", {}):
        return None
    return softmax_attention_path(model, device_class())


SOFTMAX_PATHS = {
    "xla": "XLA blocked softmax",
    "dense": "XLA dense softmax",
    "cudnn": "cuDNN flash attention",
    "splash": "Pallas TPU splash attention",
    "reference": "dense float32 reference",
}


class SoftmaxAttention(MultiHeadMixer):
    has_attention_weights = True

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        self.relative_buckets, self.relative_max_distance = cfg.relative_buckets, cfg.relative_max_distance
        if self.relative_buckets and self.relative_buckets < 4:
            raise ValueError(f"mixer {cfg.name!r}: relative_buckets={self.relative_buckets} must be 0 (off) or ≥ 4")
        if self.relative_buckets and cfg.implementation not in BIAS_IMPLEMENTATIONS:
            raise ValueError(
                f"softmax implementation={cfg.implementation!r} takes no position bias; with relative_buckets="
                f"{self.relative_buckets} use one of {', '.join(BIAS_IMPLEMENTATIONS)} (JAX's dense attention)"
            )
        self.options = kernels.SoftmaxAttentionOptions(impl=cfg.implementation)
        # Zero init: the model starts as plain softmax attention.
        self.relative_bias = (
            nnx.Param(jnp.zeros((self.relative_buckets, self.num_heads), jnp.float32))
            if self.relative_buckets
            else None
        )

    def position_bias(self, length: int, causal: bool) -> jax.Array:
        """`[1, heads, length, length]` learned bias of each key's distance from each query."""
        buckets = relative_position_buckets(
            length, num_buckets=self.relative_buckets, max_distance=self.relative_max_distance, bidirectional=not causal
        )
        return jnp.transpose(self.relative_bias[...][buckets], (2, 0, 1))[None]

    def __call__(self, x, *, mask=None, causal=False, context=None, context_mask=None, context_kv=None, rngs=None):
        if self.relative_bias is not None and (context is not None or context_kv is not None):
            raise ValueError(f"mixer {self.name!r}: the relative position bias is for self-attention only")
        return super().__call__(
            x, mask=mask, causal=causal, context=context, context_mask=context_mask, context_kv=context_kv, rngs=rngs
        )

    def attend(self, q, k, v, mask, causal, rngs=None):
        bias = None if self.relative_bias is None else self.position_bias(q.shape[1], causal).astype(q.dtype)
        dropout = self.weights_dropout.rate > 0 and not self.weights_dropout.deterministic
        if dropout and (bias is not None or self.options.impl not in ("auto", "xla")):
            # Neither cuDNN's nor XLA's fused attention takes a dropout: the probabilities are formed explicitly.
            def weights(s, visible):
                return jax.nn.softmax(jnp.where(visible, s, jnp.finfo(jnp.float32).min), axis=-1)

            return self.attend_densely(q, k, v, mask, causal, weights, rngs, bias)
        if dropout:  # the blocked softmax forms and drops the weights block by block
            rate, key = self.weights_dropout.rate, self.weights_dropout.key(rngs)
            return kernels.softmax_attention(
                q, k, v, causal=causal, key_mask=mask, dropout_rate=rate, dropout_key=key, options=self.options
            )
        if bias is None:
            return kernels.softmax_attention(q, k, v, causal=causal, key_mask=mask, options=self.options)
        bias_mask = None if mask is None else mask[:, None, None, :]
        return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=bias_mask, is_causal=causal, implementation="xla")

    def init_cache(self, batch: int, max_length: int) -> dict:
        if self.relative_bias is not None:
            raise ValueError(
                f"mixer {self.name!r}: incremental decoding with a relative position bias is not supported"
            )
        return super().init_cache(batch, max_length)


OPTIONS = (
    Field("relative_buckets", 0, integer(0, 2**16), "T5's relative position bias buckets (0: none; T5 uses 32)"),
    Field("relative_max_distance", 128, integer(1, 2**20), "distances beyond this share the last bucket"),
    Field(
        "implementation",
        "auto",
        one_of(*IMPLEMENTATIONS),
        (
            "what computes it: auto (cuDNN on a GPU in half precision, splash on a TPU once passed there, else "
            "the blocked XLA softmax), xla (blocked), dense (XLA's whole matrix), cudnn, splash"
        ),
    ),
)


register("softmax", SoftmaxAttention, OPTIONS)
