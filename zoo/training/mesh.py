"""Device mesh and shardings: the one place that decides where parameters and batches live.

Axes are (`data`, `fsdp`, `tensor`). Batches are split over data × fsdp. Parameters carry logical axis
names (`zoo.layers.logical`); `LOGICAL_RULES` maps them to mesh axes:

  embed → fsdp     (FSDP: the model dimension of every matrix is split over the fsdp axis)
  heads → tensor   (tensor parallelism over attention heads)
  mlp   → tensor   (and over the FFN hidden dimension)
  vocab → tensor

A dimension that the mesh axis does not divide stays whole (replicated), so any config runs on any
mesh; optimiser state follows its parameter. Untagged parameters (norms, γ, SGU spatial weights) are
replicated.
"""

from __future__ import annotations

import math

import jax
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
LOGICAL_RULES = {"embed": "fsdp", "heads": "tensor", "mlp": "tensor", "vocab": "tensor"}


def mesh_shape(cfg: ml_collections.ConfigDict, num_devices: int) -> tuple[int, int, int]:
    sizes = [int(cfg[a]) for a in AXES]
    if sizes.count(-1) > 1:
        raise ValueError(f"at most one of mesh.{', mesh.'.join(AXES)} may be -1, got {sizes}")
    known = math.prod(s for s in sizes if s != -1)
    if num_devices % known:
        raise ValueError(f"mesh {dict(zip(AXES, sizes, strict=True))} does not divide {num_devices} devices")
    sizes = [num_devices // known if s == -1 else s for s in sizes]
    if math.prod(sizes) != num_devices:
        raise ValueError(
            f"mesh {dict(zip(AXES, sizes, strict=True))} needs {math.prod(sizes)} devices, have {num_devices}"
        )
    return tuple(sizes)


def make_mesh(cfg: ml_collections.ConfigDict, devices=None) -> jax.sharding.Mesh:
    """The mesh over `devices` (default: every device of every process)."""
    devices = jax.devices() if devices is None else devices
    # Auto axes: shardings are given explicitly at jit boundaries and XLA propagates them inside.
    auto = (AxisType.Auto,) * len(AXES)
    return jax.make_mesh(mesh_shape(cfg, len(devices)), AXES, axis_types=auto, devices=devices)


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(BATCH_AXES))


def batch_shards(mesh: jax.sharding.Mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]


def logical_to_spec(logical_axes, shape, mesh: jax.sharding.Mesh) -> P:
    """PartitionSpec for a parameter of `shape` tagged `logical_axes`, under LOGICAL_RULES and divisibility."""
    if not logical_axes:
        return P()
    if len(logical_axes) != len(shape):
        raise ValueError(f"logical axes {logical_axes} do not match parameter shape {shape}")
    spec, used = [], set()
    for name, dim in zip(logical_axes, shape, strict=True):
        axis = LOGICAL_RULES.get(name) if name is not None else None
        if axis is None or axis in used or mesh.shape[axis] == 1 or dim % mesh.shape[axis]:
            spec.append(None)
        else:
            spec.append(axis)
            used.add(axis)
    return P(*spec)


def state_shardings(state, mesh: jax.sharding.Mesh):
    """A NamedSharding for every variable of an `nnx.State` (parameters, optimiser state, RNG, buffers)."""

    def sharding(x):
        if isinstance(x, nnx.Variable):
            axes = x.get_metadata().get("logical_axes")
            return x.replace(NamedSharding(mesh, logical_to_spec(axes, x.shape, mesh)))
        return replicated(mesh)

    return jax.tree.map(sharding, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def put_batch(batch: dict[str, np.ndarray], mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
    """Builds global arrays from this process's rows (all of them on one process)."""
    sharding = batch_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
