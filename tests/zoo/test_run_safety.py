"""What keeps a run from harming its workdir or the machine: the memory check before anything is written,
config.json written only by a run that passed it, one run per workdir (the lock), and stop signals honoured at
every phase (zoo/training/memory.py, workdir_lock.py, signals.py)."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from tests.zoo.test_training import tiny_loop_run
from zoo.training import loop, memory, workdir_lock
from zoo.training.config import check_resume_config, has_run_output, write_config
from zoo.training.validate import config_problems
from zoo.training.workdir_lock import WorkdirBusy, WorkdirLock

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_step_that_needs_more_memory_than_a_device_is_refused_before_anything_is_written(tmp_path):
    config, task = tiny_loop_run(4)
    config.train.device_memory_gib = 1e-5  # about 10 KB: far below the tiny model's step
    with pytest.raises(ValueError, match=r"the (train step|parameters and optimiser state) need.*GiB per device.*"
                       r"train.device_memory_gib.*Nothing was written"):  # fmt: skip
        loop.train_and_evaluate(config, tmp_path / "run", task)
    assert not (tmp_path / "run").exists()


def test_the_step_check_names_the_batch_field_and_the_measured_bytes(tmp_path):
    config, task = tiny_loop_run(4)
    run = loop.setup(config, tmp_path / "run", task)
    batch = memory.abstract_batch(task, config, run.mesh)
    from zoo.training.state import abstract_state

    compiled = memory.compile_train_step(run.train_step, abstract_state(run.build)[1], run.state_sharding, batch)
    need = memory.step_bytes(compiled)
    # Above the parameters and optimiser state alone (three float32 copies of every parameter at least).
    params = sum(int(x.size) for x in __import__("jax").tree.leaves(abstract_state(run.build)[1][0]))
    assert need > 3 * 4 * params
    config.train.device_memory_gib = (need - 1) / 2**30
    with pytest.raises(ValueError, match=r"lower train.batch_size or model.max_length"):
        memory.check_step_fits(compiled, config.train, "train.batch_size")
    config.train.device_memory_gib = (need + 1) / 2**30
    assert memory.check_step_fits(compiled, config.train, "train.batch_size") == need


def test_size_fields_have_upper_bounds_and_floats_must_be_finite():
    config, _ = tiny_loop_run(4)
    config.train.batch_size = 10**9
    config.model.num_layers = 10**6
    config.model.d_model = 10**9
    config.model.max_length = 10**9
    config.train.eps = float("nan")
    config.model.position_init_stddev = float("inf")
    problems = "\n".join(config_problems(config))
    for line in (
        "train.batch_size=1000000000 must be an integer in [0, 1,048,576]",
        "model.num_layers=1000000 must be an integer in [1, 1,024]",
        "model.d_model=1000000000 must be an integer in [1, 65,536]",
        "model.max_length=1000000000 must be an integer in [1, 1,048,576]",
        "train.eps=nan must be a number > 0",
        "model.position_init_stddev=inf must be a number ≥ 0",
    ):
        assert line in problems


def test_config_json_of_a_run_without_checkpoints_or_results_is_replaced_but_a_trained_ones_is_kept(tmp_path):
    config, _ = tiny_loop_run(4)
    write_config(config, tmp_path)
    changed = config.copy_and_resolve_references()
    changed.model.d_model = 2 * config.model.d_model
    assert not has_run_output(tmp_path)
    check_resume_config(changed, tmp_path)  # nothing was trained under the old config: accepted
    (tmp_path / "checkpoints" / "4").mkdir(parents=True)
    assert has_run_output(tmp_path)
    with pytest.raises(ValueError, match=r"model.d_model"):
        check_resume_config(changed, tmp_path)


def test_the_lock_names_its_holder_and_a_second_holder_is_refused(tmp_path):
    with WorkdirLock(tmp_path / "run") as lock:
        holder = json.loads(lock.path.read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname() and holder["started"]
        with pytest.raises(WorkdirBusy, match=rf"is in use by process {os.getpid()} on {socket.gethostname()} since"):
            WorkdirLock(tmp_path / "run").acquire()
    assert not (tmp_path / "run" / "lock").exists()


def test_a_stale_lock_is_taken_over_and_a_fresh_one_from_another_host_is_not(tmp_path, capsys):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = tmp_path / "lock"
    path.write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead.stdout), "started": "then"}))
    with WorkdirLock(tmp_path):
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert f"process {int(dead.stdout)} no longer exists" in capsys.readouterr().out

    path.write_text(json.dumps({"host": "elsewhere", "pid": 1, "started": "then"}))
    with pytest.raises(WorkdirBusy, match="process 1 on elsewhere"):
        WorkdirLock(tmp_path).acquire()
    old = time.time() - workdir_lock.STALE_AFTER_S - 60
    os.utime(path, (old, old))  # its holder stopped refreshing it
    with WorkdirLock(tmp_path):
        assert json.loads(path.read_text())["host"] == socket.gethostname()
    assert "not refreshed for" in capsys.readouterr().out

    path.write_bytes(b"\x00garbage")  # a lock cut short as it was written, or no lock at all
    with pytest.raises(WorkdirBusy, match=r"in use by a run whose lock file cannot be read \(.*until 10 minutes old\)"):
        WorkdirLock(tmp_path).acquire()
    os.utime(path, (old, old))
    with WorkdirLock(tmp_path):
        assert json.loads(path.read_text())["pid"] == os.getpid()


def test_a_run_holds_the_lock_while_it_trains_and_releases_it_after_an_error(tmp_path):
    config, task = tiny_loop_run(3)
    seen = []

    def hook(event):
        seen.append((tmp_path / "run" / "lock").exists())
        raise RuntimeError("stop here")

    loop.EVENT_HOOKS.append(hook)
    try:
        with pytest.raises(RuntimeError, match="stop here"):
            loop.train_and_evaluate(config, tmp_path / "run", task)
    finally:
        loop.EVENT_HOOKS.remove(hook)
    assert seen == [True] and not (tmp_path / "run" / "lock").exists()


def _stop_script(in_loop: bool, grace_s: float) -> str:
    # A process that installs the stop handlers, then either waits in Python outside the loop (a signal must
    # stop it at once with Interrupted) or marks itself in the loop and never reaches a step boundary (the
    # deadline must end it).
    return textwrap.dedent(f"""
        import sys, time
        from zoo.training import signals
        signals.STOP.grace_s = {grace_s}
        signals.STOP.install()
        signals.STOP.in_loop = {in_loop}
        try:
            print("ready", flush=True)
            while True:
                time.sleep(0.01)
        except signals.Interrupted as e:
            print(e, flush=True)
            sys.exit(e.exit_code)
    """)


def _started(in_loop: bool, grace_s: float) -> subprocess.Popen:
    """`_stop_script` running, its handlers installed (it said "ready")."""
    proc = subprocess.Popen([sys.executable, "-c", _stop_script(in_loop, grace_s)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_outside_the_loop_stops_at_once_with_128_plus_its_number(signum):
    proc = _started(in_loop=False, grace_s=30)
    start = time.monotonic()
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signum and time.monotonic() - start < 5, err
    assert f"stopped by {signal.Signals(signum).name} before the command finished" in out


def test_a_loop_that_never_reaches_a_step_boundary_is_ended_by_the_deadline():
    proc = _started(in_loop=True, grace_s=1.0)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    elapsed = time.monotonic() - start
    assert proc.returncode == 128 + signal.SIGTERM and 0.9 < elapsed < 10, (elapsed, err)
    assert "SIGTERM: stopping after this step with a checkpoint" in out
    assert "still running 1 s after the signal" in err


def test_a_second_signal_in_the_loop_exits_at_once_and_says_so():
    proc = _started(in_loop=True, grace_s=30)
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.stdout.readline().startswith("SIGINT: stopping after this step with a checkpoint")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGINT and time.monotonic() - start < 10, err  # not the 30 s deadline
    assert "SIGINT again: exiting now without waiting; the last complete checkpoint stands" in err


def test_a_signal_during_a_long_xla_computation_exits_at_once():
    # Outside the loop (a final evaluation's decoding batch): the command must not wait for the computation, which
    # a normal interpreter exit does, with the deadline's thread unable to run.
    script = textwrap.dedent("""
        import jax, jax.numpy as jnp
        from zoo.training import signals
        signals.STOP.install()

        @jax.jit
        def slow(x):  # tens of seconds on two cores
            return jax.lax.fori_loop(0, 3000, lambda i, x: jnp.tanh(x @ x), x)

        x = jnp.full((1024, 1024), 1e-3)
        slow(jnp.ones((8, 8))).block_until_ready()  # compiled
        print("ready", flush=True)
        try:
            slow(x).block_until_ready()
        except signals.Interrupted as e:
            signals.exit_interrupted("test", e)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM and time.monotonic() - start < 5, (time.monotonic() - start, err)
    assert "test: stopped by SIGTERM before the command finished; nothing was lost" in err
