"""Tolerances for fp32 comparisons, by backend.

On the CPU, fp32 arithmetic is exact fp32 and Pallas runs in interpret mode, so two computations of the same
function agree to rounding (the bounds written in the tests). On a GPU, XLA's and Triton's fp32 dots use TF32
by default (10-bit mantissa: relative errors near 1e-3), and on a TPU fp32 dots take bf16 passes; there the
bound is at least 5e-3 — still far below what a wrong mask, a leaked future token or a dropped term gives.
"""

import jax
import jax.numpy as jnp

ON_CPU = jax.default_backend() == "cpu"


def fp32(cpu_bound: float) -> float:
    """`cpu_bound` on the CPU; at least 5e-3 on an accelerator (TF32 / bf16-pass matrix units)."""
    return cpu_bound if ON_CPU else max(cpu_bound, 5e-3)


def pallas_against_reference(loss, args: tuple, grad_names: tuple[str, ...]):
    """Runs `loss(*args, impl) -> (scalar, output)` with impl "pallas" (jitted, on `args` as given) and with
    "reference" (on fp32 copies); returns (output, reference output, {gradient name: relative max error})."""
    grad = jax.value_and_grad(loss, argnums=tuple(range(len(args))), has_aux=True)
    (_, ref), ref_grads = grad(*(a.astype(jnp.float32) for a in args), "reference")
    (_, out), grads = jax.jit(grad, static_argnums=len(args))(*args, "pallas")
    errors = {
        name: float(jnp.max(jnp.abs(g.astype(jnp.float32) - r))) / (float(jnp.max(jnp.abs(r))) + 1e-6)
        for name, g, r in zip(grad_names, grads, ref_grads, strict=True)
    }
    return out, ref, errors
