"""LRA tasks by config name: each maps a config to a `zoo.training.Task`."""

from lra_flax.tasks import listops

TASKS = {"listops": listops.make_task}
