"""The train state: an NNX (model, optimiser) pair, created directly with its shardings.

The model is first built abstractly (`nnx.eval_shape`: no memory, and every config error surfaces
here), its shardings are derived from the parameters' logical axes, and the real state is then made
by a jitted initialiser with those output shardings, so no host or device ever holds an unsharded
copy of a large model.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import ml_collections
from flax import nnx

from zoo.training import mesh as mesh_lib
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


def create_train_state(build: Callable[[], tuple], mesh: jax.sharding.Mesh):
    """Returns (graphdef, state, state_sharding) with the state laid out on `mesh`."""
    graphdef, abstract = abstract_state(build)
    sharding = mesh_lib.state_shardings(abstract, mesh)
    state = jax.jit(lambda: nnx.state(build()), out_shardings=sharding)()
    return graphdef, state, sharding
