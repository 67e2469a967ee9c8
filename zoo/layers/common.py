"""Small helpers shared by layers and mixers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from absl import logging
from flax import nnx
from jax.sharding import PartitionSpec as P

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


# Mesh axes the batch is split over (zoo.training.mesh: data × fsdp).
BATCH_AXES = ("data", "fsdp")


def constrain_batch_sharded(x: jax.Array) -> jax.Array:
    """`x` [batch, ...] split over the batch axes of the mesh the step is traced under, whole along the rest: pins
    activations at block boundaries, so XLA's propagation cannot leave them replicated. A no-op without a mesh."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(BATCH_AXES) <= set(mesh.axis_names):
        return x
    return jax.lax.with_sharding_constraint(x, P(BATCH_AXES))


class AuxLoss(nnx.Intermediate):
    """Auxiliary losses sown by modules (already weighted) in training; the train step collects them with
    `nnx.capture` (`zoo.training.steps.with_aux_loss`) and adds their sum to the task loss."""


_UNCOLLECTED: set[str] = set()  # regularisers already said to be uncollected in this process


def collects_aux_loss(module: nnx.Module, regulariser: str) -> bool:
    """Whether `module` runs inside `nnx.capture` (the train step's `with_aux_loss`), where a sown `AuxLoss` is
    collected. Outside it, sowing would add a variable to the module's state (which flax deprecates), so the
    regulariser is skipped and `regulariser` (what switched it on) is named once a process."""
    if hasattr(module, "__captures__"):  # what `nnx.capture` sets on every module while it runs
        return True
    if regulariser not in _UNCOLLECTED:
        _UNCOLLECTED.add(regulariser)
        logging.warning(
            "%s is set, but its auxiliary loss is collected only inside nnx.capture: call the model through "
            "zoo.training.with_aux_loss(model, ...) and add the loss it returns (the training commands do)",
            regulariser,
        )
    return False


def compute_dtype(name: str):
    """The compute dtype for a config string; parameters always stay float32."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; valid: {', '.join(DTYPES)}") from None


def logical(initializer, *axes: str | None):
    """`initializer` tagged with logical axis names, one per parameter dimension (zoo.training.mesh maps them to
    mesh axes; untagged parameters are replicated)."""
    return nnx.with_metadata(initializer, logical_axes=tuple(axes))


def dense(
    d_in: int,
    d_out: int,
    axes: tuple[str | None, str | None],
    *,
    dtype,
    rngs: nnx.Rngs,
    use_bias=True,
    init=None,
    bias_init=None,
):
    """nnx.Linear whose kernel is tagged `axes` and whose bias the output axis (defaults: flax's Dense)."""
    return nnx.Linear(
        d_in,
        d_out,
        use_bias=use_bias,
        kernel_init=logical(init or nnx.initializers.lecun_normal(), *axes),
        bias_init=logical(bias_init or nnx.initializers.zeros_init(), axes[1]),
        dtype=dtype,
        rngs=rngs,
    )
