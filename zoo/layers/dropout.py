"""Dropout with hashed 16-bit levels: `nnx.Dropout`'s interface, cheaper masks.

`jax.random.bernoulli` draws one Threefry hash per value; here four values share one hash
(`kernels.numerics.dropout_keep_mask`). Same interface, key stream and switches as `nnx.Dropout`; the rate is
rounded to a multiple of 2^-16 and the kept values scaled by the rounded keep probability, so the expectation is
exact. Masks broadcast over `broadcast_dims` use `nnx.Dropout`'s own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from kernels.numerics import dropout_keep_mask, dropout_seed, keep_scale


class Dropout(nnx.Dropout):
    def __init__(self, rate: float, *, rngs: nnx.Rngs | None = None, **kwargs):
        """As `nnx.Dropout`, but from `rngs` it keeps only a "dropout" stream (forking the default stream would
        change every parameter initialised after this layer); without one, rngs must come with each call."""
        keep = rngs if isinstance(rngs, nnx.RngStream) or (isinstance(rngs, nnx.Rngs) and "dropout" in rngs) else None
        super().__init__(rate, rngs=keep, **kwargs)

    def __call__(self, inputs: jax.Array, *, deterministic: bool | None = None, rngs=None) -> jax.Array:
        deterministic = self.deterministic if deterministic is None else deterministic
        if deterministic is None or deterministic or self.rate in (0.0, 1.0) or self.broadcast_dims:
            return super().__call__(inputs, deterministic=deterministic, rngs=rngs)  # and its errors
        keep = dropout_keep_mask(dropout_seed(self.key(rngs)), self.rate, inputs.shape)
        return jnp.where(keep, inputs * keep_scale(self.rate), jnp.zeros((), inputs.dtype))

    def key(self, rngs=None) -> jax.Array:
        """The masks' key, drawn as `nnx.Dropout` draws it: from `rngs` (Rngs, a stream or a key), else from the
        stream the module was built with."""
        rngs = self.rngs if rngs is None else rngs
        if isinstance(rngs, nnx.Rngs):
            return rngs[self.rng_collection]()
        if isinstance(rngs, nnx.RngStream):
            return rngs()
        if isinstance(rngs, jax.Array):
            return rngs
        raise ValueError(
            f"dropout (rate {self.rate}) in training needs rngs with a {self.rng_collection!r} stream, a stream or a "
            f"key; got {type(rngs).__name__} (or build the model with nnx.Rngs(..., {self.rng_collection}=SEED))"
        )
