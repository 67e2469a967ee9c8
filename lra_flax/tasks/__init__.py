"""The LRA task registry: every task module's `SPECS`, by row name, in the LRA paper's table order.

Tools look tasks up here (never by a literal name): `REGISTRY[name]` is an `TaskSpec` (config module and
presets, vocabulary and classes, published accuracies, demo cut, `lra-data` writer) and `make_task(config)`
builds the `zoo.training.Task` of `config.task`. A new task = a module here with `make_task` and `SPECS` (found
by its `SPECS`: nothing to list), a config module and a test file.
"""

import importlib
import pkgutil
from collections.abc import Callable
from types import ModuleType

import ml_collections

from lra_flax.tasks.spec import TaskSpec
from zoo.training import Task

_IMPORTED = [importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)]
_MODULES: tuple[ModuleType, ...] = tuple(
    sorted((m for m in _IMPORTED if hasattr(m, "SPECS")), key=lambda module: min(spec.column for spec in module.SPECS))
)

REGISTRY: dict[str, TaskSpec] = {
    spec.name: spec for spec in sorted((s for m in _MODULES for s in m.SPECS), key=lambda spec: spec.column)
}
# config.task → the module whose make_task builds it (Path-X is Pathfinder's module at 128 × 128).
TASK_MODULES: dict[str, ModuleType] = {module.__name__.rpartition(".")[2]: module for module in _MODULES}


def make_task(config: ml_collections.ConfigDict) -> Task:
    """The `Task` that `config.task` names; an error lists the valid names."""
    if config.task not in TASK_MODULES:
        raise ValueError(f"config field task={config.task!r} is unknown; valid: {', '.join(TASK_MODULES)}")
    return TASK_MODULES[config.task].make_task(config)


def with_demo() -> list[str]:
    """Rows that have a CPU demo preset (`make demo-*`, the `lra-compare` demo sweep)."""
    return [name for name, spec in REGISTRY.items() if spec.demo_preset]


def reported_by(source: str) -> list[str]:
    """Rows with a published accuracy from `source` (a row-label prefix such as "kernel paper")."""
    return [name for name, spec in REGISTRY.items() if any(label.startswith(source) for label in spec.published)]


def data_writers() -> dict[str, Callable]:
    """`lra-data`'s sub-commands: every row that writes data, by name (Path-X is `pathfinder --resolution=128`)."""
    return {name: spec.write_data for name, spec in REGISTRY.items() if spec.write_data}


def published_rows() -> dict[str, dict[str, float | None]]:
    """{row label: {task: accuracy}} over every task, labels in order of first appearance."""
    rows: dict[str, dict[str, float | None]] = {}
    for name, spec in REGISTRY.items():
        for label, accuracy in spec.published.items():
            rows.setdefault(label, {})[name] = accuracy
    return rows


__all__ = [
    "REGISTRY",
    "TASK_MODULES",
    "TaskSpec",
    "data_writers",
    "make_task",
    "published_rows",
    "reported_by",
    "with_demo",
]
