"""The training loop's parts, one at a time: check_run, setup, restore, the periodic actions, train_steps and
final_evaluation (zoo/training/loop.py, periodic.py). The whole loop's behaviour (resume equals an uninterrupted
run, preemption, broken checkpoints) is tested in test_training.py and tests/lra_flax/test_train_cli.py."""

import dataclasses
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.zoo.test_training import tiny_loop_run
from zoo.training import loop, memory, periodic
from zoo.training.distributed import Preempted
from zoo.training.metrics import Stopwatch


class FakeCheckpointer:
    def __init__(self):
        self.waited = 0

    def wait(self):
        self.waited += 1

    def check(self):
        pass

    def latest_step(self):
        return 2


def fake_run(steps=10, loss=1.0):
    """What the periodic actions read of a Run, with the calls they make recorded in `calls`."""
    calls = []
    run = types.SimpleNamespace(
        step=0, steps=steps, pending={}, sums={"loss": jnp.float32(loss), "count": jnp.float32(1)},
        checkpointer=FakeCheckpointer(), schedule=lambda step: 0.5 * step, watch=Stopwatch(), calls=calls,
        task=types.SimpleNamespace(eval_splits=("valid", "test")), is_writer=True, state={}, workdir=None,
    )  # fmt: skip
    run.log = lambda split, metrics: calls.append(("log", run.step, split, dict(metrics)))
    run.evaluate_split = lambda split, final: calls.append(("evaluate", run.step, split, final)) or {"loss": 0.5}
    run.save_checkpoint = lambda: calls.append(("save", run.step))
    return run


def drive(action, run, until):
    """Steps 1..until as the loop runs them: each adds its metric sums to `pending`."""
    for step in range(1, until + 1):
        action.before_step(run)
        run.step = step
        run.pending = {k: run.pending.get(k, 0) + v for k, v in run.sums.items()}
        action.after_step(run)


def test_log_train_logs_every_n_steps_and_the_last_and_resets_the_sums():
    run = fake_run(steps=7)
    drive(periodic.LogTrain(every=3), run, 7)
    logged = [(c[1], c[2]) for c in run.calls]
    assert logged == [(3, "train"), (6, "train"), (7, "train")]
    metrics = run.calls[0][3]
    assert metrics["loss"] == 1.0 and run.calls[1][3]["loss"] == 1.0  # means over the steps since the last line
    assert metrics["loss"] == 1.0 and metrics["learning_rate"] == 1.0  # the rate of step 3's update: schedule(2)
    assert {"steps_per_sec", "tokens_per_sec", "input_wait_fraction"} <= set(metrics)
    assert run.pending == {}


def test_log_train_stops_on_a_non_finite_loss_after_waiting_for_saves():
    run = fake_run(loss=float("nan"))
    with pytest.raises(FloatingPointError, match=r"training loss became nan by step 2; nothing was checkpointed after"):
        drive(periodic.LogTrain(every=2), run, 2)
    assert run.checkpointer.waited == 1


def test_evaluate_every_uses_the_first_split_and_leaves_the_last_step_to_the_final_evaluation():
    run = fake_run(steps=6)
    drive(periodic.EvaluateEvery(every=2), run, 6)
    evaluated = [c[:4] for c in run.calls if c[0] == "evaluate"]
    assert evaluated == [("evaluate", 2, "valid", False), ("evaluate", 4, "valid", False)]
    assert [c[:3] for c in run.calls if c[0] == "log"] == [("log", 2, "valid"), ("log", 4, "valid")]
    run = fake_run(steps=6)
    drive(periodic.EvaluateEvery(every=0), run, 6)
    assert run.calls == []


class FakePreemption:
    def __init__(self, at):
        self.at, self.closed = at, False

    def reached(self, step):
        return step >= self.at

    def close(self):
        self.closed = True


def test_checkpoint_every_saves_on_schedule_at_the_end_and_on_preemption():
    run = fake_run(steps=7)
    action = periodic.CheckpointEvery(every=3, preemption=FakePreemption(at=99))
    drive(action, run, 7)
    assert run.calls == [("save", 3), ("save", 6), ("save", 7)]
    run = fake_run(steps=7)
    action = periodic.CheckpointEvery(every=3, preemption=FakePreemption(at=4))
    with pytest.raises(Preempted):
        drive(action, run, 7)
    assert run.calls == [("save", 3), ("save", 4)] and run.checkpointer.waited == 1  # saved, then stopped
    action.close(run)
    assert action.preemption.closed


def test_profile_steps_traces_exactly_the_steps_asked_for(monkeypatch, tmp_path):
    events = []
    monkeypatch.setattr(jax.profiler, "start_trace", lambda path: events.append(("start", path)))
    monkeypatch.setattr(jax.profiler, "stop_trace", lambda: events.append(("stop",)))
    run = fake_run(steps=10)
    run.workdir = tmp_path
    action = periodic.ProfileSteps(first=3, last=5)
    steps_seen = []
    for step in range(1, 8):
        action.before_step(run)
        steps_seen.append((step, action.tracing))
        run.step = step
        action.after_step(run)
    assert events == [("start", str(tmp_path / "profile")), ("stop",)]
    assert [s for s, tracing in steps_seen if tracing] == [3, 4, 5]
    # Stopped by an error mid-trace: close() ends the trace.
    events.clear()
    run.step = 0
    action = periodic.ProfileSteps(first=1, last=5)
    action.before_step(run)
    action.close(run)
    assert events == [("start", str(tmp_path / "profile")), ("stop",)] and not action.tracing


def test_check_run_writes_nothing_on_a_bad_config(tmp_path):
    config, task = tiny_loop_run(4)
    config.train.steps = -5
    with pytest.raises(ValueError, match=r"train.steps=-5 must be an integer in \[0, 1,000,000,000\]"):
        loop.check_run(config, tmp_path / "run", task)
    assert not (tmp_path / "run").exists()
    config.train.steps = 4
    mesh = loop.check_run(config, tmp_path / "run", task)
    assert mesh.devices.size == 1 and not (tmp_path / "run").exists()


def test_setup_builds_the_model_then_prepares_the_data_then_compiles_and_writes_nothing_then_open_workdir_writes(
    tmp_path, monkeypatch
):
    events = []
    compile_train_step = memory.compile_train_step
    monkeypatch.setattr(memory, "compile_train_step", lambda *a: events.append("compile") or compile_train_step(*a))

    def recorded(task):
        return dataclasses.replace(task, build_model=lambda rngs: events.append("build") or task.build_model(rngs))

    def missing_data():
        events.append("prepare")
        raise FileNotFoundError("data.dir=typo has no ListOps TSVs")

    config, task = tiny_loop_run(4, prepare=missing_data)
    with pytest.raises(FileNotFoundError, match="data.dir=typo"):  # said before the compilation, not after it
        loop.setup(config, tmp_path / "run", recorded(task))
    assert events[0] == "build" and events[-1] == "prepare" and "compile" not in events, events
    assert not (tmp_path / "run").exists()

    events.clear()
    config, task = tiny_loop_run(4, prepare=lambda: events.append("prepare") or {})
    config.train.device_memory_gib = 1e-6  # a state that cannot fit is refused before any data is prepared
    with pytest.raises(ValueError, match="parameters and optimiser state need.*Nothing was written"):
        loop.setup(config, tmp_path / "run", recorded(task))
    assert "prepare" not in events and "build" in events

    events.clear()
    config, task = tiny_loop_run(4, prepare=lambda: events.append("prepare") or {})
    run = loop.setup(config, tmp_path / "run", recorded(task))
    assert events[0] == "build" and events.count("prepare") == 1 and events[-1] == "compile", events
    assert events.index("prepare") > max(i for i, e in enumerate(events) if e == "build")
    assert not (tmp_path / "run").exists() and run.state is None
    loop.open_workdir(run)
    assert (tmp_path / "run/config.json").exists() and run.state is not None
    assert run.step == run.start_step == 0 and run.steps == 4 and run.pending == {}
    assert run.data_iter is None and run.checkpointer is None  # opened by restore


def test_restore_warm_starts_a_fresh_run_resumes_a_partial_one_and_returns_a_finished_ones_results(tmp_path):
    def warm(state):
        return jax.tree.map(lambda x: x * 0 if jnp.issubdtype(x.dtype, jnp.floating) else x, state)

    config, task = tiny_loop_run(4, warm_start=warm)
    run = loop.setup(config, tmp_path / "run", task)
    loop.open_workdir(run)
    assert loop.restore(run) is None and run.data_iter is not None
    leaves = [x for x in jax.tree.leaves(run.state) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert all(float(jnp.abs(x).max()) == 0 for x in leaves)  # the warm start was applied
    run.checkpointer.close()

    config, task = tiny_loop_run(4)
    config.train.schedule = "constant"  # so that train.steps may grow on resume
    results = loop.train_and_evaluate(config, tmp_path / "done", task)
    run = loop.setup(config, tmp_path / "done", task)
    loop.open_workdir(run)
    assert loop.restore(run) == results == json.loads((tmp_path / "done/results.json").read_text())

    # train_and_evaluate returns a finished run's results before compiling anything or opening the workdir
    assert loop.finished_run(config, tmp_path / "done", task) == results
    config.train.steps = 6  # the same workdir, trained further: resumes at its last checkpoint (step 4)
    assert loop.finished_run(config, tmp_path / "done", task) is None
    run = loop.setup(config, tmp_path / "done", task)
    loop.open_workdir(run)
    assert loop.restore(run) is None and run.step == run.start_step == 4
    assert run.earlier_seconds > 0 and isinstance(run.pending, dict)
    run.checkpointer.close()


class Recorder(periodic.PeriodicAction):
    def __init__(self, fail_at=None):
        self.seen, self.fail_at, self.closed = [], fail_at, False

    def before_step(self, run):
        self.seen.append(("before", run.step))

    def after_step(self, run):
        self.seen.append(("after", run.step))
        if run.step == self.fail_at:
            raise RuntimeError("stop here")

    def close(self, run):
        self.closed = True


def test_train_steps_calls_every_action_around_every_step_and_closes_them_on_errors(tmp_path):
    config, task = tiny_loop_run(3)
    run = loop.setup(config, tmp_path / "run", task)
    loop.open_workdir(run)
    loop.restore(run)
    run.progress = types.SimpleNamespace(update=lambda: None, close=lambda: None)
    state0 = run.state
    recorder = Recorder()
    loop.train_steps(run, [recorder])
    assert recorder.seen == [("before", 0), ("after", 1), ("before", 1), ("after", 2), ("before", 2), ("after", 3)]
    assert recorder.closed and run.step == 3 and float(run.pending["count"]) == 24  # 3 batches of 8, summed
    pairs = zip(jax.tree.leaves(state0), jax.tree.leaves(run.state), strict=True)
    assert not all(np.array_equal(a, b) for a, b in pairs)  # the steps trained
    run.checkpointer.close()

    run = loop.setup(config, tmp_path / "run2", task)
    loop.open_workdir(run)
    loop.restore(run)
    run.progress = types.SimpleNamespace(update=lambda: None, close=lambda: None)
    recorder = Recorder(fail_at=2)
    with pytest.raises(RuntimeError, match="stop here"):
        loop.train_steps(run, [recorder])
    assert recorder.closed and run.step == 2
    run.checkpointer.close()


def test_final_evaluation_evaluates_every_split_and_writes_results(tmp_path):
    config, task = tiny_loop_run(2, final_results=lambda results: {"extra": 1.0})
    run = loop.setup(config, tmp_path / "run", task)
    loop.open_workdir(run)
    loop.restore(run)
    logged = []
    run.log = lambda split, metrics: logged.append(split)
    results = loop.final_evaluation(run, train_seconds=1.5)
    assert logged == ["valid", "test"]
    assert {"valid_loss", "valid_accuracy", "test_loss", "test_accuracy", "test_examples"} <= set(results)
    assert results["train_wall_time_this_run_s"] == 1.5 and results["extra"] == 1.0 and results["steps"] == 2.0
    assert json.loads((tmp_path / "run/results.json").read_text()) == results
    run.checkpointer.close()
