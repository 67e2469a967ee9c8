"""Small helpers shared by layers and mixers."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class AuxLoss(nnx.Intermediate):
    """Auxiliary losses sown by modules (already weighted); the trainer adds their sum to the task loss."""


def compute_dtype(name: str):
    """The compute dtype for a config string; parameters always stay float32."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; valid: {', '.join(_DTYPES)}") from None
