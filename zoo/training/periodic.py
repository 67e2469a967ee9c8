"""What the loop does besides stepping: periodic actions called around every train step.

Each action has `before_step(run)` (the step `run.step` is about to run), `after_step(run)` (`run.step` steps
are done) and `close(run)` (the loop ended, normally or not). The loop calls them in list order, so the
order of `default_actions` is the order a step's side effects happen in: log, evaluate, checkpoint, hooks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import numpy as np

from zoo.training.metrics import summarise
from zoo.training.run import Run, to_host
from zoo.training.signals import Preempted, PreemptionWatcher


class PeriodicAction:
    def before_step(self, run: Run) -> None:
        pass

    def after_step(self, run: Run) -> None:
        pass

    def close(self, run: Run) -> None:
        pass


@dataclasses.dataclass
class LogTrain(PeriodicAction):
    """Every `every` steps and at the last: mean train metrics, learning rate and throughput, logged."""

    every: int

    def after_step(self, run: Run) -> None:
        if run.step % self.every and run.step != run.steps:
            return
        metrics = summarise(to_host(run.pending))
        if not np.isfinite(metrics["loss"]):
            run.checkpointer.wait()
            raise FloatingPointError(
                f"training loss became {metrics['loss']} by step {run.step}; nothing was checkpointed after "
                f"step {run.checkpointer.latest_step()}"
            )
        if jax.process_count() == 1:  # several processes: at the next save, which every process reaches together
            run.checkpointer.check()  # a save that failed in the background stops the run here, not a save later
        metrics["learning_rate"] = float(run.schedule(run.step - 1))  # the rate the last step used
        metrics.update(run.watch.rates())
        run.log("train", metrics)
        run.pending = {}


@dataclasses.dataclass
class EvaluateEvery(PeriodicAction):
    """Every `every` steps (0: never), the task's first eval split; not at the last step (the final
    evaluation covers every split there)."""

    every: int

    def after_step(self, run: Run) -> None:
        if self.every and run.step % self.every == 0 and run.step != run.steps:
            split = run.task.eval_splits[0]
            run.log(split, run.evaluate_split(split, final=False))


@dataclasses.dataclass
class CheckpointEvery(PeriodicAction):
    """Every `every` steps, at the last step, and when the job is being preempted (then it stops the loop
    with `Preempted` once the checkpoint is written)."""

    every: int
    preemption: PreemptionWatcher

    def after_step(self, run: Run) -> None:
        preempted = self.preemption.reached(run.step) and run.step != run.steps
        if run.step % self.every == 0 or run.step == run.steps or preempted:
            run.save_checkpoint()
        if preempted:
            run.checkpointer.wait()
            raise Preempted(run.step)

    def close(self, run: Run) -> None:
        self.preemption.close()


@dataclasses.dataclass
class ProfileSteps(PeriodicAction):
    """A `jax.profiler` trace of train steps first..last (1-based) into workdir/profile, by process 0. A run
    resumed past `first` records nothing."""

    first: int
    last: int
    tracing: bool = False

    def before_step(self, run: Run) -> None:
        if run.step + 1 == self.first and run.is_writer:
            jax.profiler.start_trace(str(run.workdir / "profile"))
            self.tracing = True

    def after_step(self, run: Run) -> None:
        if self.tracing and run.step == self.last:
            self.tracing = False
            jax.block_until_ready(run.state)
            jax.profiler.stop_trace()
            print(f"profile of steps {self.first}-{self.last} written to {run.workdir / 'profile'}")

    def close(self, run: Run) -> None:
        if self.tracing:
            self.tracing = False
            jax.profiler.stop_trace()


@dataclasses.dataclass(frozen=True)
class LoopEvent:
    """What `EVENT_HOOKS` hear: train step `step` is done (its checkpoint, if any, started), or the final
    evaluation of `split` is logged. `wait_for_checkpoints` blocks until every save has completed."""

    step: int
    split: str | None
    wait_for_checkpoints: Callable[[], None]


# Called in order with every LoopEvent. Empty in production; tests add fault injection here (a crash or
# a preemption notice at a chosen point) and clear it again.
EVENT_HOOKS: list[Callable[[LoopEvent], None]] = []


def tell_hooks(run: Run, split: str | None = None) -> None:
    for hook in EVENT_HOOKS:
        hook(LoopEvent(run.step, split, run.checkpointer.wait))


class TellHooks(PeriodicAction):
    def after_step(self, run: Run) -> None:
        tell_hooks(run)


def default_actions(
    run: Run, preemption: PreemptionWatcher, profile_steps: tuple[int, int] | None = None
) -> list[PeriodicAction]:
    """The actions of `config.train`: log, evaluate, checkpoint (with preemption), profile, event hooks."""
    train = run.config.train
    actions: list[PeriodicAction] = [] if profile_steps is None else [ProfileSteps(*profile_steps)]
    actions += [LogTrain(train.log_every), EvaluateEvery(train.eval_every)]
    return [*actions, CheckpointEvery(train.checkpoint_every, preemption), TellHooks()]
