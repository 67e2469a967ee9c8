"""Distributed start-up decisions (jax.distributed.initialize is recorded, not run)."""

import jax
import pytest

from zoo.training import distributed


@pytest.fixture
def calls(monkeypatch):
    recorded = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: recorded.append((a, k)))
    return recorded


@pytest.mark.parametrize(
    "env, kind",
    [
        ({}, None),
        ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"}, None),  # one task: single process
        ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "16"}, "slurm"),
        ({"TPU_WORKER_HOSTNAMES": "localhost"}, None),  # a single-host TPU VM
        ({"TPU_WORKER_HOSTNAMES": "10.0.0.2,10.0.0.3"}, "tpu"),
        ({"JAX_COORDINATOR_ADDRESS": "head:1234"}, "env"),
    ],
)
def test_detect_cluster(env, kind):
    assert distributed.detect_cluster(env) == kind


def test_explicit_flags(calls):
    how = distributed.initialize("127.0.0.1:5000", 4, 2, heartbeat_timeout_s=7, env={})
    assert calls == [(("127.0.0.1:5000", 4, 2), {"heartbeat_timeout_seconds": 7})]
    assert how == "process 2 of 4, coordinator 127.0.0.1:5000"


def test_explicit_flags_must_be_complete_and_consistent(calls):
    with pytest.raises(ValueError, match="must be given together"):
        distributed.initialize("127.0.0.1:5000", 4, None, env={})
    with pytest.raises(ValueError, match=r"--process_id=4 is not in \[0, --num_processes=4\)"):
        distributed.initialize("127.0.0.1:5000", 4, 4, env={})
    assert calls == []


def test_environment_kubernetes_indexed_job(calls):
    env = {"JAX_COORDINATOR_ADDRESS": "job-0.svc:1234", "JAX_NUM_PROCESSES": "8", "JOB_COMPLETION_INDEX": "5"}
    distributed.initialize(env=env, heartbeat_timeout_s=30)
    assert calls == [(("job-0.svc:1234", 8, 5), {"heartbeat_timeout_seconds": 30})]
    with pytest.raises(ValueError, match="neither JAX_PROCESS_ID nor JOB_COMPLETION_INDEX"):
        distributed.initialize(env={"JAX_COORDINATOR_ADDRESS": "x:1", "JAX_NUM_PROCESSES": "2"})


def test_slurm_lets_jax_detect(calls):
    distributed.initialize(env={"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2"})
    assert calls == [((), {"heartbeat_timeout_seconds": 100})]


def test_single_process_starts_nothing(calls):
    assert distributed.initialize(env={}) == "single process"
    assert calls == []
