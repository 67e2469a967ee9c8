"""train.weight_decay_mask: which parameters AdamW decays. γ and the SGU's spatial bias never are; BERT's mask
also spares norms and biases. Checked on real models: a step with zero gradients moves exactly the decayed."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from zoo import models
from zoo.training import train_config
from zoo.training.optim import decays, make_optimizer


def _paths_moved(mixer, mask):
    cfg = models.model_config(mixer=mixer, num_layers=1, d_model=16, num_heads=2, mlp_dim=16, max_length=8)
    model = models.Encoder(cfg, rngs=nnx.Rngs(0))
    train = train_config(learning_rate=0.1, warmup_steps=0, schedule="constant", weight_decay=0.5,
                         weight_decay_mask=mask, grad_clip_norm=0.0)  # fmt: skip
    optimizer = nnx.Optimizer(model, make_optimizer(train), wrt=nnx.Param)
    nnx.update(model, jax.tree.map(jnp.ones_like, nnx.state(model, nnx.Param)))  # non-zero: decay must show
    before = jax.tree.map(jnp.copy, nnx.state(model, nnx.Param))
    zeros = jax.tree.map(jnp.zeros_like, before)
    optimizer.update(model, zeros)  # no gradient: only weight decay can move a parameter
    after = nnx.state(model, nnx.Param)
    moved = {}
    for (path, old), (_, new) in zip(
        jax.tree_util.tree_leaves_with_path(before), jax.tree_util.tree_leaves_with_path(after), strict=True
    ):
        name = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path).removesuffix("/.value")
        moved[name] = bool(jnp.any(old != new))
    return moved


def test_relu_gamma_is_never_decayed_and_all_means_all_else():
    moved = _paths_moved("relu", "all")
    gamma = [k for k in moved if k.endswith("log_gamma")]
    assert gamma and not any(moved[k] for k in gamma)
    assert all(v for k, v in moved.items() if not k.endswith("log_gamma")), moved


def test_sgu_spatial_bias_is_never_decayed():
    moved = _paths_moved("gmlp", "all")
    bias = [k for k in moved if k.endswith("spatial_bias")]
    assert bias and not any(moved[k] for k in bias)


def test_bert_mask_spares_norms_and_biases():
    moved = _paths_moved("softmax", "no_norm_or_bias")
    spared = [k for k in moved if "norm" in k or k.endswith("bias") or k.endswith("scale")]
    decayed = [k for k in moved if k not in spared]
    assert spared and decayed
    assert not any(moved[k] for k in spared), {k: moved[k] for k in spared}
    assert all(moved[k] for k in decayed), {k: moved[k] for k in decayed}


@pytest.mark.parametrize(
    "path, mask, expected",
    [
        (("blocks", "0", "mixer", "query", "kernel"), "no_norm_or_bias", True),
        (("blocks", "0", "mixer", "query", "bias"), "no_norm_or_bias", False),
        (("blocks", "0", "mixer_norm", "scale"), "no_norm_or_bias", False),
        (("head", "output_bias"), "no_norm_or_bias", False),
        (("blocks", "0", "mixer_norm", "scale"), "all", True),
        (("blocks", "0", "mixer", "log_gamma"), "all", False),
    ],
)
def test_decays(path, mask, expected):
    assert decays(path, mask) is expected


def test_unknown_mask_names_the_field():
    with pytest.raises(ValueError, match=r"train.weight_decay_mask='bert'.*valid: all, no_norm_or_bias"):
        decays(("w",), "bert")
