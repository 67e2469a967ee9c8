"""Error bounds of the kernel tests, by input dtype and backend: one table, used by every kernel test file.

A bound is on the relative error max|impl − reference| / max|reference| against the fp32 reference, which
computes at `precision=HIGHEST` (exact fp32 products on every backend).

- float32 on the CPU: arithmetic is exact fp32 and Pallas runs in interpret mode, so two computations of the
  same function agree to rounding — each test gives its own bound (`cpu_fp32`, about 1e-5).
- float32 on an accelerator: the kernel tests compute float32 products at float32 precision there
  (`tests/kernels/conftest.py`; by default a GPU's dots would use TF32, a TPU's bf16 passes), so only the order
  of the sums and the transcendental functions' approximations differ from XLA:CPU's: the bound is at least
  1e-4 there, a hundred times float32 rounding over a row.
- bfloat16 / float16 inputs: the products' inputs are rounded to 8 / 11 mantissa bits (bf16 relative
  rounding 2^-9 ≈ 2e-3 per operand, accumulated over a row), measured at 0.2–1% for outputs and up to ~2% for
  gradients (whose sums are longer), so 3e-2 and 4e-2 — far below what a wrong mask, a leaked future token or
  a dropped term gives (order 1).
"""

import chex
import jax
import jax.numpy as jnp

ON_CPU = jax.default_backend() == "cpu"
ACCELERATOR_FP32 = 1e-4  # float32 products (conftest.py); other sum orders and exp/log approximations
LOW_PRECISION = {  # (output, gradients)
    "bfloat16": (3e-2, 4e-2),
    "float16": (1e-2, 2e-2),
}


def fp32(cpu_bound: float) -> float:
    """`cpu_bound` on the CPU; at least 1e-4 on an accelerator (module docstring)."""
    return cpu_bound if ON_CPU else max(cpu_bound, ACCELERATOR_FP32)


def bound(dtype, what: str = "output", cpu_fp32: float = 2e-5) -> float:
    """The relative-error bound for inputs of `dtype`: "output" or "grad" (module docstring)."""
    name = jnp.dtype(dtype).name
    if name == "float32":
        return fp32(cpu_fp32)
    if name not in LOW_PRECISION:
        raise ValueError(f"no kernel-test bound for dtype {name}; known: float32, {', '.join(LOW_PRECISION)}")
    output, grad = LOW_PRECISION[name]
    return {"output": output, "grad": grad}[what]


def relative_errors(got, want) -> list[float]:
    """Per leaf of the two trees, max|got − want| / max|want| (`want`: the fp32 reference)."""
    return [
        float(jnp.max(jnp.abs(g.astype(jnp.float32) - w)) / jnp.max(jnp.abs(w)))
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
    ]


def assert_bf16_matches_reference(out, ref, grads, ref_grads, real) -> None:
    """A bf16 run against the fp32 reference: the output on the `real` (unpadded) rows within the output bound, each
    gradient's max error relative to its largest value within the gradient bound."""
    got, want = jnp.where(real, out.astype(jnp.float32), 0), jnp.where(real, ref, 0)
    chex.assert_trees_all_close(got, want, atol=bound(jnp.bfloat16), rtol=bound(jnp.bfloat16))
    for err in relative_errors(grads, ref_grads):
        assert err < bound(jnp.bfloat16, "grad"), err


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


def assert_matches_reference(out, ref, errors: dict[str, float], dtype) -> None:
    """`pallas_against_reference`'s results within the dtype's bounds: output (in `dtype`) and each gradient."""
    chex.assert_type(out, dtype)
    tol = bound(dtype)
    chex.assert_trees_all_close(out.astype(jnp.float32), ref, atol=tol, rtol=tol)
    for name, err in errors.items():
        assert err < bound(dtype, "grad"), f"{name}: relative error {err:.2e}"
