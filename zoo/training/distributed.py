"""Distributed start-up, barriers and preemption: everything about several processes, in one place.

`initialize` is called once by every task CLI before JAX touches a device:
  - explicit flags (`--coordinator_address --num_processes --process_id`) win;
  - otherwise the environment decides: SLURM with more than one task, a multi-host Cloud TPU slice
    (JAX detects both itself), or `JAX_COORDINATOR_ADDRESS` + `JAX_NUM_PROCESSES` + `JAX_PROCESS_ID`
    (Kubernetes indexed jobs may give the id as `JOB_COMPLETION_INDEX`);
  - otherwise it is a single process and nothing is started.
CPU collectives go through gloo, so several processes on one machine work too (the tests use that).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TypeVar

import jax

T = TypeVar("T")


class Preempted(Exception):
    """Training stopped at a preemption point after saving a checkpoint; the same command resumes."""

    def __init__(self, step: int):
        super().__init__(f"preempted at step {step}; a checkpoint was saved there. Run the same command to resume.")
        self.step = step


# Exit status for a preempted run: EX_TEMPFAIL, "try again".
PREEMPTED_EXIT_CODE = 75


def detect_cluster(env: Mapping[str, str] = os.environ) -> str | None:
    """ "slurm", "tpu", "env" or None (single process)."""
    if env.get("SLURM_JOB_ID") and int(env.get("SLURM_NTASKS", "1")) > 1:
        return "slurm"
    if "," in env.get("TPU_WORKER_HOSTNAMES", ""):
        return "tpu"
    if env.get("JAX_COORDINATOR_ADDRESS"):
        return "env"
    return None


def _env_process_id(env: Mapping[str, str]) -> int:
    for name in ("JAX_PROCESS_ID", "JOB_COMPLETION_INDEX"):
        if env.get(name, "") != "":
            return int(env[name])
    raise ValueError("JAX_COORDINATOR_ADDRESS is set but neither JAX_PROCESS_ID nor JOB_COMPLETION_INDEX is")


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    heartbeat_timeout_s: int = 100,
    env: Mapping[str, str] = os.environ,
) -> str:
    """Starts the distributed runtime when this run has several processes; returns what it did, in words."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    explicit = (coordinator_address, num_processes, process_id)
    if any(x is not None for x in explicit):
        if any(x is None for x in explicit):
            raise ValueError("--coordinator_address, --num_processes and --process_id must be given together")
        if not 0 <= process_id < num_processes:
            raise ValueError(f"--process_id={process_id} is not in [0, --num_processes={num_processes})")
        jax.distributed.initialize(
            coordinator_address, num_processes, process_id, heartbeat_timeout_seconds=heartbeat_timeout_s
        )
        return f"process {process_id} of {num_processes}, coordinator {coordinator_address}"
    kind = detect_cluster(env)
    if kind == "env":
        address, count, pid = env["JAX_COORDINATOR_ADDRESS"], int(env["JAX_NUM_PROCESSES"]), _env_process_id(env)
        jax.distributed.initialize(address, count, pid, heartbeat_timeout_seconds=heartbeat_timeout_s)
        return f"process {pid} of {count} from the environment, coordinator {address}"
    if kind is not None:
        jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat_timeout_s)
        return f"process {jax.process_index()} of {jax.process_count()} ({kind} cluster)"
    return "single process"


def barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def first_process_then_others(name: str, fn: Callable[[], T]) -> T:
    """Runs `fn` on process 0 first (e.g. caching data), then on the others, which find its files; an error on
    process 0 is raised there after the barrier, so the others are not left waiting."""
    if jax.process_count() == 1:
        return fn()
    if jax.process_index() == 0:
        try:
            result = fn()
        finally:
            barrier(name)
        return result
    barrier(name)
    return fn()
