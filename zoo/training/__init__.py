"""The training harness shared by every task: optimiser, steps, loop, checkpoints, metrics, mesh, data."""

from zoo.training.config import ConfigMismatchError, mesh_config, small_run_config, task_config, train_config
from zoo.training.loop import Task, evaluate, train_and_evaluate
from zoo.training.losses import classification_loss, token_cross_entropy
from zoo.training.optim import make_optimizer, make_schedule
from zoo.training.state import load_model
from zoo.training.steps import with_aux_loss

__all__ = [
    "ConfigMismatchError",
    "Task",
    "classification_loss",
    "evaluate",
    "load_model",
    "make_optimizer",
    "make_schedule",
    "mesh_config",
    "small_run_config",
    "task_config",
    "token_cross_entropy",
    "train_and_evaluate",
    "train_config",
    "with_aux_loss",
]
