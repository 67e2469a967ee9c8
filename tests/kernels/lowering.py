"""Cross-platform lowering on this CPU: `jax.export` for TPU (Mosaic) or CUDA (Triton), and what to look for."""

import contextlib
import re

import jax
import jax.numpy as jnp
import pytest
from jax import export

PLATFORMS = ("tpu", "cuda")
BACKEND = {"tpu": "tpu", "cuda": "triton"}  # the kernels' `pallas_backend` for each export platform
KERNEL_CALL = {"tpu": "tpu_custom_call", "cuda": "__gpu$xla.gpu.triton"}
SHAPES = [(1024, 64), (1000, 128), (16384, 128)]  # (T, D): ragged and long sequences, both head dims
KERNEL_TARGETS = ("__gpu$xla.gpu.triton", "mosaic_gpu_v2", "tpu_custom_call")


def _cuda_target():
    """The GPU a CUDA export on a machine without one lowers for: an H100. jax ≥ 0.11's Triton lowering asks
    the abstract mesh's device ("No supported GPU devices found" otherwise; jax 0.10 assumed sm_90 itself), the
    Mosaic GPU lowering assumes sm_90. An empty mesh: only its device is read (axes would add sharding ops)."""
    sharding = jax.sharding
    if not hasattr(sharding, "AbstractDevice") or jax.devices()[0].platform == "gpu":
        return contextlib.nullcontext()
    device = sharding.AbstractDevice(device_kind="NVIDIA H100", num_cores=132, platform="gpu")
    return sharding.use_abstract_mesh(sharding.AbstractMesh((), (), abstract_device=device))


def exported_text(fn, platform: str, *args) -> str:
    """The StableHLO text `jax.jit(fn)(*args)` exports to for `platform` ("cuda" or "tpu") from this machine.
    The kernels' custom-call targets are not on export's list of stable ones: expected, so unchecked."""
    unchecked = [export.DisabledSafetyCheck.custom_call(name) for name in KERNEL_TARGETS]
    with _cuda_target() if platform == "cuda" else contextlib.nullcontext():
        return export.export(jax.jit(fn), platforms=[platform], disabled_checks=unchecked)(*args).mlir_module()


def lowered_kernels(attend, platform: str, shape: tuple[int, ...], dtype, *, grad: bool, prefix: str):
    """(number of kernel custom calls, names starting with `prefix`) in the module `attend(x, x, x)` exports to."""
    fn = attend
    if grad:
        fn = jax.grad(lambda a, b, c: jnp.sum(attend(a, b, c).astype(jnp.float32)), argnums=(0, 1, 2))
    x = jax.ShapeDtypeStruct(shape, dtype)
    text = exported_text(fn, platform, x, x, x)
    return text.count(KERNEL_CALL[platform]), set(re.findall(rf"{prefix}\w+", text)), text


def layout_copies(text: str) -> list[str]:
    """The transposes and pads of rank-4 (`[B, T, H, D]`-sized) arrays in an exported module: the GPU kernels
    read and write that layout in place, so around them there should be none (small O(B·H·T) masks and row
    vectors may still be padded)."""
    return re.findall(r"stablehlo\.(?:transpose|pad) [^\n]*\(tensor<\d+x\d+x\d+x\d+x[^\n]*", text)


def every_lowering_case(test):
    """Parametrises `test(platform, grad, dtype, causal, t, d)` over the whole grid the kernels must lower for:
    both platforms, forward and gradient, fp32 and bf16, causal and not, every shape in SHAPES."""
    for mark in (
        pytest.mark.parametrize("t, d", SHAPES),
        pytest.mark.parametrize("causal", [False, True]),
        pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16]),
        pytest.mark.parametrize("grad", [False, True]),
        pytest.mark.parametrize("platform", PLATFORMS),
        pytest.mark.lowering,
    ):
        test = mark(test)
    return test
