"""The train state: an NNX (model, optimiser) pair, created directly with its shardings.

The model is first built abstractly (`nnx.eval_shape`: no memory; config errors surface here), its shardings
come from the parameters' logical axes, and the real state is made straight into them (`init_state`).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import jax
import ml_collections
from flax import nnx

from zoo.files import as_path, read_json
from zoo.models import ModelBuilder, model_class
from zoo.training import mesh as mesh_lib
from zoo.training.checkpoints import Checkpointer
from zoo.training.config import read_run_config, recorded_changes
from zoo.training.optim import make_optimizer


def state_builder(
    build_model: Callable[[nnx.Rngs], nnx.Module], train: ml_collections.ConfigDict, seed: int
) -> Callable[[], tuple[nnx.Module, nnx.Optimizer]]:
    def build():
        model = build_model(nnx.Rngs(params=seed))
        return model, nnx.Optimizer(model, make_optimizer(train), wrt=nnx.Param)

    return build


def abstract_state(build: Callable[[], tuple]) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, state of ShapeDtypeStructs) without allocating anything."""
    return nnx.split(nnx.eval_shape(build))


def create_train_state(
    build: Callable[[], tuple], mesh: jax.sharding.Mesh, rules: mesh_lib.Rules = mesh_lib.LOGICAL_RULES
):
    """Returns (graphdef, state, state_sharding) with the state laid out on `mesh` under `rules`."""
    graphdef, abstract = abstract_state(build)
    sharding = mesh_lib.state_shardings(abstract, mesh, rules)
    return graphdef, init_state(build, sharding), sharding


def init_state(build: Callable[[], tuple], sharding) -> nnx.State:
    """The state made by a jitted initialiser straight into its shardings (no unsharded copy anywhere). On one
    device, operation by operation: nothing to avoid copying, and its operations compile once per process where a
    jitted initialiser compiles for every run (a tiny ListOps model: 0.04 s against 0.5 s; the same values)."""
    devices = {device for leaf in jax.tree.leaves(sharding) for device in leaf.device_set}
    if len(devices) == 1:
        with jax.default_device(devices.pop()):
            return jax.device_put(nnx.state(build()), sharding)
    return jax.jit(lambda: nnx.state(build()), out_shardings=sharding)()


def restore_model(
    build_model: Callable[[nnx.Rngs], nnx.Module],
    train: ml_collections.ConfigDict,
    checkpoint_dir,
    *,
    step: int | None = None,
    model_config: ml_collections.ConfigDict | None = None,
) -> tuple[nnx.Module, int]:
    """(model, step) of a run's checkpoint (latest unless `step`) on this process's first device. `model_config`,
    when given, must be the one the checkpoint records: another mixer with the same parameters would restore."""
    checkpointer = Checkpointer(checkpoint_dir, max_to_keep=1_000_000)
    try:
        steps = checkpointer.manager.all_steps()
        if not steps:
            raise FileNotFoundError(f"no checkpoint in {checkpoint_dir}")
        if step is not None and step not in steps:
            raise FileNotFoundError(
                f"no checkpoint of step {step} in {checkpoint_dir}; its steps: {', '.join(map(str, sorted(steps)))}"
            )
        step = max(steps) if step is None else step
        graphdef, abstract = abstract_state(state_builder(build_model, train, 0))
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), abstract)
        state = checkpointer.restore_state(step, abstract)  # a ValueError: a different model, or a damaged step
        if model_config is not None:
            check_trained_with(checkpointer.restore_meta(step).get("model"), model_config, f"{checkpoint_dir}/{step}")
    finally:
        checkpointer.close()
    model, _ = nnx.merge(graphdef, state)
    return model, step


def check_trained_with(trained: dict | None, model_config: ml_collections.ConfigDict, where: str) -> None:
    """Refuses `model_config` where it differs from the model config a checkpoint records (checkpoints from before
    the record pass; fields added since it was written count at their defaults, as on resume)."""
    if not trained:
        return
    changes = recorded_changes({"model": trained}, ml_collections.ConfigDict({"model": model_config}))
    if changes:
        shown = "; ".join(f"{k}: {old!r} (trained) -> {new!r}" for k, (old, new) in list(changes.items())[:5])
        raise ValueError(
            f"checkpoint {where} was trained with another model config than the run's config.json: {shown}"
        )


MODEL_FILE = "model.json"  # a workdir's model recipe (`zoo.models.ModelBuilder.spec`), written by the loop


def load_model(workdir: str | os.PathLike, step: int | None = None) -> tuple[nnx.Module, ml_collections.ConfigDict]:
    """(the trained model in eval mode, its run's config) from a training workdir: the model class and arguments
    of model.json, the parameters of the newest checkpoint (or `step`'s), on this process's first device."""
    workdir = as_path(workdir)
    config = read_run_config(workdir, reader="load_model reads the workdirs of the training commands")
    path = workdir / MODEL_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: a workdir of a run from before model.json was written (its task's own loader, "
            "such as mt_flax.task.load_run, reads it)"
        )
    spec = read_json(path, "a damaged workdir: restore the file")
    if not isinstance(spec, dict) or not isinstance(spec.get("class"), str) or not isinstance(spec.get("kwargs"), dict):
        raise ValueError(f'{path}: expected {{"class": ..., "kwargs": {{...}}}}, got {spec!r}')
    builder = ModelBuilder(model_class(spec["class"]), config.model, spec["kwargs"])
    model, _ = restore_model(builder, config.train, workdir / "checkpoints", step=step, model_config=config.model)
    model.eval()
    return model, config
