"""Position-wise feed-forward layers, read as key-value memories (SPEC §1.3).

relu               ReLU(x W1 + b1) W2 + b2 (the standard FFN)
gelu               GELU(x W1 + b1) W2 + b2
softmax_memory     Softmax(x Kᵀ) V over n = hidden slots
softmax_ln_memory  LayerNorm(Softmax(x Kᵀ) V)
relu_memory        ReLU(x Kᵀ) V (the FFN without biases)
none               no FFN sub-layer (gMLP blocks)
"""

from __future__ import annotations

import jax
from flax import nnx

from zoo.layers.common import dense

FFN_KINDS = ("relu", "gelu", "softmax_memory", "softmax_ln_memory", "relu_memory", "none")
_MEMORY = ("softmax_memory", "softmax_ln_memory", "relu_memory")


class FeedForward(nnx.Module):
    def __init__(
        self,
        d_model: int,
        hidden: int,
        *,
        kind: str,
        dropout: float,
        dtype,
        rngs: nnx.Rngs,
        layer_norm_eps: float = 1e-6,
        gelu_approximate: bool = True,
    ):
        if kind not in FFN_KINDS or kind == "none":
            raise ValueError(f"unknown ffn kind {kind!r}; valid: {', '.join(k for k in FFN_KINDS if k != 'none')}")
        bias = kind not in _MEMORY
        self.kind = kind
        self.wi = dense(d_model, hidden, ("embed", "mlp"), use_bias=bias, dtype=dtype, rngs=rngs)  # keys K
        self.wo = dense(hidden, d_model, ("mlp", "embed"), use_bias=bias, dtype=dtype, rngs=rngs)  # values V
        ln_memory = kind == "softmax_ln_memory"
        self.norm = nnx.LayerNorm(d_model, epsilon=layer_norm_eps, dtype=dtype, rngs=rngs) if ln_memory else None
        self.gelu_approximate = gelu_approximate
        self.dropout = nnx.Dropout(dropout)

    def __call__(self, x: jax.Array, *, rngs: nnx.Rngs | None = None) -> jax.Array:
        h = self.wi(x)
        if self.kind in ("relu", "relu_memory"):
            h = jax.nn.relu(h)
        elif self.kind == "gelu":
            h = jax.nn.gelu(h, approximate=self.gelu_approximate)
        else:
            h = jax.nn.softmax(h.astype("float32"), axis=-1).astype(h.dtype)
        y = self.wo(self.dropout(h, rngs=rngs))
        return self.norm(y) if self.norm is not None else y
