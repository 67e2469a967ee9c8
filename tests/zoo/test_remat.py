"""model.remat (none | full | dots) changes memory, not results: the same loss and gradients as the plain
encoder, dropout included (the recomputed forward draws the same masks)."""

import functools

import chex
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from zoo import models
from zoo.models.encoder import REMAT_POLICIES


@functools.cache  # the plain encoder's, the reference of both remat policies, computed once per mixer
def _loss_and_grads(remat, mixer):
    cfg = models.model_config(
        mixer=mixer, num_layers=2, d_model=32, num_heads=4, mlp_dim=32, max_length=16, dropout=0.1, remat=remat
    )
    encoder = models.Encoder(cfg, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (2, 16, 32))
    mask = jnp.arange(16)[None] < jnp.array([[16], [9]])

    def loss(encoder):
        return jnp.mean(encoder(x, mask=mask, rngs=nnx.Rngs(dropout=3)) ** 2)

    return nnx.jit(nnx.value_and_grad(loss))(encoder)  # as training runs it, and one program instead of ~100


@pytest.mark.parametrize("mixer", ["relu", "softmax", "linear", "gmlp"])
@pytest.mark.parametrize("remat", ["full", "dots"])
def test_remat_gives_the_same_loss_and_gradients(remat, mixer):
    loss, grads = _loss_and_grads(remat, mixer)
    ref_loss, ref_grads = _loss_and_grads("none", mixer)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-6)
    chex.assert_trees_all_close(grads, ref_grads, atol=1e-6, rtol=1e-5)


def _checkpoint_policies(jaxpr) -> list:
    """The policy of every rematerialised region (jax.checkpoint) in a jaxpr, nested ones included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("remat2", "checkpoint"):  # jax.checkpoint's primitive, by jax version
            found.append(eqn.params["policy"])
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else [param]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _checkpoint_policies(inner)
    return found


@pytest.mark.parametrize("remat", ["none", "full", "dots"])
def test_remat_puts_each_block_in_a_checkpoint_with_its_policy(remat):
    # The equality test above would pass with remat switched off: this one sees the mechanism.
    cfg = models.model_config(mixer="relu", num_layers=2, d_model=32, num_heads=4, mlp_dim=32, max_length=16,
                              dropout=0.0, remat=remat)  # fmt: skip
    graphdef, state = nnx.split(models.Encoder(cfg, rngs=nnx.Rngs(0)))
    x = jax.random.normal(jax.random.key(1), (2, 16, 32))

    def loss(state):
        return jnp.mean(nnx.merge(graphdef, state)(x, mask=None) ** 2)

    policies = _checkpoint_policies(jax.make_jaxpr(jax.grad(loss))(state).jaxpr)
    expected = {"none": [], "full": [None, None], "dots": [REMAT_POLICIES["dots"]] * 2}[remat]
    assert policies == expected


def test_unknown_remat_names_the_field():
    cfg = models.model_config(mixer="relu", num_layers=1, d_model=16, num_heads=2, remat="some")
    with pytest.raises(ValueError, match=r"model.remat='some' must be one of none, full, dots"):
        models.Encoder(cfg, rngs=nnx.Rngs(0))


@pytest.mark.parametrize(
    "mixer, options, remat, scan",
    [
        ("relu", {"norm_loss_weight": 0.1, "entropy_loss_weight": 0.1}, "full", True),
        ("linear", {"feature_map": "oglu", "kernel_depth": 2}, "dots", False),
    ],
)
def test_the_sown_regularisers_and_their_gradients_are_the_same_under_remat(mixer, options, remat, scan):
    """nnx.capture collects what the rematerialised (and scanned) blocks sow, as the plain encoder's."""
    from zoo.training.steps import with_aux_loss

    def run(remat):
        cfg = models.model_config(
            mixer=mixer, num_layers=2, d_model=32, num_heads=4, mlp_dim=32, max_length=16, dropout=0.1, remat=remat,
            scan_layers=scan,
        )  # fmt: skip
        cfg.mixer_options[mixer].update(options)
        encoder = models.Encoder(cfg, rngs=nnx.Rngs(0))
        x = jax.random.normal(jax.random.key(1), (2, 16, 32))
        mask = jnp.arange(16)[None] < jnp.array([[16], [9]])

        def loss(encoder):
            out, aux = with_aux_loss(lambda e: e(x, mask=mask, rngs=nnx.Rngs(dropout=3)), encoder)
            return jnp.mean(out**2) + aux, aux

        return nnx.jit(nnx.value_and_grad(loss, has_aux=True))(encoder)

    (loss, aux), grads = run(remat)
    (ref_loss, ref_aux), ref_grads = run("none")
    assert float(aux) == pytest.approx(float(ref_aux), rel=1e-6) and float(ref_aux) != 0.0
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-6)
    chex.assert_trees_all_close(grads, ref_grads, atol=1e-6, rtol=1e-5)
