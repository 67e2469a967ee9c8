"""Memory planning: compile the train step ahead of time for a mesh and report per-device memory.

    lra-train --config=lra_flax/configs/listops.py:lra_code --plan_memory --fake_cpu_devices=8 \\
        --config.mesh.data=2 --config.mesh.fsdp=2 --config.mesh.tensor=2

Parameters and optimiser state are counted from their shardings (bytes of one device's shards);
activations and temporaries come from XLA's memory analysis of the compiled step. With fake CPU
devices the numbers describe the sharded program, not a GPU's allocator; they are for comparing
meshes and configs, not an exact budget.
"""

from __future__ import annotations

import jax
import ml_collections
import numpy as np
from flax import nnx

from zoo.training import mesh as mesh_lib
from zoo.training.state import abstract_state, state_builder
from zoo.training.steps import make_train_step
from zoo.training.validate import validate_config


def _device_bytes(state, shardings) -> int:
    total = 0
    for leaf, sharding in zip(jax.tree.leaves(state), jax.tree.leaves(shardings), strict=True):
        total += int(np.prod(sharding.shard_shape(leaf.shape))) * np.dtype(leaf.dtype).itemsize
    return total


def plan(config: ml_collections.ConfigDict, task) -> dict[str, float]:
    """Per-device bytes of parameters, optimiser state, batch and the compiled step's temporaries."""
    if task.batch_spec is None:
        raise ValueError("this task does not describe its batches (Task.batch_spec), so it cannot be planned")
    validate_config(config)
    mesh = mesh_lib.make_mesh(config.mesh)
    graphdef, abstract = abstract_state(state_builder(task.build_model, config.train, config.seed))
    rules = mesh_lib.rules_from_config(config.mesh)
    sharding = mesh_lib.state_shardings(abstract, mesh, rules)
    report = mesh_lib.sharding_report(abstract[0], mesh, rules)
    model_state, opt_state = abstract[0], abstract[1]
    param_state = nnx.filter_state(model_state, nnx.Param)
    param_sharding = nnx.filter_state(sharding[0], nnx.Param)
    args = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, sharding)
    batch = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=mesh_lib.batch_sharding(mesh))
        for k, v in task.batch_spec(config.train.batch_size).items()
    }
    shardings = mesh_lib.step_shardings(mesh, sharding)
    step = make_train_step(graphdef, task.loss_fn, accum_steps=config.train.grad_accum_steps, **shardings)
    compiled = step.lower(args, batch, jax.eval_shape(lambda: jax.random.key(0))).compile()
    analysis = compiled.memory_analysis()
    return {
        "devices": float(mesh.size),
        "mesh": dict(mesh.shape),
        "parameters": float(_device_bytes(param_state, param_sharding)),
        "optimizer_state": float(_device_bytes(opt_state, sharding[1])),
        "batch": float(sum(int(np.prod(v.sharding.shard_shape(v.shape))) * v.dtype.itemsize for v in batch.values())),
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
