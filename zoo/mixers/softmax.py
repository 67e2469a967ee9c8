"""Softmax attention, the baseline (docs/mixers.md), through `jax.nn.dot_product_attention`.

Option `relative_buckets` > 0 adds T5's learned relative position bias (one scalar per head and
log-spaced distance bucket) to the scores: the "BERT + rel pos" baseline of the gMLP paper (docs/mixers.md).

Option `implementation`: "xla" (materialises the T×T scores), "cudnn" (cuDNN flash attention: GPU, bf16 or
fp16, head dim ≤ 128 and a multiple of 8, no position bias) or "auto" (the default: cuDNN where those hold
and there is more than one query, XLA otherwise; `zoo.describe` says which). On the cuDNN path a key mask is
passed as per-example key lengths, which is exact for padding at the end of the sequence — the padding every
task here makes (`inputs != pad_id` with trailing pads; the decoding cache's visible prefix). A mask with
holes needs implementation="xla".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from zoo.mixers.attention import MultiHeadMixer
from zoo.mixers.registry import register


def relative_position_buckets(
    length: int, *, num_buckets: int, max_distance: int, bidirectional: bool = True
) -> np.ndarray:
    """T5's bucket of key j relative to query i, `[length, length]` int32.

    Half the buckets are exact distances, the rest log-spaced up to `max_distance` (further is the last
    bucket); bidirectional splits the buckets between keys before and after the query.
    """
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


IMPLEMENTATIONS = ("auto", "xla", "cudnn")


def check_implementation(option: str) -> None:
    if option not in IMPLEMENTATIONS:
        raise ValueError(f"softmax implementation={option!r} is unknown; valid: {', '.join(IMPLEMENTATIONS)}")


def softmax_implementation(option: str, backend: str, dtype, head_dim: int, has_bias: bool) -> str:
    """What `implementation=option` runs on `backend` for these inputs: "xla" or "cudnn"."""
    check_implementation(option)
    if option != "auto":
        return option
    cudnn_ok = (
        backend == "gpu"
        and jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
        and head_dim <= 128
        and head_dim % 8 == 0
        and not has_bias
    )
    return "cudnn" if cudnn_ok else "xla"


def attend_with_key_lengths(q, k, v, mask, causal: bool, *, implementation: str) -> jax.Array:
    """Attention with the key mask given as per-example lengths (exact for trailing padding)."""
    lengths = None if mask is None else jnp.sum(mask, axis=-1, dtype=jnp.int32)
    return jax.nn.dot_product_attention(
        q, k, v, key_value_seq_lengths=lengths, is_causal=causal, implementation=implementation
    )


class SoftmaxAttention(MultiHeadMixer):
    has_attention_weights = True

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        check_implementation(cfg.implementation)
        self.implementation = cfg.implementation
        self.relative_buckets, self.relative_max_distance = cfg.relative_buckets, cfg.relative_max_distance
        if self.relative_buckets and self.relative_buckets < 4:
            raise ValueError(f"mixer {cfg.name!r}: relative_buckets={self.relative_buckets} must be 0 (off) or ≥ 4")
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
        if self.weights_dropout.rate > 0 and not self.weights_dropout.deterministic:
            return self._attend_with_weights_dropout(q, k, v, mask, causal, bias, rngs)
        impl = softmax_implementation(
            self.implementation, jax.default_backend(), q.dtype, q.shape[-1], self.relative_bias is not None
        )
        if impl == "cudnn" and (q.shape[1] > 1 or self.implementation == "cudnn"):
            return attend_with_key_lengths(q, k, v, mask, causal, implementation="cudnn")
        bias_mask = None if mask is None else mask[:, None, None, :]
        return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=bias_mask, is_causal=causal, implementation="xla")

    def _attend_with_weights_dropout(self, q, k, v, mask, causal, bias, rngs):
        """Training with model.attention_dropout: the probabilities formed explicitly (fp32), dropped per element
        and rescaled by 1/(1 − rate) as flax's attention_dropout_rate (broadcast_dropout=False) does in the LRA
        code; neither cuDNN's nor XLA's fused attention takes a dropout."""
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / np.sqrt(q.shape[-1])
        if bias is not None:
            s = s + bias.astype(jnp.float32)
        visible = jnp.ones((1, 1, 1, k.shape[1]), bool) if mask is None else mask[:, None, None, :]
        if causal:
            visible = visible & jnp.tril(jnp.ones((q.shape[1], k.shape[1]), bool))[None, None]
        p = jax.nn.softmax(jnp.where(visible, s, jnp.finfo(jnp.float32).min), axis=-1)
        p = self.weights_dropout(p, rngs=rngs)
        return jnp.einsum("bhqk,bkhd->bqhd", p.astype(v.dtype), v)

    def init_cache(self, batch: int, max_length: int) -> dict:
        if self.relative_bias is not None:
            raise ValueError(
                f"mixer {self.name!r}: incremental decoding with a relative position bias is not supported"
            )
        return super().init_cache(batch, max_length)


def _options() -> dict:
    return {
        "relative_buckets": 0,  # 0: no position bias; T5 uses 32
        "relative_max_distance": 128,  # distances beyond this share the last bucket
        "implementation": "auto",  # auto | xla | cudnn (module docstring)
    }


register("softmax", SoftmaxAttention, _options)
