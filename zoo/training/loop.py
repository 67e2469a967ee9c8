"""The training loop every task shares: build, resume, train, evaluate, checkpoint, report.

A task supplies a `Task` (model factory, batches, loss); the loop owns everything else, so LRA,
translation and MLM behave the same: same workdir layout, same resume rules, same metrics.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from etils import epath
from flax import nnx

from zoo.files import as_path, atomic_write_bytes
from zoo.progress import WorkProgress
from zoo.training import mesh as mesh_lib
from zoo.training.checkpoints import Checkpointer
from zoo.training.config import check_output_dir, check_resume_config, write_config
from zoo.training.distributed import Preempted, PreemptionWatcher, first_process_then_others
from zoo.training.metrics import MetricWriter, Progress, Stopwatch, summarise
from zoo.training.optim import make_schedule
from zoo.training.state import abstract_state, create_train_state, state_builder
from zoo.training.steps import LossFn, make_eval_step, make_train_step
from zoo.training.validate import validate_config


@dataclasses.dataclass(frozen=True)
class LoopEvent:
    """What the loop tells `EVENT_HOOKS`: train step `step` is done (its checkpoint, if any, started), or the
    final evaluation of `split` is logged. `wait_for_checkpoints` blocks until every save has completed."""

    step: int
    split: str | None
    wait_for_checkpoints: Callable[[], None]


# Called in order with every LoopEvent. Empty in production; tests add fault injection here (a crash or
# a preemption notice at a chosen point) and clear it again.
EVENT_HOOKS: list[Callable[[LoopEvent], None]] = []


def _tell_hooks(step: int, split: str | None, checkpointer: Checkpointer) -> None:
    for hook in EVENT_HOOKS:
        hook(LoopEvent(step, split, checkpointer.wait))


@dataclasses.dataclass(frozen=True)
class Task:
    """What a task gives the loop.

    build_model:   rngs → the model (an `nnx.Module`).
    train_batches: () → an infinite `grain.IterDataset` of numpy batches with a `weights` field.
    eval_batches:  split name → a finite iterable of padded batches (same shapes every batch).
    loss_fn:       (model, batch, rngs, train) → (objective sum, metric sums); see `zoo.training.losses`.
    count_tokens:  batch → number of real input tokens (for tokens/s).
    eval_splits:   splits evaluated during training (first one) and at the end (all).
    row_multiple:  0 for fixed batches of train.batch_size examples; > 0 for tasks that batch by tokens
                   (translation: data.max_tokens), whose batches hold a varying number of rows, always a
                   multiple of this; train.batch_size must then be 0.
    prepare:       () → {split: cached example file}; generates/caches data (process 0 first). Called
                   before anything is written to the workdir, so bad data leaves it untouched. Cached.
    batch_spec:    global batch size → {field: ShapeDtypeStruct}, for planning without data.
    artifacts:     () → {file name: path}; copied into the workdir with config.json (e.g. the tokenizer).
    generate_eval: (model in eval mode, split, workdir or None) → extra metrics (e.g. BLEU of decoded
                   output); called after each evaluation; `workdir` is given only at the end of training,
                   for files the task writes there (e.g. hypotheses). Text values (e.g. a metric's
                   signature) go to results.json only, not to the logs.
    final_results: results → entries added to results.json under names of the task's choosing.
    warm_start:    fresh train state → the state to start from (e.g. a pretrained encoder's parameters put
                   in place); applied once, before step 0, never on resume.
    """

    build_model: Callable[[nnx.Rngs], nnx.Module]
    train_batches: Callable[[], grain.IterDataset]
    eval_batches: Callable[[str], Iterable[dict]]
    loss_fn: LossFn
    count_tokens: Callable[[dict], int] = lambda batch: int(np.count_nonzero(batch["inputs"]))
    eval_splits: tuple[str, ...] = ("valid", "test")
    prepare: Callable[[], dict[str, Path]] = dict
    batch_spec: Callable[[int], dict[str, jax.ShapeDtypeStruct]] | None = None
    artifacts: Callable[[], dict[str, Path]] = dict
    generate_eval: Callable[[nnx.Module, str, Path | None], dict[str, float | str]] | None = None
    final_results: Callable[[dict], dict] = lambda results: {}
    warm_start: Callable[[nnx.State], nnx.State] | None = None
    row_multiple: int = 0


def _to_host(tree) -> dict[str, float]:
    return {k: float(v) for k, v in jax.device_get(tree).items()}


def _numbers(metrics: dict) -> dict[str, float]:
    """The numeric metrics (what logs and TensorBoard take)."""
    return {k: v for k, v in metrics.items() if not isinstance(v, str)}


def _add(acc: dict, new: dict) -> dict:
    return {k: acc[k] + v for k, v in new.items()} if acc else dict(new)


def evaluate(
    eval_step, state, batches: Iterable[dict], mesh, *, max_batches: int = 0, name: str = "evaluating"
) -> dict[str, float]:
    """Mean metrics over `batches` (the first `max_batches` of them when > 0) and `examples`, their count."""
    total: dict = {}
    bar = WorkProgress(name, total=max_batches or None, unit="batches") if jax.process_index() == 0 else None
    for batch in itertools.islice(batches, max_batches or None):
        total = _add(total, eval_step(state, mesh_lib.put_batch(batch, mesh)))  # sums stay on device
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    if not total:
        return {}
    sums = _to_host(total)
    return {**summarise(sums), "examples": sums.get("count", 0.0)}


def _finished_results(workdir: epath.Path, restored_step: int, steps: int) -> dict | None:
    """results.json of a workdir whose training and final evaluation are complete, else None."""
    path = workdir / "results.json"
    if restored_step != steps or not path.exists():
        return None
    try:
        results = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # written atomically, so only a hand-edited file gets here: evaluate again
    return results if results.get("steps") == float(steps) else None


def check_batch_rows(train_cfg: ml_collections.ConfigDict, task: Task) -> tuple[int, str]:
    """(rows that every batch is a multiple of, the config field that sets them); errors name the field.

    train.batch_size has one meaning everywhere: examples per global batch. Token-batched tasks set it to
    0 and size their batches in tokens, in rows that are a multiple of `task.row_multiple`."""
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


def train_and_evaluate(
    config: ml_collections.ConfigDict,
    workdir: str | os.PathLike,
    task: Task,
    *,
    profile_steps: tuple[int, int] | None = None,
) -> dict[str, float]:
    """Trains `task` for `config.train.steps`, resuming from `workdir` when it holds a checkpoint.

    Writes config.json, metrics.jsonl, TensorBoard events, checkpoints/ and results.json in `workdir`
    and returns the results dict. `profile_steps=(first, last)` records a `jax.profiler` trace of those
    train steps into workdir/profile (TensorBoard's profile plugin or Perfetto read it).
    """
    workdir = as_path(workdir)
    train_cfg = config.train
    is_writer = jax.process_index() == 0
    # Every check that can fail on a bad config runs before anything is written to the workdir.
    check_output_dir(workdir, "--workdir")
    validate_config(config)
    rows, field = check_batch_rows(train_cfg, task)
    check_resume_config(config, workdir)
    mesh = mesh_lib.make_mesh(config.mesh)
    if (rows // train_cfg.grad_accum_steps) % mesh_lib.batch_shards(mesh):
        raise ValueError(
            f"{field} / train.grad_accum_steps = {rows // train_cfg.grad_accum_steps} "
            f"is not divisible by the {mesh_lib.batch_shards(mesh)} data × fsdp shards"
        )
    eval_rows = train_cfg.eval_batch_size or rows
    if not task.row_multiple and eval_rows % mesh_lib.batch_shards(mesh):
        raise ValueError(
            f"train.eval_batch_size={eval_rows} is not divisible by the {mesh_lib.batch_shards(mesh)} data × fsdp "
            "shards (0 means train.batch_size)"
        )
    build = state_builder(task.build_model, train_cfg, config.seed)
    rules = mesh_lib.rules_from_config(config.mesh)
    sharding_line = mesh_lib.check_sharding(
        mesh_lib.sharding_report(abstract_state(build)[1][0], mesh, rules), config.mesh.sharding_tolerance
    )
    if is_writer and mesh_lib.parameter_shards(mesh) > 1:
        print(sharding_line, flush=True)
    # Data generation, tokenizer training and caching: process 0 alone first, the others after it (they find
    # the files made), so several processes never write the same file.
    first_process_then_others("prepare-data", task.prepare)
    if is_writer:
        write_config(config, workdir)
        for name, source in task.artifacts().items():
            atomic_write_bytes(workdir / name, as_path(source).read_bytes())

    graphdef, state, state_sharding = create_train_state(build, mesh, rules)
    shardings = mesh_lib.step_shardings(mesh, state_sharding)
    train_step = make_train_step(graphdef, task.loss_fn, accum_steps=train_cfg.grad_accum_steps, **shardings)
    eval_step = make_eval_step(graphdef, task.loss_fn, **shardings)
    schedule = make_schedule(train_cfg)

    def evaluate_split(state, split: str, final: bool) -> dict[str, float]:
        metrics = evaluate(
            eval_step, state, task.eval_batches(split), mesh, max_batches=train_cfg.eval_max_batches,
            name=f"evaluating {split}",
        )  # fmt: skip
        if task.generate_eval is not None:
            model = nnx.merge(graphdef, state)[0]
            model.eval()
            metrics.update(task.generate_eval(model, split, workdir if final else None))
        return metrics

    rng = jax.random.key(config.seed + 1)

    data_iter = iter(task.train_batches())
    checkpointer = Checkpointer(workdir / "checkpoints", max_to_keep=train_cfg.keep_checkpoints)
    start_step, pending = 0, {}
    abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, state_sharding)
    # The newest step that restores; broken ones are moved aside with a line each (never deleted).
    restored = checkpointer.restore_latest(abstract, data_iter, report=lambda line: print(line, flush=True))
    if restored is None and task.warm_start is not None:
        state = jax.device_put(task.warm_start(state), state_sharding)
    earlier_seconds = 0.0  # training time of earlier runs of this workdir, up to the restored checkpoint
    if restored is not None:
        start_step, state, meta = restored
        pending = {k: jnp.float32(v) for k, v in meta["pending_metrics"].items()}
        rng = jax.random.wrap_key_data(jnp.asarray(meta["rng"], jnp.uint32))
        earlier_seconds = float(meta.get("train_seconds", 0.0))
        finished = _finished_results(workdir, start_step, train_cfg.steps)
        if finished is not None:  # re-running a finished workdir changes nothing
            checkpointer.close()
            if is_writer:
                print(f"{workdir} already finished {train_cfg.steps} steps; results.json is unchanged", flush=True)
            return finished
        if is_writer:
            print(f"resumed from {workdir / 'checkpoints'} at step {start_step}", flush=True)

    writer = MetricWriter(workdir, resume_step=start_step, final_step=train_cfg.steps, enabled=is_writer)
    progress = Progress(train_cfg.steps, start_step, enabled=is_writer)
    watch = Stopwatch()
    preemption = PreemptionWatcher(checkpointer.manager)

    def save(step: int) -> None:
        # Metric sums since the last log line travel with the checkpoint, so resumed logs are exact.
        pending_host = _to_host(pending)
        loss = pending_host.get("loss", 0.0)
        if not np.isfinite(loss):
            checkpointer.wait()
            raise FloatingPointError(
                f"loss is not finite ({loss}) at step {step}; refusing to checkpoint it. "
                f"The last good checkpoint (step {checkpointer.latest_step()}) is kept in {workdir / 'checkpoints'}."
            )
        meta = {
            "step": step,
            "rng": np.asarray(jax.random.key_data(rng)).tolist(),
            "pending_metrics": pending_host,
            "train_seconds": earlier_seconds + watch.elapsed(),
        }
        checkpointer.save(step, state, data_iter, meta)

    tracing = False
    # Whatever stops the loop (an error, Ctrl-C), saves already under way are completed: a good
    # checkpoint is never abandoned half-written.
    try:
        for step in range(start_step, train_cfg.steps):
            if profile_steps is not None and step + 1 == profile_steps[0] and is_writer:
                jax.profiler.start_trace(str(workdir / "profile"))
                tracing = True
            wait_start = time.perf_counter()
            batch = next(data_iter)
            watch.waited(time.perf_counter() - wait_start)
            if step == start_step and is_writer:
                print("compiling the train step (the first step waits for it)...", flush=True)
                compile_start = time.perf_counter()
            state, sums = train_step(state, mesh_lib.put_batch(batch, mesh), rng)
            if step == start_step and is_writer:
                jax.block_until_ready(sums)  # once per run: the compile time is worth a host sync
                print(f"first train step done in {time.perf_counter() - compile_start:.1f} s (compilation included)",
                      flush=True)  # fmt: skip
            watch.tick(task.count_tokens(batch) * jax.process_count())
            pending = _add(pending, sums)  # stays on device: no host sync per step
            progress.update()
            done = step + 1
            if tracing and done == profile_steps[1]:  # (a run resumed past the first step records nothing)
                tracing = False
                jax.block_until_ready(state)
                jax.profiler.stop_trace()
                print(f"profile of steps {profile_steps[0]}-{profile_steps[1]} written to {workdir / 'profile'}")
            if done % train_cfg.log_every == 0 or done == train_cfg.steps:
                metrics = summarise(_to_host(pending))
                if not np.isfinite(metrics["loss"]):
                    checkpointer.wait()
                    raise FloatingPointError(
                        f"training loss became {metrics['loss']} by step {done}; nothing was checkpointed after "
                        f"step {checkpointer.latest_step()}"
                    )
                metrics["learning_rate"] = float(schedule(step))
                metrics.update(watch.rates())
                writer.write(done, "train", metrics)
                progress.log(done, "train", metrics)
                pending = {}
            if train_cfg.eval_every and done % train_cfg.eval_every == 0 and done != train_cfg.steps:
                metrics = evaluate_split(state, task.eval_splits[0], final=False)
                writer.write(done, task.eval_splits[0], _numbers(metrics))
                progress.log(done, task.eval_splits[0], _numbers(metrics))
            preempted = preemption.reached(done) and done != train_cfg.steps
            if done % train_cfg.checkpoint_every == 0 or done == train_cfg.steps or preempted:
                save(done)
            if preempted:
                checkpointer.wait()
                raise Preempted(done)
            _tell_hooks(done, None, checkpointer)
    finally:
        if tracing:
            jax.profiler.stop_trace()
        checkpointer.wait()
        preemption.close()
        progress.close()

    train_seconds = watch.elapsed()  # the loop alone (compilation, periodic evals, checkpoints included)
    results: dict[str, float | str] = {"steps": float(train_cfg.steps)}
    for split in task.eval_splits:
        metrics = evaluate_split(state, split, final=True)
        writer.write(train_cfg.steps, split, _numbers(metrics))
        progress.log(train_cfg.steps, split, _numbers(metrics))
        results.update({f"{split}_{k}": v for k, v in metrics.items()})
        _tell_hooks(train_cfg.steps, split, checkpointer)
    # Training time over every run of this workdir up to the last checkpoint, plus this run's; this run's alone.
    results["train_wall_time_s"] = earlier_seconds + train_seconds
    results["train_wall_time_this_run_s"] = train_seconds
    results["eval_wall_time_s"] = watch.elapsed() - train_seconds  # the final evaluation of every split
    results["resumed_at_step"] = float(start_step)
    results["train_steps_run"] = float(train_cfg.steps - start_step)
    results.update(task.final_results(results))
    if is_writer:
        atomic_write_bytes(workdir / "results.json", json.dumps(results, indent=2, sort_keys=True).encode())
    writer.close()
    checkpointer.close()
    return results
