"""The check every mixer makes of its input: a clear error instead of a raw `dot_general` TypeError."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.checks import check_causal, is_concrete


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


def check_causal_flag(name: str, causal: object) -> None:
    """The kernels' own check of `causal`, its message naming the mixer."""
    try:
        check_causal(causal)
    except ValueError as e:
        raise ValueError(f"mixer {name!r}: {e}") from None


def check_decode_input(name: str, x: jax.Array, d_model: int, cache, batch_leaf: str, positions: bool) -> None:
    """One decoding step: x `[batch, 1, d_model]` for the cache `init_cache(batch, ...)` made, at a position inside
    it (`positions`: `cache[batch_leaf]` holds one entry per position on axis 1). The position is checked where
    concrete; under jit `dynamic_update_slice` would clamp an out-of-range one to the last slot."""
    if not isinstance(cache, dict) or batch_leaf not in cache:
        raise ValueError(f"mixer {name!r}: cache must be the dict init_cache returns, got {type(cache).__name__}")
    check_mixer_input(name, x, d_model)
    batch = cache[batch_leaf].shape[0]
    if x.shape[:2] != (batch, 1):
        raise ValueError(
            f"mixer {name!r}: a decoding step takes x [batch={batch}, 1, d_model] (the cache's batch, one token), "
            f"got shape {x.shape}"
        )
    index, length = cache.get("index"), cache[batch_leaf].shape[1]
    if positions and index is not None and is_concrete(index) and int(index) >= length:
        raise ValueError(
            f"mixer {name!r}: position {int(index)} is past the cache's {length} (init_cache's max_length)"
        )
