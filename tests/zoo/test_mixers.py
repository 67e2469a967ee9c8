"""Every registered mixer: shapes, dtypes, jit, gradients, causality and padding invariance in the encoder."""

import warnings

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from flax import nnx

import kernels
from zoo import mixers, models
from zoo.layers import AuxLoss
from zoo.mixers.linear import FEATURE_MAPS
from zoo.mixers.relu import relu_regularisers
from zoo.training.steps import with_aux_loss

D, H, T, B = 32, 4, 12, 2


def _mixer(name, **options):
    cfg = mixers.default_config(name)
    cfg.d_model, cfg.num_heads, cfg.max_length = D, H, T
    cfg.update(options)
    return mixers.build(cfg, rngs=nnx.Rngs(0))


def _encoder(name, dtype="float32", **options):
    cfg = models.model_config(
        mixer=name, num_layers=2, d_model=D, num_heads=H, mlp_dim=64, max_length=T, dtype=dtype, dropout=0.0
    )
    cfg.mixer_options[name].update(options)
    return models.Encoder(cfg, rngs=nnx.Rngs(1))


def _x(seed=0):
    return jax.random.normal(jax.random.key(seed), (B, T, D))


MASK = jnp.arange(T)[None] < jnp.array([[T], [7]])


def test_registry_lists_the_mixers():
    assert {"relu", "softmax"} <= set(mixers.names())
    assert mixers.names() == sorted(mixers.names())


def test_unknown_mixer_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown mixer 'nope'; valid mixers: .*relu.*softmax"):
        mixers.default_config("nope")
    cfg = models.model_config(mixer="nope")
    with pytest.raises(ValueError, match="valid mixers"):
        models.Encoder(cfg, rngs=nnx.Rngs(0))


def test_unknown_mixer_field_is_named():
    cfg = mixers.default_config("relu").to_dict()
    cfg["gama_init"] = 2.0
    import ml_collections

    with pytest.raises(ValueError, match=r"mixer 'relu' has no field\(s\) \['gama_init'\]"):
        mixers.build(ml_collections.ConfigDict(cfg), rngs=nnx.Rngs(0))


def test_default_config_is_locked_and_complete():
    cfg = mixers.default_config("relu")
    for field in ("name", "d_model", "num_heads", "max_length"):
        assert field in cfg
    cfg.d_model = 64  # shared fields can be overridden
    with pytest.raises(AttributeError):
        cfg.not_a_field = 1


class ShapesTest(parameterized.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(name=mixers.names(), causal=[False, True])
    def test_shapes_dtypes_jit(self, name, causal):
        layer = _mixer(name)

        @self.variant
        def apply(x, mask):
            return layer(x, mask=mask, causal=causal)

        y = apply(_x(), MASK)
        chex.assert_shape(y, (B, T, D))
        chex.assert_type(y, jnp.float32)
        chex.assert_tree_all_finite(y)


@pytest.mark.parametrize("name", mixers.names())
class TestEveryMixer:
    def test_bfloat16_compute_keeps_float32_params(self, name):
        layer = _mixer(name, dtype="bfloat16")
        y = layer(_x().astype(jnp.bfloat16), mask=MASK)
        chex.assert_type(y, jnp.bfloat16)
        for leaf in jax.tree.leaves(nnx.state(layer, nnx.Param)):
            assert leaf.dtype == jnp.float32

    def test_bfloat16_encoder_matches_float32_within_bfloat16_tolerance(self, name):
        """model.dtype=bfloat16 is the fp32 model computed in bf16: the same fp32 parameters, outputs and every
        parameter's gradient within bf16 rounding (relative error of the whole tensor), gradients in fp32."""

        def loss(enc, x):
            y = enc(x, mask=MASK)
            return jnp.mean(jnp.where(MASK[..., None], y.astype(jnp.float32), 0.0) ** 2), y

        results = {}
        for dtype in ("float32", "bfloat16"):
            enc = _encoder(name, dtype=dtype)
            (value, y), grads = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(enc, _x())
            results[dtype] = (value, y.astype(jnp.float32) * MASK[..., None], nnx.state(grads, nnx.Param))
        (v32, y32, g32), (v16, y16, g16) = results["float32"], results["bfloat16"]

        def rel(a, b):
            return float(jnp.linalg.norm(a - b) / jnp.maximum(jnp.linalg.norm(b), 1e-12))

        assert rel(y16, y32) < 3e-2, rel(y16, y32)
        assert abs(float(v16) - float(v32)) <= 3e-2 * abs(float(v32))
        for (path, a), b in zip(jax.tree.leaves_with_path(g16), jax.tree.leaves(g32), strict=True):
            assert a.dtype == jnp.float32, path
            chex.assert_tree_all_finite(a)
            if float(jnp.linalg.norm(b)) > 1e-6:  # parameters the loss barely reaches carry only noise
                assert rel(a, b) < 3e-2, (jax.tree_util.keystr(path), rel(a, b))  # measured ≤ 0.7%

    def test_finite_gradients(self, name):
        enc = _encoder(name)
        params = nnx.state(enc, nnx.Param)

        def loss(params):
            m = nnx.merge(nnx.graphdef(enc), params, nnx.state(enc, nnx.Not(nnx.Param)))
            return jnp.mean(m(_x(), mask=MASK, causal=False) ** 2)

        grads = jax.jit(jax.grad(loss))(params)
        chex.assert_tree_all_finite(grads)
        assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))


# Every mixer with its defaults, and the linear mixer with each other feature map: FAVOR+'s stabiliser takes a
# maximum over the keys, which must skip padded ones and, when causal, future ones.
VARIANTS = [(name, {}) for name in mixers.names()] + [
    ("linear", {"feature_map": f}) for f in FEATURE_MAPS if f != mixers.default_config("linear").feature_map
]
VARIANT_IDS = [name + "".join(f"-{v}" for v in options.values()) for name, options in VARIANTS]


@pytest.mark.parametrize("t0", [0, 5, 10])
@pytest.mark.parametrize(("name", "options"), VARIANTS, ids=VARIANT_IDS)
def test_encoder_causal_cannot_see_the_future(name, options, t0):
    enc = _encoder(name, **options)
    x = _x()
    x2 = x.at[:, t0 + 1 :].set(jax.random.normal(jax.random.key(7), x[:, t0 + 1 :].shape) * 3)
    y = enc(x, mask=None, causal=True)
    y2 = enc(x2, mask=None, causal=True)
    chex.assert_trees_all_close(y[:, : t0 + 1], y2[:, : t0 + 1], atol=1e-5)
    assert not np.allclose(y[:, t0 + 1 :], y2[:, t0 + 1 :], atol=1e-3)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("name", "options"), VARIANTS, ids=VARIANT_IDS)
def test_encoder_padding_invariance(name, options, causal):
    # Causal: the padding comes first, in every real position's past (trailing padding would be in their future,
    # hidden by causality alone, whatever the mask did).
    mask = MASK if not causal else jnp.arange(T)[None] >= jnp.array([[0], [5]])
    enc = _encoder(name, **options)
    x = _x()
    x2 = jnp.where(~mask[..., None], jax.random.normal(jax.random.key(3), x.shape) * 10, x)
    y = enc(x, mask=mask, causal=causal)
    y2 = enc(x2, mask=mask, causal=causal)
    real = mask[..., None]
    assert not np.allclose(x, x2)  # the padding did change
    chex.assert_trees_all_close(jnp.where(real, y, 0), jnp.where(real, y2, 0), atol=1e-5)


@pytest.mark.parametrize(
    ("name", "options"), [("linear", {"feature_map": "oglu"}), ("relu", {"norm_loss_weight": 0.1})], ids=str
)
def test_a_regulariser_is_collected_in_the_train_step_and_left_alone_outside_it(name, options):
    enc = _encoder(name, **options)  # training mode, regulariser on
    structure = jax.tree.structure(nnx.state(enc))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # sowing outside nnx.capture is deprecated in flax
        y = enc(_x(), mask=MASK)
    assert jax.tree.structure(nnx.state(enc)) == structure  # no variable left on the model
    y_step, aux = with_aux_loss(enc, _x(), mask=MASK)
    chex.assert_trees_all_close(y_step, y)
    assert float(aux) > 0  # the train step still gets it
    assert jax.tree.structure(nnx.state(enc)) == structure


def test_relu_gamma_is_learnable_per_head_or_fixed():
    learn = _mixer("relu")
    assert nnx.state(learn, nnx.Param)["log_gamma"][...].shape == (H,)
    fixed = _mixer("relu", gamma_learnable=False, gamma_init=2.0)
    assert "log_gamma" not in nnx.state(fixed, nnx.Param)
    np.testing.assert_allclose(jnp.exp(fixed.log_gamma[...]), 2.0, rtol=1e-6)


def test_relu_without_variance_reduction_is_the_ablation():
    on, off = _mixer("relu"), _mixer("relu", variance_reduction=False)
    y_on, y_off = on(_x()), off(_x())  # same parameters (same seed): outputs differ by √(n/2) before out-proj
    assert float(jnp.std(y_off)) > 1.5 * float(jnp.std(y_on))


@pytest.mark.parametrize("impl", ["xla", "pallas"])  # pallas: the statistics from the forward kernel
def test_relu_regularisers_sown_in_training_only_and_match_dense_definition(impl):
    layer = _mixer("relu", norm_loss_weight=0.3, entropy_loss_weight=0.2, entropy_margin=0.5, impl=impl)
    x = _x()
    _, sown = with_aux_loss(layer, x, mask=MASK, causal=True)

    # Dense re-computation of the definitions in docs/mixers.md from the attention matrix.
    b, t = x.shape[:2]
    split = lambda y: y.reshape(b, t, H, D // H)
    q, k = split(layer.query(x)), split(layer.key(x))
    gamma = jnp.exp(layer.log_gamma[...])
    ones = jnp.ones_like(q)
    reference = kernels.ReluAttentionOptions(impl="reference")
    a_rows = []
    for j in range(t):  # column j of a: attention to key j, read out through a one-hot value
        onehot = jnp.zeros_like(ones).at[:, j].set(1.0)
        a_rows.append(kernels.relu_attention(q, k, onehot, causal=True, key_mask=MASK, gamma=gamma, options=reference))
    a = jnp.stack([r[..., 0] for r in a_rows], axis=-1)  # [b, t, H, t]
    s = a.sum(-1)
    p = a / (s[..., None] + 1e-6)
    ent = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1)), 0), -1)
    n = kernels.visible_key_counts(MASK, causal=True)
    w = jnp.broadcast_to(MASK[..., None], s.shape)
    l_norm = jnp.sum(jnp.abs(jnp.log(s + 1e-6)) * w) / w.sum()
    l_ent = jnp.sum(jnp.maximum(ent - 0.5 * jnp.log(jnp.maximum(n, 2))[..., None], 0) * w) / w.sum()
    np.testing.assert_allclose(sown, 0.3 * l_norm + 0.2 * l_ent, rtol=1e-4)

    layer.eval()
    _, sown_in_eval = nnx.capture(layer, AuxLoss)(x, mask=MASK, causal=True)
    assert not jax.tree.leaves(sown_in_eval)


def test_relu_regularisers_are_zero_for_a_normalised_low_entropy_row():
    # One real key per row with weight 1: |log S| = 0 and entropy 0.
    row_sum = jnp.ones((1, 3, 2))
    l_norm, l_ent = relu_regularisers(row_sum, jnp.zeros_like(row_sum), jnp.ones((1, 3)), jnp.ones((1, 3), bool), 0.7)
    assert abs(float(l_norm)) < 1e-5 and float(l_ent) == 0.0


def test_d_model_not_divisible_by_heads():
    cfg = mixers.default_config("softmax")
    cfg.d_model, cfg.num_heads = 30, 4
    with pytest.raises(ValueError, match="d_model=30 is not divisible by num_heads=4"):
        mixers.build(cfg, rngs=nnx.Rngs(0))


def test_classifier_rejects_inputs_longer_than_max_length():
    cfg = models.model_config(d_model=D, num_heads=H, mlp_dim=32, max_length=8, dropout=0.0)
    model = models.SequenceClassifier(cfg, vocab_size=10, num_classes=3, rngs=nnx.Rngs(0))
    assert model(jnp.ones((2, 8), jnp.int32)).shape == (2, 3)
    with pytest.raises(ValueError, match="input length 9 exceeds model.max_length=8"):
        model(jnp.ones((2, 9), jnp.int32))


@pytest.mark.parametrize("name", mixers.names())
def test_wrong_input_is_an_error_naming_the_mixer_and_shape(name):
    mixer = _mixer(name)
    with pytest.raises(ValueError, match=rf"mixer '{name}'.*d_model={D}\], got shape \(2, 12, 16\)"):
        mixer(_x()[..., :16])
    with pytest.raises(ValueError, match=rf"mixer '{name}'.*floating-point, got dtype int32"):
        mixer(_x().astype(jnp.int32))
    with pytest.raises(ValueError, match=rf"mixer '{name}'.*mask must be bool"):
        mixer(_x(), mask=MASK.astype(jnp.float32))
    assert mixer(_x(), mask=MASK).shape == (B, T, D)


def test_qkv_width_apart_from_d_model_and_projections_without_biases():
    """The LRA code's Image model: d_model 128 with q/k/v 64 wide (8 heads of 8), no biases on q/k/v/out."""
    cfg = mixers.default_config("softmax")
    cfg.d_model, cfg.num_heads, cfg.qkv_dim, cfg.attention_bias = 128, 8, 64, False
    layer = mixers.build(cfg, rngs=nnx.Rngs(0))
    assert (layer.num_heads, layer.head_dim) == (8, 8)
    assert layer.query.kernel.shape == (128, 64) and layer.out.kernel.shape == (64, 128)
    assert all(p.bias is None for p in (layer.query, layer.key, layer.value, layer.out))
    x = jax.random.normal(jax.random.key(0), (2, 5, 128))
    chex.assert_shape(layer(x), (2, 5, 128))
    cfg.qkv_dim = 60
    with pytest.raises(ValueError, match="qkv_dim=60 is not divisible by num_heads=8"):
        mixers.build(cfg, rngs=nnx.Rngs(0))


def _softmax_with_dropout(rate):
    cfg = mixers.default_config("softmax")
    cfg.d_model, cfg.num_heads, cfg.attention_dropout = 16, 2, rate
    return mixers.build(cfg, rngs=nnx.Rngs(0))


def test_attention_dropout_drops_weights_per_element_in_training_only():
    x = jax.random.normal(jax.random.key(1), (2, 6, 16))
    mask = jnp.arange(6)[None] < jnp.array([[6], [4]])
    plain = _softmax_with_dropout(0.0)(x, mask=mask)
    layer = _softmax_with_dropout(0.5)
    # Same parameters (same seed): without rngs in eval mode it is the plain attention, to the bit.
    layer.eval()
    chex.assert_trees_all_close(layer(x, mask=mask), plain, atol=1e-6)
    layer.train()
    rngs = nnx.Rngs(dropout=3)
    # Jitted once: 400 eager calls through the blocked softmax take over a minute.
    call = nnx.jit(lambda layer, x, mask, rngs: layer(x, mask=mask, rngs=rngs))
    draws = jnp.stack([call(layer, x, mask, rngs) for _ in range(400)])
    assert float(jnp.max(jnp.abs(draws[0] - draws[1]))) > 1e-3  # a new mask each call
    # Inverted dropout keeps the expectation: the mean of 400 draws is near the plain output.
    assert float(jnp.max(jnp.abs(draws.mean(0) - plain))) < 0.15 * float(jnp.max(jnp.abs(plain)))
    # Padded keys stay invisible under dropout: changing them changes nothing.
    y1 = layer(x, mask=mask, rngs=nnx.Rngs(dropout=7))
    y2 = layer(x.at[1, 4:].set(9.0), mask=mask, rngs=nnx.Rngs(dropout=7))
    chex.assert_trees_all_close(y1[1, :4], y2[1, :4], atol=1e-5)
    all_dropped = _softmax_with_dropout(0.0)
    all_dropped.weights_dropout.rate = 1.0
    assert float(jnp.max(jnp.abs(all_dropped(x, mask=mask, rngs=rngs) - all_dropped.out.bias[...]))) < 1e-6


def test_a_regulariser_outside_capture_says_once_how_to_collect_it(monkeypatch):
    """A relu mixer with regulariser weights called in training outside `nnx.capture` computes no auxiliary loss
    (nothing would consume it) and says so once a process, naming the weights and `with_aux_loss`; inside it the
    loss comes back, and nothing is said."""
    from zoo.layers import common

    said = []
    monkeypatch.setattr(common, "_UNCOLLECTED", set())
    monkeypatch.setattr(common.logging, "warning", lambda message, *args: said.append(message % args))
    cfg = mixers.default_config("relu")
    cfg.update(d_model=16, num_heads=2, max_length=8, norm_loss_weight=0.1)
    layer = mixers.build(cfg, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (2, 8, 16))
    layer(x)
    layer(x)
    assert len(said) == 1 and "mixer 'relu': norm_loss_weight" in said[0] and "with_aux_loss" in said[0], said
    _, aux = with_aux_loss(layer, x)
    assert float(aux) > 0 and len(said) == 1
