"""Input checks the attention ops share: each names the argument and what is wrong with it.

Values are checked only where they are concrete (outside `jit`): inside a trace, γ and φ are whatever
the model computes, and checking them would need a host round trip.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def check_floating(**arrays: jax.Array) -> None:
    for name, x in arrays.items():
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name} must be a floating-point array, got dtype {x.dtype}")


def check_key_mask(key_mask: jax.Array | None) -> None:
    if key_mask is not None and key_mask.dtype != jnp.bool_:
        raise ValueError(f"key_mask must be a bool array (True = real token), got dtype {key_mask.dtype}")


def check_causal(causal: object) -> None:
    if not isinstance(causal, bool | np.bool_):
        raise ValueError(f"causal must be a bool, got {causal!r} ({type(causal).__name__})")


def check_lengths(**lengths: int) -> None:
    for name, t in lengths.items():
        if t < 1:
            raise ValueError(f"{name} is {t}: attention needs at least one position")


def is_concrete(x: object) -> bool:
    return not isinstance(x, jax.core.Tracer)


def check_positive(name: str, x: jax.Array | float) -> None:
    """x > 0 everywhere, when x is concrete."""
    if is_concrete(x):
        values = np.asarray(x)
        if values.size and not np.all(values > 0):
            raise ValueError(f"{name} must be positive, got {values.tolist()}")


def check_non_negative(name: str, x: jax.Array) -> None:
    """x ≥ 0 everywhere (NaN fails too), when x is concrete."""
    if is_concrete(x) and x.size:
        low = float(jnp.min(x.astype(jnp.float32)))
        if not low >= 0:
            raise ValueError(
                f"{name} must be non-negative (a positive feature map such as elu+1 or softplus), got minimum {low}"
            )
