"""Measured training cost of a config: steps/s of real train steps and peak memory per device.

Used by `lra-compare`'s efficiency table: `train_and_evaluate`'s step on a synthetic batch of `task.batch_spec`'s
shapes, compiled, run `warmup` times, then timed over `steps` calls. Memory is the device's peak allocation where
the backend reports one (GPU, TPU), else the compiled step's memory analysis (CPU); `memory_source` says which.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from zoo.training import flops, step_profile
from zoo.training import memory as memory_lib
from zoo.training import mesh as mesh_lib
from zoo.training.state import create_train_state, state_builder
from zoo.training.steps import make_train_step


def synthetic_batch(spec: dict, vocab_size: int, num_classes: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random token ids in [1, vocab), random labels, unit weights, for every array of a batch spec."""
    rng = np.random.default_rng(seed)
    batch = {}
    for name, s in spec.items():
        if name == "targets":
            batch[name] = rng.integers(0, num_classes, s.shape).astype(s.dtype)
        elif name == "weights":
            batch[name] = np.ones(s.shape, s.dtype)
        else:
            batch[name] = rng.integers(1, vocab_size, s.shape).astype(s.dtype)
    return batch


def measure(
    config: ml_collections.ConfigDict,
    task,
    *,
    vocab_size: int,
    num_classes: int,
    steps: int = 5,
    warmup: int = 1,
    profile_dir: str | None = None,
    profile_steps: int = 2,
) -> dict[str, float | str]:
    """{"steps_per_s", "memory_bytes", "memory_source", "compile_s"} of `config.train.batch_size` steps, and where
    the task counts its FLOPs "model_flops_per_step", "tflops_per_s_per_device", "mfu" and "peak_source". With
    `profile_dir`, `profile_steps` more steps (after the timed ones) are traced there with the JAX profiler and
    "op_breakdown" says where their time went (`zoo.training.step_profile`)."""
    mesh = mesh_lib.make_mesh(config.mesh)
    graphdef, state, state_sharding = create_train_state(
        state_builder(task.build_model, config.train, config.seed), mesh, mesh_lib.rules_from_config(config.mesh)
    )
    shardings = mesh_lib.step_shardings(mesh, state_sharding)
    step = make_train_step(graphdef, task.loss_fn, accum_steps=config.train.grad_accum_steps, **shardings)
    batch = mesh_lib.put_batch(synthetic_batch(task.batch_spec(config.train.batch_size), vocab_size, num_classes), mesh)
    key = jax.random.key(0)
    start = time.perf_counter()
    compiled = step.lower(state, batch, key).compile()
    compile_s = time.perf_counter() - start
    for _ in range(warmup):
        state, _ = compiled(state, batch, key)
    jax.block_until_ready(state)  # warmup may be 0
    # A CPU's peak is its matmul rate, measured beside the timed steps: a shared VM's rate drifts within minutes.
    measures_cpu = jax.local_devices()[0].platform == "cpu" and not config.train.get("peak_tflops_per_device", 0.0)
    cpu_rates = [flops.cpu_matmul_tflops()] if measures_cpu else None
    start = time.perf_counter()
    for _ in range(steps):
        state, sums = compiled(state, batch, key)
    jax.block_until_ready((state, sums))
    seconds = time.perf_counter() - start
    if cpu_rates is not None:
        cpu_rates.append(flops.cpu_matmul_tflops())
    if not np.isfinite(float(jnp.asarray(sums["loss"]))):
        raise FloatingPointError("the loss of the timed steps is not finite")
    breakdown = None
    if profile_dir is not None:
        with jax.profiler.trace(profile_dir):
            for _ in range(profile_steps):
                state, sums = compiled(state, batch, key)
            jax.block_until_ready((state, sums))
        breakdown = step_profile.op_breakdown(profile_dir, compiled, profile_steps)
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        memory, source = float(stats["peak_bytes_in_use"]), "device peak allocation"
    else:
        memory, source = float(memory_lib.step_bytes(compiled)), "compiled step's memory analysis"
    result = {"steps_per_s": steps / seconds, "memory_bytes": memory, "memory_source": source, "compile_s": compile_s}
    if task.model_flops is not None:
        step_flops = task.model_flops(batch)
        if cpu_rates is not None:
            peak = max(cpu_rates) / jax.local_device_count()
            peak_source = "float32 matmul rate on this host, best 1 s round just before and just after the timed steps"
        else:
            peak, peak_source = flops.peak_tflops_per_device(config.train)
        result["peak_tflops_per_device"] = peak
        result["model_flops_per_step"] = step_flops
        result["tflops_per_s_per_device"] = step_flops * steps / seconds / mesh.size / 1e12
        if peak:
            result["mfu"] = result["tflops_per_s_per_device"] / peak
        result["peak_source"] = peak_source
    if breakdown is not None:
        result["op_breakdown"] = breakdown
    return result
