"""Several real processes on localhost (jax.distributed over gloo), and preemption, through `lra-train`."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tests import fault_injection
from tests.lra_flax.test_train_cli import _metrics, _tiny, _train

LOSS_TOL = 1e-5  # two processes reduce in a different order than one


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(workdir, flags, num_processes, envs=None, extra=()):
    port = _port()
    procs = []
    for i in range(num_processes):
        cmd = [sys.executable, "-m", "lra_flax", "--config=lra_flax/configs/listops.py:demo", f"--workdir={workdir}"]
        cmd += [*flags, f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={num_processes}"]
        cmd += [f"--process_id={i}", *extra]
        env = {**os.environ, **((envs or {}).get(i, {}))}
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    return procs


def _wait(procs, timeout=600):
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        out.append((p.returncode, stdout, stderr))
    return out


def _close(a, b):
    assert [(m["step"], m["split"]) for m in a] == [(m["step"], m["split"]) for m in b]
    for x, y in zip(a, b, strict=True):
        assert abs(x["loss"] - y["loss"]) < LOSS_TOL, (x, y)
        assert x["accuracy"] == y["accuracy"], (x, y)


@pytest.mark.slow
def test_two_processes_match_one_and_resume_after_both_are_killed(tmp_path):
    flags = _tiny(tmp_path / "data", **{"train.steps": 8})
    single = _train(tmp_path / "single", flags)
    assert single.returncode == 0, single.stderr[-3000:]

    kill = {i: fault_injection.env(kill_after_step=6) for i in range(2)}
    killed = _wait(_launch(tmp_path / "multi", flags, 2, envs=kill))
    assert [rc for rc, _, _ in killed] == [-9, -9], [e[-2000:] for _, _, e in killed]
    # One checkpoint at step 4, written by both processes (each its own data-iterator state).
    data_dir = tmp_path / "multi" / "checkpoints" / "4" / "data"
    assert {p.name for p in data_dir.glob("process_*")} == {"process_0-of-2.json", "process_1-of-2.json"}
    assert not (tmp_path / "multi" / "checkpoints" / "8").exists()

    resumed = _wait(_launch(tmp_path / "multi", flags, 2))
    assert [rc for rc, _, _ in resumed] == [0, 0], [e[-2000:] for _, _, e in resumed]
    _close(_metrics(tmp_path / "multi"), _metrics(tmp_path / "single"))
    results = [json.loads(stdout[stdout.index("{") :]) for _, stdout, _ in resumed]
    assert results[0]["train_steps_run"] == 4.0  # resumed from step 4
    assert results[0]["test_accuracy"] == results[1]["test_accuracy"]


@pytest.mark.slow
def test_when_one_process_dies_the_other_exits_with_a_clear_error(tmp_path):
    flags = _tiny(tmp_path / "data", **{"train.steps": 100000, "train.checkpoint_every": 1000})
    start = time.monotonic()
    procs = _launch(
        tmp_path / "run", flags, 2, envs={1: fault_injection.env(kill_after_step=3)}, extra=["--heartbeat_timeout_s=10"]
    )
    (rc0, _, err0), (rc1, _, _) = _wait(procs, timeout=300)
    elapsed = time.monotonic() - start
    assert rc1 == -9
    assert rc0 == 3, err0[-3000:]
    assert "process 0 lost contact with another process of the 2-process run" in err0
    assert elapsed < 120, elapsed


@pytest.mark.slow
def test_preemption_saves_and_exits_then_resumes_exactly(tmp_path):
    flags = _tiny(tmp_path / "data", **{"train.steps": 10, "train.checkpoint_every": 8})
    full = _train(tmp_path / "full", flags)
    assert full.returncode == 0, full.stderr[-3000:]

    # SIGTERM after step 5: the loop checkpoints at the next step boundary (6) and exits with 75.
    pre = _train(tmp_path / "pre", flags, env=fault_injection.env(sigterm_after_step=5))
    assert pre.returncode == 75, pre.stderr[-3000:]
    assert "preempted at step 6" in pre.stderr
    assert (tmp_path / "pre" / "checkpoints" / "6").exists()
    assert not (tmp_path / "pre" / "results.json").exists()

    again = _train(tmp_path / "pre", flags)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _metrics(tmp_path / "pre") == _metrics(tmp_path / "full")
    assert json.loads((tmp_path / "pre" / "results.json").read_text())["resumed_at_step"] == 6  # not from 0


@pytest.mark.slow
def test_memory_plan_on_8_fake_devices_shows_fsdp_savings(tmp_path):
    def plan(*mesh):
        cmd = [sys.executable, "-m", "lra_flax", "--config=lra_flax/configs/listops.py:demo", "--plan_memory"]
        cmd += ["--fake_cpu_devices=8", *mesh, f"--config.data.dir={tmp_path / 'never-created'}"]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
        rows = dict(line.strip().split("  ", 1) for line in run.stdout.splitlines() if "  " in line.strip())
        return {k.strip(): v.strip() for k, v in rows.items()}

    data = plan("--config.mesh.data=8")
    fsdp = plan("--config.mesh.data=1", "--config.mesh.fsdp=8")
    mixed = plan("--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2")
    mib = lambda s: float(s.split()[0].replace(",", ""))
    assert data["mesh"] == "data=8, fsdp=1, tensor=1" and mixed["mesh"] == "data=2, fsdp=2, tensor=2"
    assert data["parameters (all devices)"] == fsdp["parameters (all devices)"]
    # FSDP over 8 devices keeps about an eighth of the parameters and optimiser state on each.
    assert mib(fsdp["parameters / device"]) < 0.2 * mib(data["parameters / device"])
    assert mib(fsdp["optimiser state / device"]) < 0.2 * mib(data["optimiser state / device"])
    assert mib(data["optimiser state / device"]) == pytest.approx(2 * mib(data["parameters / device"]), rel=0.01)
    assert mib(mixed["parameters / device"]) < 0.5 * mib(data["parameters / device"])
    assert mib(data["activations + temporaries / device"]) > 0
    assert not (tmp_path / "never-created").exists()  # planning reads no data
