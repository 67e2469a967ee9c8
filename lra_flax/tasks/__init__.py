"""LRA tasks by config name: each module maps a config to a `zoo.training.Task` (`make_task`)."""

from lra_flax.tasks import image, listops, pathfinder, retrieval, text

TASKS = {
    "listops": listops.make_task,
    "text": text.make_task,
    "retrieval": retrieval.make_task,
    "image": image.make_task,
    "pathfinder": pathfinder.make_task,
}
