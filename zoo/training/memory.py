"""Memory planning and the memory check: compile the train step ahead of time and count per-device bytes.

Every run compiles its train step this way before it writes anything, and refuses one that needs more memory
than a device has (`check_step_fits`). `--plan_memory` prints the plan instead of training:

    lra-train --config=lra_flax/configs/listops.py:lra_code --plan_memory --fake_cpu_devices=8 \\
        --config.mesh.data=2 --config.mesh.fsdp=2 --config.mesh.tensor=2

Parameters and optimiser state are counted from their shardings; activations and temporaries come from XLA's
memory analysis of the compiled step. With fake CPU devices the numbers are for comparing meshes and configs,
not an exact budget.
"""

from __future__ import annotations

import os

import jax
import ml_collections
import numpy as np
from flax import nnx

from zoo.training import mesh as mesh_lib
from zoo.training.state import abstract_state, state_builder
from zoo.training.steps import make_train_step
from zoo.training.validate import validate_config


def _device_bytes(tree, shardings) -> int:
    # leaf.dtype.itemsize, not np.dtype(...): RNG key arrays (a redrawn feature map's stream) have JAX's own dtype.
    pairs = zip(jax.tree.leaves(tree), jax.tree.leaves(shardings), strict=True)
    return sum(int(np.prod(sharding.shard_shape(leaf.shape))) * leaf.dtype.itemsize for leaf, sharding in pairs)


def abstract_batch(task, config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> dict:
    """The task's largest train batch as sharded ShapeDtypeStructs (what the train step is compiled for)."""
    if task.batch_spec is None:
        raise ValueError("this task does not describe its batches (Task.batch_spec), so it cannot be planned")
    sharding = mesh_lib.batch_sharding(mesh)
    spec = task.batch_spec(config.train.batch_size)
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding) for k, v in spec.items()}


def compile_train_step(train_step, abstract, state_sharding, batch: dict):
    """The train step compiled ahead of time for the sharded state and `batch` (jit keeps the executable, so
    the first real step with these shapes does not compile again)."""
    args = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, state_sharding)
    return train_step.lower(args, batch, jax.eval_shape(lambda: jax.random.key(0))).compile()


def step_bytes(compiled) -> int:
    """Peak bytes one device holds while the compiled step runs (XLA's memory analysis): arguments and outputs,
    less the donated buffers the outputs reuse, temporaries and code."""
    a = compiled.memory_analysis()
    if a is None:  # a backend without the analysis
        return 0
    return int(
        a.argument_size_in_bytes + a.output_size_in_bytes - a.alias_size_in_bytes + a.temp_size_in_bytes
        + a.generated_code_size_in_bytes
    )  # fmt: skip


def _available_host_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def device_memory_limit(train: ml_collections.ConfigDict) -> tuple[int | None, str]:
    """(bytes one device may use, where the figure comes from); None when nothing says."""
    if train.device_memory_gib:
        return int(train.device_memory_gib * 2**30), "train.device_memory_gib"
    device = jax.local_devices()[0]
    try:
        stats = device.memory_stats() or {}
    except Exception:  # some backends do not implement it
        stats = {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"the {device.device_kind}'s allocator limit"
    available = _available_host_bytes()
    if available is None:
        return None, "unknown"
    # CPU devices (fake ones included) share the host's memory.
    return available // jax.local_device_count(), f"the host's available memory ÷ {jax.local_device_count()} devices"


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB"


def check_state_fits(abstract, state_sharding, train: ml_collections.ConfigDict) -> None:
    """Refuses, before anything is compiled, a model whose parameters and optimiser state alone exceed a device."""
    limit, source = device_memory_limit(train)
    held = _device_bytes(abstract, state_sharding)
    if limit is not None and held > limit:
        raise ValueError(
            f"the parameters and optimiser state need {_gib(held)} per device, more than the {_gib(limit)} of "
            f"{source}: lower model.d_model, model.mlp_dim or model.num_layers, or split the parameters over more "
            "devices (mesh.fsdp, mesh.tensor); train.device_memory_gib overrides the limit. Nothing was written."
        )


def check_step_fits(compiled, train: ml_collections.ConfigDict, batch_field: str) -> int:
    """Refuses a compiled train step that needs more memory than a device has; returns the bytes it needs."""
    limit, source = device_memory_limit(train)
    need = step_bytes(compiled)
    if limit is not None and need > limit:
        raise ValueError(
            f"the train step needs {_gib(need)} per device (XLA's memory analysis of the compiled step), more than "
            f"the {_gib(limit)} of {source}: lower {batch_field} or model.max_length, raise train.grad_accum_steps, "
            "set model.remat, or use more devices; train.device_memory_gib overrides the limit. Nothing was written."
        )
    return need


def plan(config: ml_collections.ConfigDict, task) -> dict[str, float]:
    """Per-device bytes of parameters, optimiser state, batch and the compiled step's temporaries."""
    validate_config(config, task.config_sections)
    mesh = mesh_lib.make_mesh(config.mesh)
    graphdef, abstract = abstract_state(state_builder(task.build_model, config.train, config.seed))
    rules = mesh_lib.rules_from_config(config.mesh)
    sharding = mesh_lib.state_shardings(abstract, mesh, rules)
    report = mesh_lib.sharding_report(abstract[0], mesh, rules)
    param_state = nnx.filter_state(abstract[0], nnx.Param)
    batch = abstract_batch(task, config, mesh)
    shardings = mesh_lib.step_shardings(mesh, sharding)
    step = make_train_step(graphdef, task.loss_fn, accum_steps=config.train.grad_accum_steps, **shardings)
    analysis = compile_train_step(step, abstract, sharding, batch).memory_analysis()
    return {
        "devices": float(mesh.size),
        "mesh": dict(mesh.shape),
        "parameters": float(_device_bytes(param_state, nnx.filter_state(sharding[0], nnx.Param))),
        "optimizer_state": float(_device_bytes(abstract[1], sharding[1])),
        "batch": float(_device_bytes(batch, {k: v.sharding for k, v in batch.items()})),
        "activations_and_temporaries": float(analysis.temp_size_in_bytes),
        "parameter_count": float(sum(int(np.prod(x.shape)) for x in jax.tree.leaves(param_state))),
        "sharding_excess": report["excess_fraction"],
        "sharding_tolerance": float(config.mesh.sharding_tolerance),
        "unsplit": report["unsplit"],
    }


def format_plan(p: dict) -> str:
    mib = 1024**2
    rows = [
        ("mesh", ", ".join(f"{k}={v}" for k, v in p["mesh"].items())),
        ("parameters (all devices)", f"{int(p['parameter_count']):,}"),
        ("parameters / device", f"{p['parameters'] / mib:,.2f} MiB"),
        ("optimiser state / device", f"{p['optimizer_state'] / mib:,.2f} MiB"),
        ("batch / device", f"{p['batch'] / mib:,.2f} MiB"),
        ("activations + temporaries / device", f"{p['activations_and_temporaries'] / mib:,.2f} MiB"),
        (
            "parameters above an even split",
            f"{100 * p['sharding_excess']:.1f}% (mesh.sharding_tolerance {100 * p['sharding_tolerance']:.0f}%"
            + (": training would refuse this mesh)" if p["sharding_excess"] > p["sharding_tolerance"] else ")"),
        ),
        *(("  not split", u) for u in p["unsplit"]),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
