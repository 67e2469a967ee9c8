"""Hiding padded keys from every implementation of an op."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def zero_masked_rows(x: jax.Array, key_mask: jax.Array | None) -> jax.Array:
    """`x` `[batch, length, heads, dim]` with the rows of padded keys (key_mask False) set to 0 by selection.

    A masked key's weight is 0, but 0 × NaN is NaN: a NaN or inf left in a padded row of k or v would reach every
    output through the matmul. Selecting zeros (not multiplying by the mask) makes padding unable to matter
    whatever it holds; the gradients of those rows are 0."""
    if key_mask is None:
        return x
    return jnp.where(key_mask[:, :, None, None], x, jnp.zeros((), x.dtype))
