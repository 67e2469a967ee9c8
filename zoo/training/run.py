"""One training run's state between the loop's parts: what `setup` builds, `restore` fills, the step loop
advances and the periodic actions read (evaluation, checkpoints, logs)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from etils import epath
from flax import nnx

from zoo.progress import StepProgress, WorkProgress
from zoo.training import mesh as mesh_lib
from zoo.training.checkpoints import Checkpointer
from zoo.training.config import config_to_json
from zoo.training.metrics import MetricWriter, Stopwatch, summarise
from zoo.training.task import Task


def to_host(tree) -> dict:
    """Metric sums on the host: floats, and lists for vector sums (a classifier's per-class `predictions`)."""
    return {k: float(v) if np.ndim(v) == 0 else np.asarray(v).tolist() for k, v in jax.device_get(tree).items()}


def numbers(metrics: dict) -> dict[str, float]:
    """The numeric metrics (what logs and TensorBoard take)."""
    return {k: v for k, v in metrics.items() if not isinstance(v, str)}


def add_sums(acc: dict, new: dict) -> dict:
    return {k: acc[k] + v for k, v in new.items()} if acc else dict(new)


def evaluate(
    eval_step,
    state,
    batches: Iterable[dict],
    mesh,
    *,
    max_batches: int = 0,
    name: str = "evaluating",
    scored: str = "examples",
) -> dict[str, float]:
    """Mean metrics over `batches` (the first `max_batches` of them when > 0) and, under `scored`, the number of
    things scored (the loss's total weight: examples, or tokens for a per-token loss)."""
    total: dict = {}
    bar = WorkProgress(name, total=max_batches or None, unit="batches") if jax.process_index() == 0 else None
    for batch in itertools.islice(batches, max_batches or None):
        total = add_sums(total, eval_step(state, mesh_lib.put_batch(batch, mesh)))  # sums stay on device
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    if not total:
        return {}
    sums = to_host(total)
    return {**summarise(sums), scored: sums.get("count", 0.0)}


@dataclasses.dataclass
class Run:
    """A training run: its fixed parts (config, task, mesh, compiled steps) and what changes as it trains.

    `step` counts finished train steps; `pending` holds the metric sums since the last log line (on device:
    no host sync per step); `earlier_seconds` is the training time of earlier runs of this workdir, up to the
    restored checkpoint. `data_iter`, `checkpointer`, `writer` and `progress` are opened by the loop."""

    config: ml_collections.ConfigDict
    workdir: epath.Path
    task: Task
    mesh: jax.sharding.Mesh
    graphdef: nnx.GraphDef
    state: nnx.State | None  # None until `open_workdir`
    state_sharding: Any
    train_step: Callable
    eval_step: Callable
    schedule: Callable[[int], Any]
    rng: jax.Array
    is_writer: bool
    build: Callable[[], tuple] | None = None  # makes the (model, optimiser) pair: `open_workdir` builds the state
    step: int = 0
    start_step: int = 0
    pending: dict = dataclasses.field(default_factory=dict)
    earlier_seconds: float = 0.0
    data_iter: Iterator[dict] | None = None
    checkpointer: Checkpointer | None = None
    writer: MetricWriter | None = None
    progress: StepProgress | None = None
    watch: Stopwatch = dataclasses.field(default_factory=Stopwatch)
    flops_by_shape: dict = dataclasses.field(default_factory=dict)  # model FLOPs of a train step, by batch shapes

    @property
    def steps(self) -> int:
        return self.config.train.steps

    def evaluate_split(self, split: str, final: bool) -> dict[str, float]:
        """The split's loss metrics, and the task's generated metrics (files in the workdir when `final`)."""
        metrics = evaluate(
            self.eval_step, self.state, self.task.eval_batches(split), self.mesh,
            max_batches=self.config.train.eval_max_batches, name=f"evaluating {split}", scored=self.task.scored,
        )  # fmt: skip
        if self.task.generate_eval is not None:
            model = nnx.merge(self.graphdef, self.state)[0]
            model.eval()
            metrics.update(self.task.generate_eval(model, split, self.workdir if final else None))
        return metrics

    def log(self, split: str, metrics: dict) -> None:
        """One line of metrics at the current step: metrics.jsonl, TensorBoard and the progress log."""
        self.writer.write(self.step, split, numbers(metrics))
        self.progress.log(self.step, split, numbers(metrics))

    def save_checkpoint(self) -> None:
        """Checkpoints the current step; a non-finite loss is refused (the last good checkpoint stays)."""
        # Metric sums since the last log line travel with the checkpoint, so resumed logs are exact.
        pending_host = to_host(self.pending)
        loss = pending_host.get("loss", 0.0)
        if not np.isfinite(loss):
            self.checkpointer.wait()
            last = self.checkpointer.latest_step()
            kept = (
                f"The last good checkpoint (step {last}) is kept in {self.workdir / 'checkpoints'}."
                if last is not None
                else "No checkpoint was written before it."
            )
            raise FloatingPointError(
                f"loss is not finite ({loss}) at step {self.step}; refusing to checkpoint it. {kept}"
            )
        meta = {
            "step": self.step,
            "rng": np.asarray(jax.random.key_data(self.rng)).tolist(),
            "pending_metrics": pending_host,
            "train_seconds": self.earlier_seconds + self.watch.elapsed(),
            "model": json.loads(config_to_json(self.config.model)),  # what the weights are for (restore_model)
        }
        self.checkpointer.save(self.step, self.state, self.data_iter, meta)

    def load_meta(self, meta: dict) -> None:
        """The checkpoint's metadata back into the run (what `save_checkpoint` wrote)."""
        self.pending = {k: jnp.float32(v) for k, v in meta["pending_metrics"].items()}
        self.rng = jax.random.wrap_key_data(jnp.asarray(meta["rng"], jnp.uint32))
        self.earlier_seconds = float(meta.get("train_seconds", 0.0))
