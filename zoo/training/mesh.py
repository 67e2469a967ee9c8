"""Device mesh and shardings: the one place that decides where parameters and batches live.

Axes are (`data`, `fsdp`, `tensor`). Batches are split over data × fsdp. Parameters are replicated for
now; sharding rules (FSDP, tensor parallelism) plug in through `state_shardings`.
"""

from __future__ import annotations

import math

import jax
import ml_collections
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")


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


def make_mesh(cfg: ml_collections.ConfigDict) -> jax.sharding.Mesh:
    # Auto axes: shardings are given explicitly at jit boundaries and XLA propagates them inside.
    return jax.make_mesh(mesh_shape(cfg, jax.device_count()), AXES, axis_types=(AxisType.Auto,) * len(AXES))


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(BATCH_AXES))


def batch_shards(mesh: jax.sharding.Mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]


def state_shardings(state, mesh: jax.sharding.Mesh):
    """Sharding of every leaf of the train state (parameters and optimiser state): replicated."""
    return jax.tree.map(lambda _: replicated(mesh), state)


def put_batch(batch: dict[str, np.ndarray], mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
    """Builds global arrays from this process's rows (all of them on one process)."""
    sharding = batch_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
