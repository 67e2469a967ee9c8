"""Position-wise feed-forward layers (SPEC §1.3; the key-value-memory variants follow in the zoo issue)."""

from __future__ import annotations

import jax
from flax import nnx

_ACTIVATIONS = {"relu": jax.nn.relu, "gelu": jax.nn.gelu}
FFN_KINDS = tuple(_ACTIVATIONS)


class FeedForward(nnx.Module):
    """`act(x W1 + b1) W2 + b2` with dropout on the hidden activations."""

    def __init__(self, d_model: int, hidden: int, *, kind: str, dropout: float, dtype, rngs: nnx.Rngs):
        if kind not in _ACTIVATIONS:
            raise ValueError(f"unknown ffn kind {kind!r}; valid: {', '.join(FFN_KINDS)}")
        self.act = _ACTIVATIONS[kind]
        self.wi = nnx.Linear(d_model, hidden, dtype=dtype, rngs=rngs)
        self.wo = nnx.Linear(hidden, d_model, dtype=dtype, rngs=rngs)
        self.dropout = nnx.Dropout(dropout)

    def __call__(self, x: jax.Array, *, rngs: nnx.Rngs | None = None) -> jax.Array:
        return self.wo(self.dropout(self.act(self.wi(x)), rngs=rngs))
