"""Orbax checkpoints of one run: train state, Grain iterator state and a JSON record (step, RNG, metrics).

Orbax writes each step to a temporary directory and renames it when complete, so an interrupted save
never replaces a good checkpoint. The trainer refuses to save a state whose loss is not finite.
"""

from __future__ import annotations

from pathlib import Path

import grain
import orbax.checkpoint as ocp


class Checkpointer:
    def __init__(self, directory: str | Path, *, max_to_keep: int):
        self.manager = ocp.CheckpointManager(
            Path(directory).absolute(),
            item_names=("state", "data", "meta"),
            item_handlers={
                "state": ocp.StandardCheckpointHandler(),
                "data": grain.checkpoint.CheckpointHandler(),
                "meta": ocp.JsonCheckpointHandler(),
            },
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state, data_iterator, meta: dict) -> None:
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
        """Restores only the train state (inference, fine-tuning, inspection: no data iterator)."""
        restored = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
        return restored.state

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()
