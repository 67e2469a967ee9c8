"""The training loop every task shares: check, set up, resume, train, evaluate, checkpoint, report.

A task supplies a `Task` (model factory, batches, loss); the loop owns everything else, so LRA, translation and
MLM have the same workdir layout, resume rules and metrics. Its parts, in the order they run, are described in
docs/architecture.md ("The training loop").
"""

from __future__ import annotations

import json
import os
import time

import jax
import ml_collections
import numpy as np
from etils import epath

from zoo.files import as_path, atomic_write_bytes
from zoo.mixers.softmax import run_softmax_path
from zoo.models import ModelBuilder
from zoo.progress import StepProgress
from zoo.training import flops as flops_lib
from zoo.training import memory
from zoo.training import mesh as mesh_lib
from zoo.training.checkpoints import Checkpointer
from zoo.training.config import check_output_dir, check_resume_config, check_workdir_layout, write_config
from zoo.training.distributed import first_process_then_others
from zoo.training.metrics import MetricWriter, Stopwatch
from zoo.training.optim import make_schedule
from zoo.training.periodic import EVENT_HOOKS, LoopEvent, PeriodicAction, default_actions, tell_hooks
from zoo.training.run import Run, add_sums, evaluate
from zoo.training.signals import PreemptionWatcher
from zoo.training.state import MODEL_FILE, abstract_state, init_state, state_builder
from zoo.training.steps import make_eval_step, make_train_step
from zoo.training.task import Task
from zoo.training.validate import validate_config
from zoo.training.workdir_lock import WorkdirBusy, WorkdirLock


def _finished_results(workdir: epath.Path, restored_step: int, steps: int) -> dict | None:
    """results.json of a workdir whose training and final evaluation are complete (said by process 0), else None."""
    path = workdir / "results.json"
    if restored_step != steps or not path.exists():
        return None
    try:
        results = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # written atomically, so only a hand-edited file gets here: evaluate again
    if results.get("steps") != float(steps):
        return None
    if jax.process_index() == 0:
        print(f"{workdir} already finished {steps} steps; results.json is unchanged", flush=True)
    return results


def finished_run(config: ml_collections.ConfigDict, workdir: epath.Path, task: Task) -> dict | None:
    """results.json of a workdir that has trained and evaluated `config`'s steps, after the checks every run
    passes (a config that would change the run is refused), else None. A finished run is not compiled, and its
    data, state and checkpoints are not touched: re-running a study over finished workdirs costs seconds."""
    steps = config.train.steps
    # Two file lookups first: a run that is not finished goes on to `setup`, whose checks are these.
    if not ((workdir / "checkpoints" / str(steps)).exists() and (workdir / "results.json").exists()):
        return None
    check_run(config, workdir, task)
    return _finished_results(workdir, steps, steps)


def check_batch_rows(train_cfg: ml_collections.ConfigDict, task: Task) -> tuple[int, str]:
    """(rows that every batch is a multiple of, the config field that sets them); errors name the field.
    Token-batched tasks leave train.batch_size at 0: their rows are a multiple of `task.row_multiple`."""
    if task.row_multiple:
        if train_cfg.batch_size:
            raise ValueError(
                f"train.batch_size={train_cfg.batch_size}: this task batches by tokens (data.max_tokens per "
                "batch, rows a multiple of data.row_multiple); leave train.batch_size at 0"
            )
        rows, field = task.row_multiple, "data.row_multiple"
    else:
        rows, field = train_cfg.batch_size, "train.batch_size"
    if rows < 1:
        raise ValueError(f"{field}={rows} must be at least 1")
    if rows % train_cfg.grad_accum_steps:
        raise ValueError(f"{field}={rows} is not divisible by train.grad_accum_steps={train_cfg.grad_accum_steps}")
    return rows, field


def check_run(config: ml_collections.ConfigDict, workdir: epath.Path, task: Task) -> jax.sharding.Mesh:
    """Every check that can fail on a bad config or workdir, before anything is written; returns the mesh."""
    train_cfg = config.train
    check_output_dir(workdir, "--workdir")
    check_workdir_layout(workdir)
    validate_config(config, task.config_sections)
    rows, field = check_batch_rows(train_cfg, task)
    check_resume_config(config, workdir)
    mesh = mesh_lib.make_mesh(config.mesh)
    shards = mesh_lib.batch_shards(mesh)
    if (rows // train_cfg.grad_accum_steps) % shards:
        raise ValueError(
            f"{field} / train.grad_accum_steps = {rows // train_cfg.grad_accum_steps} "
            f"is not divisible by the {shards} data × fsdp shards"
        )
    eval_rows = train_cfg.eval_batch_size or rows
    if not task.row_multiple and eval_rows % shards:
        raise ValueError(
            f"train.eval_batch_size={eval_rows} is not divisible by the {shards} data × fsdp shards "
            "(0 means train.batch_size)"
        )
    return mesh


def setup(config: ml_collections.ConfigDict, workdir: epath.Path, task: Task) -> Run:
    """Every check: the model built abstractly and its state's memory checked, then the data prepared, then the train
    step compiled for the task's largest batch and its memory checked against a device's. Writes nothing in the
    workdir: `open_workdir` does, once this passed."""
    mesh = check_run(config, workdir, task)
    build = state_builder(task.build_model, config.train, config.seed)
    # Process 0 first: mt's and mlm's models take their vocabulary from a tokenizer trained on the data and cached.
    graphdef, abstract = first_process_then_others("build-model", lambda: abstract_state(build))
    rules = mesh_lib.rules_from_config(config.mesh)
    sharding_line = mesh_lib.check_sharding(
        mesh_lib.sharding_report(abstract[0], mesh, rules), config.mesh.sharding_tolerance
    )
    is_writer = jax.process_index() == 0
    if is_writer and mesh_lib.parameter_shards(mesh) > 1:
        print(sharding_line, flush=True)
    state_sharding = mesh_lib.state_shardings(abstract, mesh, rules)
    memory.check_state_fits(abstract, state_sharding, config.train)
    # Generated, read and cached outside the workdir, process 0 first: a missing or malformed data set is reported
    # before the compilation, which can take a minute for a large model.
    first_process_then_others("prepare-data", task.prepare)
    shardings = mesh_lib.step_shardings(mesh, state_sharding)
    train_step = make_train_step(graphdef, task.loss_fn, accum_steps=config.train.grad_accum_steps, **shardings)
    if task.batch_spec is not None:
        if is_writer:
            print("compiling the train step...", flush=True)
        compile_start = time.perf_counter()
        batch = memory.abstract_batch(task, config, mesh)
        compiled = memory.compile_train_step(train_step, abstract, state_sharding, batch)
        need = memory.check_step_fits(compiled, config.train, check_batch_rows(config.train, task)[1])
        if is_writer:
            print(f"compiled in {time.perf_counter() - compile_start:.1f} s; the step needs "
                  f"{need / 2**30:.2f} GiB per device", flush=True)  # fmt: skip
    return Run(
        config=config, workdir=workdir, task=task, mesh=mesh, graphdef=graphdef, state=None,
        state_sharding=state_sharding, train_step=train_step,
        eval_step=make_eval_step(graphdef, task.loss_fn, **shardings),
        # Jitted: evaluated eagerly for the log line, a schedule is a dozen one-op programs, each compiled once.
        schedule=jax.jit(make_schedule(config.train)),
        rng=jax.random.key(config.seed + 1), is_writer=is_writer, build=build,
    )  # fmt: skip


def lock_workdir(run: Run) -> WorkdirLock:
    """Takes the workdir's lock (process 0 for every process of the run); every process raises `WorkdirBusy`
    when another run holds it."""
    lock = WorkdirLock(run.workdir, enabled=run.is_writer)
    if jax.process_count() == 1:
        lock.acquire()
        return lock
    from jax.experimental import multihost_utils

    problem = ""
    if run.is_writer:
        try:
            lock.acquire()
        except WorkdirBusy as e:
            problem = str(e)
    taken = multihost_utils.broadcast_one_to_all(np.int32(problem == ""))
    if not taken:
        raise WorkdirBusy(problem or f"{run.workdir}: process 0 could not take the workdir's lock (its log says why)")
    return lock


def open_workdir(run: Run) -> None:
    """The sharded train state, then config.json, the task's artifacts and the model's recipe (model.json). Call
    with the workdir's lock held (`lock_workdir`)."""
    run.state = init_state(run.build, run.state_sharding)
    if run.is_writer:
        write_config(run.config, run.workdir)
        for name, source in run.task.artifacts().items():
            atomic_write_bytes(run.workdir / name, as_path(source).read_bytes())
        if isinstance(run.task.build_model, ModelBuilder):  # how `load_model` builds the model again
            atomic_write_bytes(run.workdir / MODEL_FILE, json.dumps(run.task.build_model.spec(), indent=1).encode())


def restore(run: Run) -> dict | None:
    """Opens the data iterator and the checkpointer and resumes from the newest checkpoint that restores; a fresh
    run gets the task's warm start. Returns results.json's contents when the workdir has already finished."""
    run.data_iter = iter(run.task.train_batches())
    run.checkpointer = Checkpointer(
        run.workdir / "checkpoints", max_to_keep=run.config.train.keep_checkpoints, writer=True
    )
    abstract = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), run.state, run.state_sharding
    )
    restored = run.checkpointer.restore_latest(abstract, run.data_iter, report=lambda line: print(line, flush=True))
    if restored is None:
        if run.task.warm_start is not None:
            run.state = jax.device_put(run.task.warm_start(run.state), run.state_sharding)
        return None
    run.start_step, run.state, meta = restored
    run.step = run.start_step
    run.load_meta(meta)
    finished = _finished_results(run.workdir, run.start_step, run.steps)
    if finished is not None:  # re-running a finished workdir changes nothing
        run.checkpointer.close()
        return finished
    if run.is_writer:
        print(f"resumed from {run.workdir / 'checkpoints'} at step {run.start_step}", flush=True)
    return None


def _step_flops(run: Run, batch: dict) -> float:
    """Model FLOPs of the global train step on `batch` (every process's share), cached by the batch's shapes."""
    if run.task.model_flops is None:
        return 0.0
    shapes = tuple((k, v.shape) for k, v in sorted(batch.items()))
    if shapes not in run.flops_by_shape:
        run.flops_by_shape[shapes] = run.task.model_flops(batch) * jax.process_count()
    return run.flops_by_shape[shapes]


def start_clock(run: Run) -> Stopwatch:
    """The run's stopwatch, with the devices' peak when the task counts its FLOPs (a CPU measures its own)."""
    if run.task.model_flops is None:
        return Stopwatch()
    peak, source = flops_lib.peak_tflops_per_device(run.config.train)
    if run.is_writer:
        print(f"MFU is measured against {peak:.3g} TFLOP/s per device ({source})", flush=True)
    remeasure = None
    if source == flops_lib.MEASURED_ON_THIS_HOST and run.is_writer:  # the writer's MFU is the one logged

        def remeasure() -> float:
            before = run.watch.peak_flops_per_s / 1e12
            rate = flops_lib.remeasure_cpu_tflops() / jax.local_device_count()
            if rate > before:
                said = (
                    f"MFU came out above 100%: the matmul rate measured again is {rate:.3g} TFLOP/s per device "
                    f"(was {before:.3g}, taken while the cores were slower or busy); MFU is measured against it now"
                )
            else:
                said = (
                    f"MFU came out above 100% and the matmul rate measured again is no higher ({before:.3g} TFLOP/s "
                    "per device): the model's matmuls run faster than the 1,024² one the peak is taken from"
                )
            print(said, flush=True)
            return rate * 1e12

    stated = run.is_writer and source != flops_lib.MEASURED_ON_THIS_HOST  # a measured peak says its own
    return Stopwatch(peak * 1e12, run.mesh.size, remeasure, peak_source=source if stated else "")


def train_steps(run: Run, actions: list[PeriodicAction]) -> None:
    """Train steps from `run.step` to the last, each followed by the periodic actions. Whatever stops the loop, the
    actions are closed and saves under way completed: a good checkpoint is never abandoned half-written."""
    try:
        while run.step < run.steps:
            for action in actions:
                action.before_step(run)
            wait_start = time.perf_counter()
            batch = next(run.data_iter)
            run.watch.waited(time.perf_counter() - wait_start)
            first = run.step == run.start_step and run.is_writer
            if first:
                first_start = time.perf_counter()
            run.state, sums = run.train_step(run.state, mesh_lib.put_batch(batch, run.mesh), run.rng)
            if first:
                jax.block_until_ready(sums)  # once per run: worth a host sync
                print(f"first train step done in {time.perf_counter() - first_start:.1f} s", flush=True)
            run.watch.tick(run.task.count_tokens(batch) * jax.process_count(), _step_flops(run, batch))
            run.pending = add_sums(run.pending, sums)  # stays on device: no host sync per step
            run.progress.update()
            run.step += 1
            for action in actions:
                action.after_step(run)
    finally:
        for action in actions:
            action.close(run)
        run.checkpointer.wait()
        run.progress.close()


def final_evaluation(run: Run, train_seconds: float) -> dict[str, float | str]:
    """Every eval split, logged at the last step; the results (with wall times) written to results.json."""
    results: dict[str, float | str] = {"steps": float(run.steps)}
    for split in run.task.eval_splits:
        metrics = run.evaluate_split(split, final=True)
        run.log(split, metrics)
        results.update({f"{split}_{k}": v for k, v in metrics.items()})
        tell_hooks(run, split)
    # Training time over every run of this workdir up to the last checkpoint, plus this run's; this run's alone.
    results["train_wall_time_s"] = run.earlier_seconds + train_seconds
    results["train_wall_time_this_run_s"] = train_seconds
    results["eval_wall_time_s"] = run.watch.elapsed() - train_seconds  # the final evaluation of every split
    results["resumed_at_step"] = float(run.start_step)
    results["train_steps_run"] = float(run.steps - run.start_step)
    if run.watch.total_flops:  # this run's steps over this run's training wall time
        results["model_flops_per_step"] = run.watch.total_flops / max(run.steps - run.start_step, 1)
        results.update(run.watch.utilisation(run.watch.total_flops, train_seconds))
        results["peak_tflops_per_device"] = run.watch.peak_flops_per_s / 1e12  # re-measured, where it was
    results.update(run.task.final_results(results))
    if (path := run_softmax_path(run.config)) is not None:
        results["softmax_attention"] = path
    if run.is_writer:
        atomic_write_bytes(run.workdir / "results.json", json.dumps(results, indent=2, sort_keys=True).encode())
    return results


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str | os.PathLike,
    task: Task,
    *,
    profile_steps: tuple[int, int] | None = None,
) -> dict[str, float]:
    """Trains `task` for `config.train.steps`, resuming from `workdir` when it holds a checkpoint; writes
    config.json, metrics.jsonl, TensorBoard events, checkpoints/ and results.json there and returns the results.
    `profile_steps=(first, last)`: a `jax.profiler` trace of those train steps in workdir/profile."""
    workdir = as_path(workdir)
    finished = finished_run(config, workdir, task)
    if finished is not None:
        return finished
    run = setup(config, workdir, task)
    lock = lock_workdir(run)
    try:
        open_workdir(run)
        finished = restore(run)
        if finished is not None:
            return finished
        run.writer = MetricWriter(run.workdir, resume_step=run.start_step, final_step=run.steps, enabled=run.is_writer)
        run.progress = StepProgress(run.steps, run.start_step, enabled=run.is_writer)
        run.watch = start_clock(run)
        train_steps(run, default_actions(run, PreemptionWatcher(run.checkpointer.manager), profile_steps))
        train_seconds = run.watch.elapsed()  # the loop alone (compilation, periodic evals, checkpoints included)
        results = final_evaluation(run, train_seconds)
        run.writer.close()
        run.checkpointer.close()
        return results
    finally:
        lock.release()


__all__ = [
    "EVENT_HOOKS", "LoopEvent", "Run", "Task", "check_batch_rows", "check_run", "evaluate", "final_evaluation",
    "finished_run", "lock_workdir", "open_workdir", "restore", "setup", "train_and_evaluate",
    "train_steps",
]  # fmt: skip
