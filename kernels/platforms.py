"""Facts about the machine the kernels run on: its device generation and GPU compute capability."""

from __future__ import annotations

import re

import jax


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


def device_class(device=None) -> str:
    """The class a kernel record is kept per: "cuda-sm90" (compute capability), "tpu-v5e" (TPU generation from
    the device kind), "cpu"; other platforms by name. `device`: a jax device (default: the first local one)."""
    device = device or jax.devices()[0]
    if device.platform == "gpu":
        capability = str(getattr(device, "compute_capability", "") or "")
        major, _, minor = capability.partition(".")
        if major.isdigit():
            return f"cuda-sm{major}{minor or 0}"
        return "gpu-" + re.sub(r"[^a-z0-9]+", "-", device.device_kind.lower()).strip("-")
    if device.platform == "tpu":
        kind = device.device_kind.lower()  # "TPU v4", "TPU v5 lite", "TPU v5p", "TPU v6 lite"
        match = re.search(r"v(\d+)\s*(lite|e|p)?", kind)
        if match:
            suffix = {"lite": "e", "e": "e", "p": "p", None: ""}[match.group(2)]
            return f"tpu-v{match.group(1)}{suffix}"
        return "tpu-" + re.sub(r"[^a-z0-9]+", "-", kind).strip("-")
    return device.platform


def largest_head_dim(*arrays) -> int:
    """The largest head dim (last axis) of an op's inputs: what a record's `auto_max_head_dim` is compared with."""
    return max(x.shape[-1] for x in arrays)
