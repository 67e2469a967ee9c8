"""Position-wise feed-forward layers, read as key-value memories (docs/mixers.md).

relu               ReLU(x W1 + b1) W2 + b2 (the standard FFN)
gelu               GELU(x W1 + b1) W2 + b2
softmax_memory     Softmax(x Kᵀ) V over n = hidden slots
softmax_ln_memory  LayerNorm(Softmax(x Kᵀ) V)
relu_memory        ReLU(x Kᵀ) V (the FFN without biases)
none               no FFN sub-layer (gMLP blocks)

A softmax memory's output is inert at a standard initialisation: its variance is σ_V² · e / n (Σ p² ≈ e / n),
against 1/2 for a ReLU FFN. `ffn_init="softmax_matched"` draws V with variance n / (2e), matching the ReLU FFN.
"""

from __future__ import annotations

import math

import jax
from flax import nnx

from zoo.layers.common import dense
from zoo.layers.dropout import Dropout

FFN_KINDS = ("relu", "gelu", "softmax_memory", "softmax_ln_memory", "relu_memory", "none")
_MEMORY = ("softmax_memory", "softmax_ln_memory", "relu_memory")
FFN_INITS = ("lecun_normal", "xavier_uniform", "torch", "softmax_matched")


def _fan_in_uniform(fan_in: int):
    """U(±1/√fan_in): PyTorch's nn.Linear default for its weight (kaiming_uniform, a = √5) and its bias."""
    bound = 1.0 / fan_in**0.5
    return lambda key, shape, dtype=jax.numpy.float32: jax.random.uniform(key, shape, dtype, -bound, bound)


def initializers(kind: str, fan_in: int, *, values: bool = False) -> tuple:
    """(kernel init, bias init) of an FFN layer with `fan_in` inputs, by model.ffn_init; `values`: the second."""
    if kind == "softmax_matched":  # variance n / (2e) for V (module docstring), lecun_normal for K
        scale = fan_in**2 / (2 * math.e) if values else 1.0
        return nnx.initializers.variance_scaling(scale, "fan_in", "truncated_normal"), nnx.initializers.zeros_init()
    if kind == "lecun_normal":
        return nnx.initializers.lecun_normal(), nnx.initializers.zeros_init()
    if kind == "xavier_uniform":  # the LRA code's MlpBlock (common_layers.py): bias_init normal(stddev=1e-6)
        return nnx.initializers.xavier_uniform(), nnx.initializers.normal(stddev=1e-6)
    if kind == "torch":
        return _fan_in_uniform(fan_in), _fan_in_uniform(fan_in)
    raise ValueError(f"config field model.ffn_init={kind!r} is unknown; valid: {', '.join(FFN_INITS)}")


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
        init: str = "lecun_normal",
    ):
        if kind not in FFN_KINDS or kind == "none":
            raise ValueError(f"unknown ffn kind {kind!r}; valid: {', '.join(k for k in FFN_KINDS if k != 'none')}")
        bias = kind not in _MEMORY
        if init == "softmax_matched" and kind not in ("softmax_memory", "softmax_ln_memory"):
            raise ValueError(
                f"config field model.ffn_init='softmax_matched' scales a softmax memory's values; model.ffn={kind!r} "
                "is not one (softmax_memory, softmax_ln_memory)"
            )
        self.kind = kind
        w_init, b_init = initializers(init, d_model)
        self.wi = dense(
            d_model, hidden, ("embed", "mlp"), use_bias=bias, init=w_init, bias_init=b_init, dtype=dtype, rngs=rngs
        )  # keys K
        w_init, b_init = initializers(init, hidden, values=True)
        self.wo = dense(
            hidden, d_model, ("mlp", "embed"), use_bias=bias, init=w_init, bias_init=b_init, dtype=dtype, rngs=rngs
        )  # values V
        ln_memory = kind == "softmax_ln_memory"
        self.norm = nnx.LayerNorm(d_model, epsilon=layer_norm_eps, dtype=dtype, rngs=rngs) if ln_memory else None
        self.gelu_approximate = gelu_approximate
        self.dropout = Dropout(dropout, rngs=rngs)

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
