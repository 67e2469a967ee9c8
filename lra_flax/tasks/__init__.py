"""LRA tasks by config name: each module maps a config to a `zoo.training.Task` (`make_task`)."""

import ml_collections

from lra_flax.tasks import image, listops, pathfinder, retrieval, text
from zoo.training import Task

TASKS = {
    "listops": listops.make_task,
    "text": text.make_task,
    "retrieval": retrieval.make_task,
    "image": image.make_task,
    "pathfinder": pathfinder.make_task,
}


def make_task(config: ml_collections.ConfigDict) -> Task:
    """The `Task` that `config.task` names; an error lists the valid names."""
    if config.task not in TASKS:
        raise ValueError(f"config field task={config.task!r} is unknown; valid: {', '.join(TASKS)}")
    return TASKS[config.task](config)
