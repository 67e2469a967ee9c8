"""Shared multi-head plumbing for attention-type mixers: q/k/v/out projections around an `attend`."""

from __future__ import annotations

import jax
import ml_collections
from flax import nnx

from zoo.layers.common import compute_dtype


class MultiHeadMixer(nnx.Module):
    """Projects x to per-head q, k, v `[batch, length, heads, head_dim]`, calls `attend`, projects back.

    Subclasses implement `attend(q, k, v, mask, causal)`; `supports_causal = False` makes a causal
    request a clear error.
    """

    supports_causal = True

    def __init__(self, cfg: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
        d, h = cfg.d_model, cfg.num_heads
        if d % h:
            raise ValueError(f"mixer {cfg.name!r}: d_model={d} is not divisible by num_heads={h}")
        self.name = cfg.name
        self.num_heads, self.head_dim = h, d // h
        self.dtype = compute_dtype(cfg.dtype)
        init = nnx.initializers.xavier_uniform()
        self.query, self.key, self.value, self.out = (
            nnx.Linear(d, d, kernel_init=init, dtype=self.dtype, rngs=rngs) for _ in range(4)
        )

    def attend(self, q, k, v, mask, causal):
        raise NotImplementedError

    def __call__(self, x: jax.Array, *, mask: jax.Array | None = None, causal: bool = False) -> jax.Array:
        if causal and not self.supports_causal:
            raise ValueError(f"mixer {self.name!r} has no causal form")
        b, t, d = x.shape
        split = lambda y: y.reshape(b, t, self.num_heads, self.head_dim)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        o = self.attend(q, k, v, mask, causal)
        return self.out(o.reshape(b, t, d))
