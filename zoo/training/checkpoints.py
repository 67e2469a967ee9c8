"""Orbax checkpoints of one run: train state, Grain iterator state and a JSON record (step, RNG, metrics).

Orbax writes each step to a temporary directory and renames it when complete, so an interrupted save never
replaces a good checkpoint. A step that does not restore is moved aside into `<checkpoints>_broken/`, never
deleted, and the previous step is tried (`restore_latest`).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable

import grain
import jax
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from zoo.files import as_path
from zoo.training.optim import key_name


class NoCheckpointRestores(RuntimeError):
    """Every checkpoint step in the directory failed to restore (each one was moved aside)."""


class CheckpointDamaged(ValueError):
    """A step that is there does not restore into the model it was saved from (a file deleted, truncated, altered)."""


class CheckpointSaveFailed(OSError):
    """A save did not complete (a full disk, a folder made unwritable): the run stops, the last good step stays."""


def _first_line(e: BaseException, limit: int = 300) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = text.split(" See full TensorStore details:")[0]  # what follows is a pybind11 repr, not a detail
    return f"{type(e).__name__}: {text[:limit]}"


def _check_json_files(step_dir: epath.Path) -> None:
    """The step's JSON items must parse; Orbax's own error does not say which file is broken."""
    for path in [step_dir / "meta" / "metadata", *sorted((step_dir / "data").glob("*.json"))]:
        try:
            json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"{path} is missing") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is not valid JSON ({e})") from None


def _leaf_shapes(tree) -> dict[tuple[str, ...], tuple[int, ...]]:
    """Each array's path (dict keys, sequence indices and attribute names as text) and shape."""

    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {tuple(key_name(k) for k in path): tuple(leaf.shape) for path, leaf in leaves if hasattr(leaf, "shape")}


class Checkpointer:
    """A run's checkpoints. `writer`: the training run's own, which removes the temporary folders of saves a killed
    process left unfinished (Orbax's cleanup); a reader (load_model, a study) never does, as a run may be saving."""

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int, writer: bool = False):
        self.manager = ocp.CheckpointManager(
            as_path(directory),
            item_names=("state", "data", "meta"),
            item_handlers={
                "state": ocp.StandardCheckpointHandler(),
                "data": grain.checkpoint.CheckpointHandler(),
                "meta": ocp.JsonCheckpointHandler(),
            },
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True, cleanup_tmp_directories=writer),
        )
        self.saving: int | None = None  # the step of the last save started

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    @property
    def broken_directory(self) -> epath.Path:
        directory = as_path(self.manager.directory)
        return directory.parent / (directory.name + "_broken")

    def _move_aside(self, step: int) -> epath.Path:
        """Moves step `step` into `broken_directory` (a suffix keeps earlier ones) and forgets it."""
        target = self.broken_directory / str(step)
        if jax.process_index() == 0:
            self.broken_directory.mkdir(parents=True, exist_ok=True)
            n = 1
            while target.exists():
                target, n = self.broken_directory / f"{step}.{n}", n + 1
            (as_path(self.manager.directory) / str(step)).rename(target)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices(f"checkpoint-move-aside-{step}")
        self.manager.reload()
        return target

    def restore_latest(
        self, abstract_state, data_iterator, *, report: Callable[[str], None] = print
    ) -> tuple[int, object, dict] | None:
        """(step, state, meta) of the newest step that restores, or None when there is no checkpoint. A step that
        fails is reported in one line and moved aside; raises NoCheckpointRestores when none restored."""
        tried = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                _check_json_files(as_path(self.manager.directory) / str(step))
                state, meta = self.restore(step, abstract_state, data_iterator)
                if int(meta.get("step", -1)) != step:
                    raise ValueError(f"its meta record says step {meta.get('step')!r}")
                return step, state, meta
            except Exception as e:  # any failure of this step: keep it aside and try the previous one
                moved = self._move_aside(step)
                tried.append(step)
                report(f"checkpoint step {step} does not restore ({_first_line(e)}); moved it to {moved}")
        if tried:
            raise NoCheckpointRestores(
                f"no checkpoint in {self.manager.directory} restores (steps {', '.join(map(str, tried))}, moved to "
                f"{self.broken_directory}); run the same command again to start from step 0"
            )
        return None

    def save(self, step: int, state, data_iterator, meta: dict) -> None:
        self.wait()  # the save before it, failed or not, is said as its own (Orbax would wait inside this one)
        self.saving = step
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                data=grain.checkpoint.CheckpointSave(data_iterator),
                meta=ocp.args.JsonSave(meta),
            ),
        )

    def restore(self, step: int, abstract_state, data_iterator) -> tuple[object, dict]:
        """Restores the state into `abstract_state`'s structure and shardings, and the iterator in place."""
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state),
                data=grain.checkpoint.CheckpointRestore(data_iterator),
                meta=ocp.args.JsonRestore(),
            ),
        )
        return restored.state, restored.meta

    def restore_state(self, step: int, abstract_state) -> object:
        """Restores only the train state (no data iterator); a ValueError says whether the model differs from the
        one saved or the step is damaged."""
        try:
            args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state))
            return self.manager.restore(step, args=args).state
        except Exception as e:  # Orbax and TensorStore raise many types; each is one of the two cases below
            raise self._restore_failure(step, abstract_state, e) from None

    def restore_meta(self, step: int) -> dict:
        """The step's JSON record (`Run.save_checkpoint`: step, RNG, metrics, model config)."""
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

    def _restore_failure(self, step: int, abstract_state, error: BaseException) -> ValueError:
        where = f"checkpoint {self.manager.directory} step {step}"
        try:
            saved = _leaf_shapes(self.manager.item_metadata(step).state.tree)
        except Exception:  # the metadata itself is damaged
            saved = None
        expected = _leaf_shapes(abstract_state)
        if saved is not None and saved != expected:
            differ = sorted(saved.keys() ^ expected.keys()) + sorted(
                k for k in saved.keys() & expected.keys() if saved[k] != expected[k]
            )
            shown = "; ".join(f"{'/'.join(k)}: saved {saved.get(k)}, model {expected.get(k)}" for k in differ[:3])
            return ValueError(
                f"{where} does not match the model built from the config ({len(differ)} arrays differ; {shown}; "
                "None: absent)"
            )
        others = sorted(s for s in self.manager.all_steps() if s != step)
        return CheckpointDamaged(
            f"{where} is damaged and does not restore ({_first_line(error)})"
            + (f"; the other steps there: {', '.join(map(str, others))}" if others else "")
        )

    def wait(self) -> None:
        with self._save_failures():
            self.manager.wait_until_finished()

    def check(self) -> None:
        """Raises `CheckpointSaveFailed` when a save in the background has failed (cheap: looks, does not wait)."""
        if not self.manager.is_saving_in_progress():
            self.wait()  # done: returns at once, or raises what failed

    @contextlib.contextmanager
    def _save_failures(self):
        """A failed background save as one line naming the folder and the cause; its temporary folder goes
        (a half-written step is never restored, and a full disk would stay full)."""
        try:
            yield
        except Exception as e:
            directory = as_path(self.manager.directory)
            if jax.process_index() == 0:
                for tmp in directory.glob("*.orbax-checkpoint-tmp*"):
                    tmp.rmtree(missing_ok=True)
            last = self.manager.latest_step()
            kept = f"the last good checkpoint is step {last}" if last is not None else "no checkpoint was completed"
            raise CheckpointSaveFailed(
                f"saving checkpoint {self.saving} in {directory} failed ({_first_line(e, 200)}); {kept}, and the "
                "half-written one is removed: free space or fix the folder, then run the same command"
            ) from None

    def close(self) -> None:
        self.manager.close()
