"""Classification heads: pool a sequence, then Dense → ReLU → Dense (the LRA head)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from zoo.layers.common import dense

POOLINGS = ("cls", "mean")


def pool(x: jax.Array, mask: jax.Array, pooling: str) -> jax.Array:
    """`[batch, length, d]` → `[batch, d]`: the first position, or the mean over real positions."""
    if pooling == "cls":
        return x[:, 0]
    if pooling == "mean":
        w = mask.astype(x.dtype)[..., None]
        return (x * w).sum(1) / jnp.maximum(w.sum(1), 1)
    raise ValueError(f"unknown pooling {pooling!r}; valid: {', '.join(POOLINGS)}")


class ClassificationHead(nnx.Module):
    def __init__(self, d_in: int, hidden: int, num_classes: int, *, dtype, rngs: nnx.Rngs):
        self.hidden = dense(d_in, hidden, ("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.logits = dense(hidden, num_classes, ("mlp", None), dtype=dtype, rngs=rngs)

    def __call__(self, pooled: jax.Array) -> jax.Array:
        return self.logits(jax.nn.relu(self.hidden(pooled))).astype(jnp.float32)
