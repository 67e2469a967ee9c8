"""Which Pallas kernels a `pallas_backend` means on this machine (both ops share the rule).

    "tpu"         the Mosaic TPU kernels (`*_tpu.py`)
    "triton"      the Triton kernels (`*_pallas.py`): any CUDA GPU
    "mosaic_gpu"  the Mosaic GPU kernels (`*_mgpu.py`): Hopper (wgmma), bf16/fp16, whole tiles
    "gpu"         by the GPU's compute capability: Mosaic GPU on Hopper (sm_90) for inputs those kernels
                  take, Triton otherwise — before Hopper (no wgmma/TMA), on Blackwell (wgmma is Hopper-only;
                  its tcgen05 kernels are not written) and where no GPU is attached (lowering on a CPU
                  with `jax.export(..., platforms=["cuda"])`)
    None          the running backend's ("gpu" on a GPU; on a CPU the Triton kernels in interpret mode)

`resolve_pallas_backend` names the Triton kernels "gpu" (the platform they are built for).
"""

from __future__ import annotations

from collections.abc import Callable

import jax

PALLAS_BACKENDS = ("tpu", "gpu", "triton", "mosaic_gpu")


def gpu_compute_capability() -> tuple[int, int] | None:
    """(major, minor) of the first local GPU, or None when no GPU backend is attached."""
    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        return None
    capability = getattr(devices[0], "compute_capability", None) if devices else None
    if not capability:
        return None
    major, _, minor = str(capability).partition(".")
    if not (major.isdigit() and (minor or "0").isdigit()):  # not a CUDA "major.minor" (e.g. ROCm's gfx names)
        return None
    return int(major), int(minor or 0)


def resolve_pallas_backend(
    requested: str | None,
    mosaic_refusal: Callable[[], str | None],
    capability: tuple[int, int] | str | None = "local",
) -> str:
    """The kernels `requested` means here (module docstring): "tpu", "mosaic_gpu", "gpu" (the Triton kernels
    built for a GPU) or the running platform's name when that is neither (the Triton kernels, interpreted).
    `mosaic_refusal()` says why the Mosaic GPU kernels cannot take the inputs (None: they can); `capability`
    defaults to the local GPU's."""
    if requested is not None and requested not in PALLAS_BACKENDS:
        raise ValueError(f"unknown pallas_backend {requested!r}; valid: {', '.join(PALLAS_BACKENDS)}")
    backend = requested or jax.default_backend()
    if backend == "triton":
        return "gpu"
    if backend != "gpu":
        return backend
    if capability == "local":
        capability = gpu_compute_capability()
    if capability is not None and capability[0] == 9 and mosaic_refusal() is None:
        return "mosaic_gpu"
    return "gpu"
