"""Classification heads: pool a sequence, then (Dense → ReLU) × layers → Dense (the LRA heads)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
from flax import nnx

from zoo.layers.common import dense

POOLINGS = ("cls", "first", "mean")


def pool(x: jax.Array, mask: jax.Array, pooling: str) -> jax.Array:
    """`[batch, length, d]` → `[batch, d]`: the first position ("cls", "first") or the mean over real positions."""
    if pooling in ("cls", "first"):
        return x[:, 0]
    if pooling == "mean":
        w = mask.astype(x.dtype)[..., None]
        return (x * w).sum(1) / jnp.maximum(w.sum(1), 1)
    raise ValueError(f"unknown pooling {pooling!r}; valid: {', '.join(POOLINGS)}")


class ClassificationHead(nnx.Module):
    """`layers` hidden Dense → ReLU layers, the first `hidden` wide and each next half as wide, then the logits
    (1: the LRA classifier head, 2: its matching head)."""

    def __init__(self, d_in: int, hidden: int, num_classes: int, *, dtype, rngs: nnx.Rngs, layers: int = 1):
        if layers < 1 or hidden >> (layers - 1) < 1:
            raise ValueError(f"a head of {layers} hidden layers halving from {hidden} units is not possible")
        widths = [hidden >> i for i in range(layers)]
        self.hidden = dense(d_in, hidden, ("embed", "mlp"), dtype=dtype, rngs=rngs)
        # Further hidden layers only when asked: a one-layer head keeps the parameter layout of older checkpoints.
        self.deeper = (
            nnx.List([dense(a, b, ("mlp", None), dtype=dtype, rngs=rngs) for a, b in itertools.pairwise(widths)])
            if layers > 1
            else None
        )
        self.logits = dense(widths[-1], num_classes, ("mlp", None), dtype=dtype, rngs=rngs)

    def __call__(self, pooled: jax.Array) -> jax.Array:
        h = jax.nn.relu(self.hidden(pooled))
        for layer in self.deeper or ():
            h = jax.nn.relu(layer(h))
        return self.logits(h).astype(jnp.float32)
