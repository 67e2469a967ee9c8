"""The check every mixer makes of its input: a clear error instead of a raw `dot_general` TypeError."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def check_mixer_input(name: str, x: jax.Array, d_model: int, mask: jax.Array | None = None, what: str = "x") -> None:
    """x must be floating `[batch, length, d_model]`; mask, when given, bool `[batch, length]`."""
    if x.ndim != 3 or x.shape[-1] != d_model:
        raise ValueError(f"mixer {name!r}: {what} must be [batch, length, d_model={d_model}], got shape {x.shape}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"mixer {name!r}: {what} must be floating-point, got dtype {x.dtype}")
    if mask is not None:
        if mask.shape != x.shape[:2]:
            raise ValueError(
                f"mixer {name!r}: the mask for {what} must be [batch, length] = {x.shape[:2]}, got {mask.shape}"
            )
        if mask.dtype != jnp.bool_:
            raise ValueError(f"mixer {name!r}: the mask must be bool (True = real token), got dtype {mask.dtype}")
