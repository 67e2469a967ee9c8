"""Jitted train and eval steps over an NNX (model, optimiser) state, with explicit shardings.

Each step merges the `nnx.State`, differentiates the loss (plus the `AuxLoss`es modules sow) with respect to the
`nnx.Param` leaves and returns the new state. Gradient accumulation runs micro-batches in a `lax.scan` inside one
step, so one step is always one optimiser update.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from zoo.layers.common import AuxLoss

LossFn = Callable[[nnx.Module, dict, nnx.Rngs | None, bool], tuple[jax.Array, dict]]


def with_aux_loss(fn: Callable, *args, **kwargs) -> tuple[Any, jax.Array]:
    """(`fn(*args, **kwargs)`, the sum of the auxiliary losses its modules sow meanwhile): `fn` is a module, or a
    function whose first argument is the model; `nnx.capture` collects what is sown as `AuxLoss`. Under
    model.scan_layers a block's sown loss comes stacked, one entry per layer: every entry counts."""
    out, sown = nnx.capture(fn, AuxLoss)(*args, **kwargs)
    return out, sum((jnp.sum(leaf) for leaf in jax.tree.leaves(sown)), jnp.zeros((), jnp.float32))


def _under_mesh(fn: Callable, mesh: jax.sharding.Mesh) -> Callable:
    """`fn` traced with `mesh` as the abstract mesh, so the models' activation constraints apply."""

    def traced(*args):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args)

    return traced


def make_train_step(graphdef, loss_fn: LossFn, *, accum_steps: int, state_sharding, batch_sharding, replicated):
    """`step(state, batch, key) -> (state, metric sums)`. Dropout keys are `fold_in(key, step)`, so a resumed run
    draws the same masks as an uninterrupted one."""

    def objective(params, rest, model_def, micro, key):
        # copy=True: fresh Variables at this trace level, so the forward may update non-parameter state.
        model = nnx.merge(model_def, params, rest, copy=True)
        (objective_sum, sums), aux = with_aux_loss(loss_fn, model, micro, nnx.Rngs(dropout=key), True)
        # Non-parameter state the forward changed (RNG stream counters, redrawn random features).
        new_rest = nnx.state(model, nnx.Not(nnx.Param))
        # Aux losses are means per micro-batch: weight them by its example count.
        return objective_sum + aux * sums["count"], ({**sums, "aux_loss": aux * sums["count"]}, new_rest)

    grad_fn = jax.grad(objective, has_aux=True)

    def step(state, batch, key):
        model, optimizer = nnx.merge(graphdef, state)
        model_def, params, rest = nnx.split(model, nnx.Param, ...)
        key = jax.random.fold_in(key, optimizer.step[...])
        if accum_steps == 1:
            grads, (sums, rest) = grad_fn(params, rest, model_def, batch, key)
        else:
            micro = jax.tree.map(lambda x: x.reshape(accum_steps, -1, *x.shape[1:]), batch)

            def body(carry, xs):
                g_acc, s_acc, rest = carry
                mb, i = xs
                g, (s, rest) = grad_fn(params, rest, model_def, mb, jax.random.fold_in(key, i))
                return (jax.tree.map(jnp.add, g_acc, g), jax.tree.map(jnp.add, s_acc, s), rest), None

            zeros_g = jax.tree.map(jnp.zeros_like, params)
            first = jax.tree.map(lambda x: x[0], micro)
            _, (s_shape, _) = jax.eval_shape(grad_fn, params, rest, model_def, first, key)
            zeros_s = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), s_shape)
            carry = (zeros_g, zeros_s, rest)
            (grads, sums, rest), _ = jax.lax.scan(body, carry, (micro, jnp.arange(accum_steps)))
        nnx.update(model, rest)
        count = jnp.maximum(sums["count"], 1.0)
        grads = jax.tree.map(lambda g: g / count, grads)
        sums["grad_norm"] = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads))) * sums["count"]
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), sums

    return jax.jit(
        _under_mesh(step, batch_sharding.mesh),
        in_shardings=(state_sharding, batch_sharding, replicated),
        out_shardings=(state_sharding, replicated),
        donate_argnums=(0,),
    )


def make_eval_step(graphdef, loss_fn: LossFn, *, state_sharding, batch_sharding, replicated):
    """Returns `eval_step(state, batch) -> metric sums` with the model in eval mode (no dropout, no aux)."""

    def step(state, batch):
        model, _ = nnx.merge(graphdef, state)
        model.eval()
        _, sums = loss_fn(model, batch, None, False)
        return sums

    return jax.jit(
        _under_mesh(step, batch_sharding.mesh), in_shardings=(state_sharding, batch_sharding), out_shardings=replicated
    )
