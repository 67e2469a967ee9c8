"""model.scan_layers: one block traced once over stacked parameters gives the unrolled model's loss, gradients
and incremental decoding (same parameters), keeps the logical axes (plus a layer axis), and composes with remat."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from zoo import models
from zoo.training import mesh as mesh_lib

T, V = 12, 17


def _cfg(mixer, **extra):
    fields = dict(mixer=mixer, num_layers=3, d_model=32, num_heads=4, mlp_dim=32, max_length=T, dropout=0.0)
    cfg = models.model_config(**{**fields, **extra})
    if mixer in ("gmlp", "amlp"):
        cfg.mixer_options[mixer].d_ffn = 32
    return cfg


def _stack_blocks(tree):
    """An unrolled model's pure-dict state with each `blocks` list stacked on a leading layer axis."""
    if not isinstance(tree, dict):
        return tree
    out = {k: _stack_blocks(v) for k, v in tree.items()}
    blocks = out.get("blocks")
    if isinstance(blocks, dict) and blocks and all(isinstance(k, int) for k in blocks):
        out["blocks"] = jax.tree.map(lambda *xs: jnp.stack(xs), *(blocks[i] for i in sorted(blocks)))
    return out


def _pair(make, mixer, **extra):
    """(unrolled, scanned) models with the same parameters."""
    unrolled = make(_cfg(mixer, **extra))
    scanned = make(_cfg(mixer, scan_layers=True, **extra))
    state = nnx.state(scanned, nnx.Param)
    nnx.replace_by_pure_dict(state, _stack_blocks(nnx.to_pure_dict(nnx.state(unrolled, nnx.Param))))
    nnx.update(scanned, state)
    return unrolled, scanned


def _classifier(cfg):
    return models.SequenceClassifier(cfg, vocab_size=V, num_classes=5, rngs=nnx.Rngs(0))


def _tokens(seed=0):
    tokens = jax.random.randint(jax.random.key(seed), (2, T), 1, V)
    return tokens.at[1, 7:].set(0)  # a padded row


@pytest.mark.parametrize(
    "mixer, remat", [("softmax", "none"), ("relu", "none"), ("linear", "none"), ("gmlp", "none"), ("relu", "full")]
)
def test_scanned_layers_give_the_unrolled_loss_and_gradients(mixer, remat):
    unrolled, scanned = _pair(_classifier, mixer, remat=remat)
    tokens, labels = _tokens(), jnp.array([1, 3])

    def loss(model):
        logits = model(tokens, rngs=nnx.Rngs(dropout=0))
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

    ref_loss, ref_grads = nnx.jit(nnx.value_and_grad(loss))(unrolled)
    got_loss, got_grads = nnx.jit(nnx.value_and_grad(loss))(scanned)
    assert float(got_loss) == pytest.approx(float(ref_loss), rel=1e-6)
    ref = _stack_blocks(nnx.to_pure_dict(nnx.state(ref_grads, nnx.Param)))
    chex.assert_trees_all_close(nnx.to_pure_dict(nnx.state(got_grads, nnx.Param)), ref, atol=1e-6, rtol=1e-5)


def test_scanned_layers_dropout_follows_the_key_and_is_off_in_eval_mode():
    cfg = _cfg("relu", scan_layers=True, dropout=0.5)
    model = _classifier(cfg)
    tokens = _tokens()
    a = model(tokens, rngs=nnx.Rngs(dropout=0))
    b = model(tokens, rngs=nnx.Rngs(dropout=0))
    c = model(tokens, rngs=nnx.Rngs(dropout=1))
    chex.assert_trees_all_close(a, b)  # the same key, the same masks
    assert not np.allclose(a, c)
    model.eval()
    chex.assert_trees_all_close(model(tokens, rngs=nnx.Rngs(dropout=0)), model(tokens, rngs=nnx.Rngs(dropout=1)))


@pytest.mark.parametrize("mixer", ["softmax", "relu", "linear"])
def test_scanned_decoder_decodes_like_its_full_forward_and_like_the_unrolled_one(mixer):
    def lm(cfg):
        return models.CausalLM(cfg, vocab_size=V, rngs=nnx.Rngs(0))

    unrolled, scanned = _pair(lm, mixer)
    unrolled.eval()
    scanned.eval()
    tokens = jax.random.randint(jax.random.key(2), (2, T), 1, V)
    full = nnx.jit(lambda m, x: m(x))(scanned, tokens)
    chex.assert_trees_all_close(full, nnx.jit(lambda m, x: m(x))(unrolled, tokens), atol=1e-5, rtol=1e-5)

    @nnx.jit
    def decode_all(model, tokens):
        def step(cache, token):
            logits, cache = model.decode(token[:, None], cache)
            return cache, logits[:, 0]

        _, logits = jax.lax.scan(step, model.init_cache(tokens.shape[0]), tokens.T)
        return logits.transpose(1, 0, 2)

    chex.assert_trees_all_close(decode_all(scanned, tokens), full, atol=2e-4, rtol=2e-4)


def test_stacked_parameters_keep_their_logical_axes_behind_a_layer_axis():
    class Mesh:
        shape = {"data": 1, "fsdp": 2, "tensor": 2}  # noqa: RUF012

    model = nnx.eval_shape(lambda: _classifier(_cfg("relu", scan_layers=True)))
    query = model.encoder.encoder.blocks.mixer.query.kernel
    assert query.shape == (3, 32, 32) and query.get_metadata()["logical_axes"] == (None, "embed", "heads")
    assert mesh_lib.logical_to_spec(query.get_metadata()["logical_axes"], query.shape, Mesh()) == P(
        None, "fsdp", "tensor"
    )
    assert mesh_lib.sharding_report(nnx.state(model, nnx.Param), Mesh())["unsplit"] == []
    real = _classifier(_cfg("relu", num_layers=2, scan_layers=True))
    layers = real.encoder.encoder.layers()
    assert len(layers) == 2 and layers[1].mixer.query.kernel.shape == (32, 32)
    np.testing.assert_array_equal(layers[1].mixer.query.kernel[...], real.encoder.encoder.blocks.mixer.query.kernel[1])


@pytest.mark.parametrize(
    "mixer, options",
    [("relu", {"norm_loss_weight": 0.1, "entropy_loss_weight": 0.1}), ("linear", {"feature_map": "aoglu"})],
)
def test_sown_regularisers_of_every_scanned_layer_count_as_in_the_unrolled_model(mixer, options):
    from zoo.training.steps import with_aux_loss

    def make(cfg):
        cfg.mixer_options[mixer].update(options)
        return _classifier(cfg)

    unrolled, scanned = _pair(make, mixer)
    aux = []
    for model in (unrolled, scanned):
        _, total = with_aux_loss(model, _tokens(), rngs=nnx.Rngs(dropout=0))
        aux.append(float(total))
    assert aux[0] > 0 and aux[1] == pytest.approx(aux[0], rel=1e-5)


def test_favor_features_are_redrawn_in_every_scanned_layer_by_a_train_step():
    from zoo.training import classification_loss, mesh_config, train_config
    from zoo.training.state import create_train_state, state_builder
    from zoo.training.steps import make_train_step

    cfg = _cfg("linear", scan_layers=True)
    cfg.mixer_options.linear.update(feature_map="favor", num_features=16, favor_redraw=True)
    mesh = mesh_lib.make_mesh(mesh_config())

    def build(rngs):
        return models.SequenceClassifier(cfg, vocab_size=V, num_classes=5, rngs=rngs)

    graphdef, state, sharding = create_train_state(state_builder(build, train_config(), 0), mesh)
    step = make_train_step(graphdef, classification_loss(), accum_steps=1, **mesh_lib.step_shardings(mesh, sharding))

    def omega(state):
        return np.asarray(nnx.to_pure_dict(state)[0]["encoder"]["encoder"]["blocks"]["mixer"]["feature_map"]["omega"])

    batch = {"inputs": np.asarray(_tokens()), "targets": np.array([1, 3], np.int32), "weights": np.ones(2, np.float32)}
    before = omega(state)
    state, sums = step(state, mesh_lib.put_batch(batch, mesh), jax.random.key(0))
    after = omega(state)
    assert after.shape[0] == 3 and np.isfinite(float(sums["loss"]))
    assert all(not np.allclose(before[i], after[i]) for i in range(3))  # each layer drew new features
    assert not np.allclose(after[0], after[1])  # from its own stream
