"""Linear attention mixer: feature maps, orthogonality regulariser, FAVOR+, stacks."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import kernels
from zoo import mixers
from zoo.layers import AuxLoss
from zoo.mixers.linear import FEATURE_MAPS, favor_features, orthogonal_random_features, orthogonality_penalty
from zoo.training.steps import with_aux_loss

D, H = 32, 4
TRAINABLE = ("softplus", "orth_softplus", "glu", "oglu", "aoglu")


def _linear(**options):
    cfg = mixers.default_config("linear")
    cfg.d_model, cfg.num_heads, cfg.max_length = D, H, 16
    cfg.update(options)
    return mixers.build(cfg, rngs=nnx.Rngs(0))


CASES = [(fm, 1) for fm in FEATURE_MAPS] + [(fm, depth) for fm in TRAINABLE for depth in (2, 3)]


@pytest.mark.parametrize("feature_map, depth", CASES)
def test_feature_maps_are_positive_and_attention_runs(feature_map, depth):
    layer = _linear(feature_map=feature_map, kernel_depth=depth)
    x = jax.random.normal(jax.random.key(1), (2, 16, H, D // H)) * 4.0  # large, mostly negative too
    for is_query in (True, False):
        phi = layer.feature_map(x, is_query=is_query, mask=None, causal=False)
        assert bool(jnp.all(phi > 0)), f"{feature_map}×{depth}: min {float(phi.min())}"
        chex.assert_tree_all_finite(phi)
    y, _ = with_aux_loss(layer, jax.random.normal(jax.random.key(2), (2, 16, D)), causal=True)  # sows, in training
    chex.assert_shape(y, (2, 16, D))
    chex.assert_tree_all_finite(y)


@pytest.mark.parametrize("feature_map", ["orth_softplus", "oglu", "aoglu"])
def test_orthogonal_init_gives_zero_regulariser_and_it_is_sown_in_training(feature_map):
    layer = _linear(feature_map=feature_map, kernel_depth=2, orth_loss_weight=0.1)
    assert float(layer.feature_map.penalty()) < 1e-10
    w = jax.random.normal(jax.random.key(0), (H, 8, 8))
    assert float(orthogonality_penalty(w)) > 0.1  # a random matrix is far from orthogonal
    x = jax.random.normal(jax.random.key(2), (2, 16, D))
    _, sown = with_aux_loss(layer, x)
    np.testing.assert_allclose(sown, 0.1 * layer.feature_map.penalty(), atol=1e-12)
    layer.eval()
    _, sown_in_eval = nnx.capture(layer, AuxLoss)(x)
    assert not jax.tree.leaves(sown_in_eval)


def test_non_orthogonal_maps_sow_nothing():
    layer = _linear(feature_map="glu")
    _, sown = nnx.capture(layer, AuxLoss)(jax.random.normal(jax.random.key(2), (2, 16, D)))
    assert not jax.tree.leaves(sown)


def test_aoglu_gate_is_low_rank():
    layer = _linear(feature_map="aoglu")
    kernel = layer.feature_map.kernels()[0]
    hd = D // H
    assert kernel.gate_a[...].shape == (H, hd, hd // 4) and kernel.gate_b[...].shape == (H, hd // 4, hd)


def test_bad_feature_map_options():
    with pytest.raises(
        ValueError, match=r"mixer_options.linear.feature_map='cosine' must be one of elu1, relu, favor, softplus"
    ):
        _linear(feature_map="cosine")
    with pytest.raises(ValueError, match="kernel_depth=2 is not valid for feature_map 'elu1'"):
        _linear(feature_map="elu1", kernel_depth=2)


def test_favor_approaches_softmax_as_features_grow():
    b, t, d = 2, 64, 16
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    q, k = (jax.random.normal(key, (b, t, 1, d)) * 0.6 for key in (kq, kk))
    v = jax.random.normal(kv, (b, t, 1, d))
    exact = jax.nn.dot_product_attention(q, k, v)
    errors = []
    for m in (16, 128, 1024, 8192):
        omega = orthogonal_random_features(jax.random.key(m), m, d)
        phi_q = favor_features(q, omega, is_query=True, mask=None, causal=False)
        phi_k = favor_features(k, omega, is_query=False, mask=None, causal=False)
        approx = kernels.linear_attention(phi_q, phi_k, v, options=kernels.LinearAttentionOptions(impl="reference"))
        errors.append(float(jnp.mean(jnp.abs(approx - exact))))
    assert errors[0] > errors[1] > errors[2] > errors[3], errors
    assert errors[-1] < 0.25 * errors[0] and errors[-1] < 0.03, errors


def test_favor_random_features_are_orthogonal_blocks():
    w = orthogonal_random_features(jax.random.key(0), 20, 8)
    block = w[:8] / jnp.linalg.norm(w[:8], axis=1, keepdims=True)
    chex.assert_trees_all_close(block @ block.T, jnp.eye(8), atol=1e-5)


def test_favor_features_are_state_and_redraw_is_a_choice():
    fixed = _linear(feature_map="favor", num_features=32)
    assert "omega" not in str(jax.tree_util.tree_structure(nnx.state(fixed, nnx.Param)))
    before = fixed.feature_map.omega[...]
    fixed(jax.random.normal(jax.random.key(0), (1, 8, D)))
    chex.assert_trees_all_equal(fixed.feature_map.omega[...], before)

    redraw = _linear(feature_map="favor", num_features=32, favor_redraw=True)
    before = redraw.feature_map.omega[...]
    redraw(jax.random.normal(jax.random.key(0), (1, 8, D)))
    after = redraw.feature_map.omega[...]
    assert not np.allclose(before, after)
    redraw.eval()
    redraw(jax.random.normal(jax.random.key(0), (1, 8, D)))
    chex.assert_trees_all_equal(redraw.feature_map.omega[...], after)


def test_a_checkpoint_of_the_kernel_stack_under_integer_keys_restores_into_its_dict(tmp_path):
    """Before nnx.capture the stacked kernels were an nnx.List (keys 0, 1); checkpoints store keys as strings, so a
    run saved then resumes into today's nnx.Dict (keys "0", "1") with the same values."""
    import orbax.checkpoint as ocp

    layer = _linear(feature_map="oglu", kernel_depth=2)
    state = nnx.to_pure_dict(nnx.state(layer))
    stack = state["feature_map"]["layers"]
    assert sorted(stack) == ["0", "1"]
    old = {**state, "feature_map": {**state["feature_map"], "layers": {int(k): v for k, v in stack.items()}}}
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "ckpt", old)
    checkpointer.wait_until_finished()
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    restored = checkpointer.restore(tmp_path / "ckpt", abstract)
    chex.assert_trees_all_close(restored, state)
