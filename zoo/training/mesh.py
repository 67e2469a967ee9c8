"""Device mesh and shardings: the one place that decides where parameters and batches live.

Axes are (`data`, `fsdp`, `tensor`). Batches are split over data × fsdp, and so are the activations between
blocks (`zoo.layers.common.constrain_batch_sharded`). Parameters carry logical axis names (`zoo.layers.logical`),
which the rules in `config.mesh.rules` (defaults: `LOGICAL_RULES`; "" means replicated) map to mesh axes.

A dimension that its mesh axis does not divide stays whole, so any config runs on any mesh, but never silently:
`sharding_report` measures how much more parameter memory each device holds than an even fsdp × tensor split,
and the loop fails above `config.mesh.sharding_tolerance` (as MaxText's). Optimiser state follows its parameter;
untagged parameters (norms, γ, SGU spatial weights) are replicated.
"""

from __future__ import annotations

import math

import jax
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from zoo.layers.common import BATCH_AXES

AXES = ("data", "fsdp", "tensor")
PARAMETER_AXES = ("fsdp", "tensor")  # what parameters may be split over; `data` holds whole replicas
LOGICAL_RULES = {"embed": "fsdp", "heads": "tensor", "mlp": "tensor", "vocab": "tensor"}
Rules = dict[str, str | None]


def rules_from_config(cfg: ml_collections.ConfigDict) -> Rules:
    """config.mesh.rules as {logical name: mesh axis or None}; "" in the config means replicated."""
    return {name: (axis or None) for name, axis in cfg.rules.items()}


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
    # The same axes as the activations' constraint between blocks.
    return NamedSharding(mesh, P(BATCH_AXES))


def step_shardings(mesh: jax.sharding.Mesh, state_sharding) -> dict:
    """The sharding keywords of `make_train_step` / `make_eval_step`: state as laid out, batches split over
    data × fsdp, metrics replicated."""
    return dict(state_sharding=state_sharding, batch_sharding=batch_sharding(mesh), replicated=replicated(mesh))


def batch_shards(mesh: jax.sharding.Mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]


def parameter_shards(mesh: jax.sharding.Mesh) -> int:
    """Into how many pieces a fully split parameter is cut (fsdp × tensor)."""
    return math.prod(mesh.shape[a] for a in PARAMETER_AXES)


def logical_to_spec(logical_axes, shape, mesh: jax.sharding.Mesh, rules: Rules = LOGICAL_RULES) -> P:
    """PartitionSpec for a parameter of `shape` tagged `logical_axes`, under `rules` and divisibility."""
    if not logical_axes:
        return P()
    if len(logical_axes) != len(shape):
        raise ValueError(f"logical axes {logical_axes} do not match parameter shape {shape}")
    spec, used = [], set()
    for name, dim in zip(logical_axes, shape, strict=True):
        axis = rules.get(name) if name is not None else None
        if axis is None or axis in used or mesh.shape[axis] == 1 or dim % mesh.shape[axis]:
            spec.append(None)
        else:
            spec.append(axis)
            used.add(axis)
    return P(*spec)


def state_shardings(state, mesh: jax.sharding.Mesh, rules: Rules = LOGICAL_RULES):
    """A NamedSharding for every variable of an `nnx.State` (parameters, optimiser state, RNG, buffers)."""

    def sharding(x):
        if isinstance(x, nnx.Variable):
            axes = x.get_metadata().get("logical_axes")
            return x.replace(NamedSharding(mesh, logical_to_spec(axes, x.shape, mesh, rules)))
        return replicated(mesh)

    return jax.tree.map(sharding, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def sharding_report(params: nnx.State, mesh: jax.sharding.Mesh, rules: Rules = LOGICAL_RULES) -> dict:
    """How evenly the parameters (abstract or real) split over the mesh's fsdp × tensor devices.

    excess_fraction: 1 − (even split) / (what one device holds), what MaxText's sharding_tolerance bounds.
    unsplit: "path (shape): logical axis → mesh axis of size n" for each dimension a rule would split but
        the axis size does not divide.
    """
    split_ways = parameter_shards(mesh)
    total = per_device = 0
    unsplit = []
    for path, x in jax.tree_util.tree_leaves_with_path(params, is_leaf=lambda v: isinstance(v, nnx.Variable)):
        if not isinstance(x, nnx.Param):
            continue
        axes = x.get_metadata().get("logical_axes")
        spec = logical_to_spec(axes, x.shape, mesh, rules)
        size = math.prod(x.shape)
        total += size
        per_device += size / math.prod(mesh.shape[a] for a in spec if a is not None)
        for name, dim, got in zip(axes or (), x.shape, tuple(spec) + (None,) * len(x.shape), strict=False):
            want = rules.get(name) if name is not None else None
            if want is not None and got is None and mesh.shape[want] > 1 and dim % mesh.shape[want]:
                where = "/".join(str(getattr(k, "key", k)) for k in path)
                unsplit.append(f"{where} {tuple(x.shape)}: {name} → {want} of size {mesh.shape[want]}")
    excess = 1.0 - (total / split_ways) / per_device if per_device else 0.0
    return dict(parameters=total, per_device=per_device, split_ways=split_ways, excess_fraction=excess, unsplit=unsplit)


def check_sharding(report: dict, tolerance: float) -> str:
    """The report in one line; a ValueError naming the field when its excess is above `tolerance`."""
    line = (
        f"sharding: each device holds {report['per_device'] / 1e6:.3g}M of {report['parameters'] / 1e6:.3g}M "
        f"parameters ({report['split_ways']}-way fsdp × tensor): {100 * report['excess_fraction']:.1f}% above an "
        "even split"
    )
    if report["unsplit"]:
        line += f"; not split (axis size does not divide): {', '.join(report['unsplit'][:6])}"
        line += f" and {len(report['unsplit']) - 6} more" if len(report["unsplit"]) > 6 else ""
    if report["excess_fraction"] > tolerance:
        raise ValueError(
            f"{line}. That exceeds mesh.sharding_tolerance={tolerance}: change the mesh or model sizes so the axes "
            "divide, change mesh.rules, or raise mesh.sharding_tolerance"
        )
    return line


def put_batch(batch: dict[str, np.ndarray], mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
    """Builds global arrays from this process's rows (all of them on one process)."""
    sharding = batch_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in batch.items()}
