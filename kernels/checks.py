"""Input checks the attention ops share: each names the argument and what is wrong with it.

Values are checked only where they are concrete (outside `jit`): inside a trace, γ and φ are whatever
the model computes, and checking them would need a host round trip.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify


def check_options(options, cls: type, op: str, impl: str | None = None):
    """`options`, or `cls()`'s defaults for None, with `impl` in place of its own where given (an op's `impl=`
    keyword, as `jax.nn.dot_product_attention`'s `implementation=`); another op's options class is an error."""
    if options is None:
        options = cls()
    if not isinstance(options, cls):
        raise ValueError(f"{op}: options must be a {cls.__name__}, got {type(options).__name__}")
    return options if impl is None else dataclasses.replace(options, impl=impl)


def check_causal(causal: object) -> None:
    if not isinstance(causal, bool | np.bool_):
        raise ValueError(f"causal must be a bool, got {causal!r} ({type(causal).__name__})")


def check_block_length(options, field: str) -> None:
    """`options.<field>`, a block or chunk length: a positive whole number or None."""
    value = getattr(options, field)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{type(options).__name__}.{field}: must be a positive whole number or None, got {value!r}")


def check_array(name: str, x: object) -> None:
    """`x` is a jax array (a tracer too) or a numpy array: a list is named, not met by an AttributeError."""
    if not isinstance(x, jax.Array | np.ndarray):
        raise ValueError(f"{name} must be a jax or numpy array, got {type(x).__name__}")


def _check_arrays(arrays: dict[str, object], key_mask, shape: str) -> None:
    """The inputs `arrays` are floating-point arrays of `shape` (all of one rank), key_mask a bool array."""
    for name, x in arrays.items():
        check_array(name, x)
    if key_mask is not None and getattr(key_mask, "dtype", None) != jnp.bool_:
        got = f"dtype {key_mask.dtype}" if hasattr(key_mask, "dtype") else f"a {type(key_mask).__name__}"
        raise ValueError(f"key_mask must be a bool array (True = real token), got {got}")
    if any(x.ndim != shape.count(",") + 1 for x in arrays.values()):
        shapes = ", ".join(str(x.shape) for x in arrays.values())
        raise ValueError(f"{', '.join(arrays)} must be {shape}; got shapes {shapes}")
    for name, x in arrays.items():
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name} must be a floating-point array, got dtype {x.dtype}")


def check_attention_inputs(q: jax.Array, k: jax.Array, v: jax.Array, key_mask, causal, *, linear: bool = False) -> None:
    """What every attention op needs of q, k, v `[batch, length, heads, dim]` (φ(q), φ(k), v for `linear`), the
    key mask `[batch, key_length]` and `causal` (equal lengths)."""
    check_causal(causal)
    qn, kn, dim = ("phi_q", "phi_k", "dim") if linear else ("q", "k", "head_dim")
    _check_arrays({qn: q, kn: k, "v": v}, key_mask, f"[batch, length, heads, {dim}]")
    lengths = {"query_length": q.shape[1], "key_length": k.shape[1], "feature_dim" if linear else dim: q.shape[3]}
    for name, t in lengths.items():
        if t < 1:
            raise ValueError(f"{name} is {t}: attention needs at least one position")
    if k.shape[0] != q.shape[0] or k.shape[2:] != q.shape[2:]:
        raise ValueError(f"{kn} shape {k.shape} does not match {qn} shape {q.shape} (batch, heads, {dim})")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v shape {v.shape} does not match {kn} shape {k.shape} (batch, length, heads)")
    if key_mask is not None and key_mask.shape != k.shape[:2]:
        raise ValueError(f"key_mask shape {key_mask.shape} must be [batch, key_length] = {k.shape[:2]}")
    if causal and q.shape[1] != k.shape[1]:
        kind = "linear attention" if linear else "attention"
        raise ValueError(f"causal {kind} needs equal query and key lengths, got {q.shape[1]} and {k.shape[1]}")


def check_step_inputs(state, phi_q: jax.Array, phi_k: jax.Array, v: jax.Array, key_mask) -> None:
    """`check_attention_inputs` for one causal token: φ(q), φ(k), v `[batch, heads, dim]`, key_mask `[batch]`, and
    the state (S `[batch, heads, m, d_v]`, z `[batch, heads, m]`) they continue."""
    _check_arrays({"phi_q": phi_q, "phi_k": phi_k, "v": v}, key_mask, "[batch, heads, dim] (one token)")
    if phi_k.shape != phi_q.shape:
        raise ValueError(f"phi_k shape {phi_k.shape} does not match phi_q shape {phi_q.shape} (batch, heads, dim)")
    if v.shape[:2] != phi_k.shape[:2]:
        raise ValueError(f"v shape {v.shape} does not match phi_k shape {phi_k.shape} (batch, heads)")
    if key_mask is not None and key_mask.shape != phi_k.shape[:1]:
        raise ValueError(f"key_mask shape {key_mask.shape} must be [batch] = {phi_k.shape[:1]}")
    if not isinstance(state, tuple | list) or len(state) != 2:
        raise ValueError(f"state must be the pair (S, z) of linear_attention_init_state, got a {type(state).__name__}")
    for name, x, shape in (("S", state[0], (*phi_k.shape, v.shape[2])), ("z", state[1], phi_k.shape)):
        check_array(f"state {name}", x)
        if x.shape != shape:
            raise ValueError(
                f"state {name} shape {x.shape} must be {shape} for phi_k shape {phi_k.shape} and v shape {v.shape} "
                "(linear_attention_init_state(batch, heads, m, d_v))"
            )


def is_concrete(x: object) -> bool:
    return not isinstance(x, jax.core.Tracer)


def check_positive(name: str, x: jax.Array | float) -> None:
    """x > 0 everywhere: refused at once when x is concrete; traced, checked under `jax.experimental.checkify`
    (and otherwise not: the output is then non-finite)."""
    if is_concrete(x):
        values = np.asarray(x)
        if values.size and not np.all(values > 0):
            raise ValueError(f"{name} must be positive, got {values.tolist()}")
    else:
        checkify.debug_check(jnp.all(x > 0), f"{name} must be positive, got {{x}}", x=x)


def check_non_negative(name: str, x: jax.Array, *, nan_passes: bool = False) -> None:
    """x ≥ 0 everywhere when x is concrete; traced, under `jax.experimental.checkify` only. NaN fails too, unless
    `nan_passes` (an op then returns NaN where the reference would have refused). The minimum is taken where x
    lives: one scalar reaches the host, never the array."""
    if is_concrete(x) and x.size:
        with jax.ensure_compile_time_eval():  # a concrete input may be met while tracing a jit: compute it now
            values = jnp.asarray(x, jnp.float32)
            low = float(jnp.min(jnp.where(jnp.isnan(values), jnp.inf, values) if nan_passes else values))
        if not low >= 0:
            raise ValueError(
                f"{name} must be non-negative (a positive feature map such as elu+1 or softplus), got minimum {low}"
            )
    elif x.size:
        ok = jnp.all((x >= 0) | jnp.isnan(x)) if nan_passes else jnp.all(x >= 0)
        checkify.debug_check(ok, f"{name} must be non-negative (a positive feature map such as elu+1 or softplus)")
