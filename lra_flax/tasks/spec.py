"""What an LRA task module declares about itself, so that every tool finds it in one registry.

A task module (`lra_flax/tasks/<name>.py`) ends with `SPECS = (TaskSpec(...), ...)`: one entry per row of the
LRA benchmark it serves (Pathfinder serves two, Pathfinder and Path-X). `lra_flax.tasks.REGISTRY` collects
them; `lra-train`, `lra-data`, `lra-compare`, the efficiency runs, the demo and the studies read it instead of
naming tasks themselves.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ml_collections

from zoo.training import Task


@dataclasses.dataclass(frozen=True)
class DataFlag:
    """One flag of the task's `lra-data` sub-command: the default's type is the flag's (int, float or str: write a
    float flag's default as 0.0, not 0); `choices` makes it one of those strings. Its help is shown prefixed by the
    task's name."""

    name: str
    default: int | float | str
    help: str
    choices: tuple[str, ...] = ()

    def __post_init__(self):
        if isinstance(self.default, bool) or not isinstance(self.default, int | float | str):
            raise TypeError(f"lra-data flag --{self.name}: default {self.default!r} must be an int, a float or a str")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One LRA benchmark row.

    name:        the row's label in sweeps and tables (`lra-compare` tasks, results.csv).
    make_task:   config → the `zoo.training.Task` the loop trains.
    vocab_size:  token ids the model embeds (the efficiency runs draw synthetic batches from them).
    num_classes: label classes.
    config:      the config module under lra_flax/configs that builds it (default: `name`); its `config.task`
                 names the module in lra_flax/tasks whose `make_task` runs it.
    lra_preset:  the config preset with the LRA code's settings for this row.
    demo_preset: the CPU demo preset (`make demo-*`), or None when the row has none (Path-X).
    demo_cut:    the `lra-compare` demo sweep's cut of the demo preset (train fields: steps, eval_max_batches).
    published:   published test accuracy (%) by row label ("LRA paper: Transformer", ...); None = failed.
    write_data:  (output directory, `lra-data` flag values) → {what: path}; None when the task needs no
                 `lra-data` sub-command (its offline data is read straight from a package).
    data_files:  (output directory, `lra-data` flag values) → the files or folders `write_data` would replace
                 there: `lra-data` refuses to when one exists, unless --overwrite. None: it replaces nothing.
    data_flags:  the sub-command's own flags (`DataFlag`); --output_dir, --seed and --overwrite are every one's.
    column:      the row's place in the tables (the LRA paper's order: ListOps 1 … Path-X 6; a new task after them).
    """

    name: str
    make_task: Callable[[ml_collections.ConfigDict], Task]
    vocab_size: int
    num_classes: int
    column: float
    config: str = ""  # "": the row's name
    lra_preset: str = "lra_code"
    demo_preset: str | None = "demo"
    demo_cut: Mapping[str, int] = dataclasses.field(default_factory=dict)
    published: Mapping[str, float | None] = dataclasses.field(default_factory=dict)
    write_data: Callable[[str, Mapping[str, Any]], dict[str, Path]] | None = None
    data_files: Callable[[str, Mapping[str, Any]], list[Path]] | None = None
    data_flags: tuple[DataFlag, ...] = ()

    def __post_init__(self):
        if not self.config:
            object.__setattr__(self, "config", self.name)

    def get_config(self, preset: str | None = None) -> ml_collections.ConfigDict:
        """The config of `preset` (default: this row's LRA preset)."""
        module = importlib.import_module(f"lra_flax.configs.{self.config}")
        return module.get_config(preset or self.lra_preset)

    def config_spec(self, preset: str | None = None) -> str:
        """'config_module:preset', the form `lra-compare` sweeps name configs by."""
        return f"{self.config}:{preset or self.lra_preset}"
