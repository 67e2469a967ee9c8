"""FFN / key-value-memory variants, dual encoder, encoder-decoder masking, parameter counts."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from zoo import mixers, models, parameter_counts
from zoo.layers import FFN_KINDS, FeedForward

D = 16


@pytest.mark.parametrize("kind", [k for k in FFN_KINDS if k != "none"])
def test_ffn_variants(kind):
    ffn = FeedForward(D, 32, kind=kind, dropout=0.0, dtype=jnp.float32, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (2, 5, D))
    y = ffn(x)
    chex.assert_shape(y, x.shape)
    chex.assert_tree_all_finite(y)
    has_bias = ffn.wi.bias is not None
    assert has_bias == (kind in ("relu", "gelu"))  # memories are plain K, V matrices
    if kind == "softmax_ln_memory":
        np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-5)
        np.testing.assert_allclose(y.var(-1), 1.0, atol=1e-2)
    if kind == "softmax_memory":  # a convex combination of the value slots
        weights = jax.nn.softmax(ffn.wi(x), axis=-1)
        chex.assert_trees_all_close(y, weights @ ffn.wo.kernel[...], atol=1e-5)


@pytest.mark.parametrize("slots", [64, 1024])
def test_softmax_matched_init_gives_a_softmax_memory_a_relu_ffns_output_variance(slots):
    """At lecun_normal, a softmax memory's output variance is σ_V² e/n = e/n² (inert at large n); with
    ffn_init="softmax_matched" it is the ReLU FFN's (both ~1/2 for unit-variance inputs), within sampling noise."""
    d = 128
    x = jax.random.normal(jax.random.key(1), (4, 256, d))

    def output_variance(kind, init):
        ffn = FeedForward(d, slots, kind=kind, dropout=0.0, dtype=jnp.float32, rngs=nnx.Rngs(2), init=init)
        return float(ffn(x).var())

    relu = output_variance("relu_memory", "lecun_normal")
    inert = output_variance("softmax_memory", "lecun_normal")
    matched = output_variance("softmax_memory", "softmax_matched")
    np.testing.assert_allclose(relu, 0.5, rtol=0.15)
    np.testing.assert_allclose(matched, relu, rtol=0.35)  # Σp² ≈ e/n holds for logits ~ N(0, 1) on average
    np.testing.assert_allclose(inert, np.e / slots**2, rtol=0.5)
    with pytest.raises(ValueError, match="model.ffn_init='softmax_matched'.*model.ffn='relu'"):
        FeedForward(d, slots, kind="relu", dropout=0.0, dtype=jnp.float32, rngs=nnx.Rngs(0), init="softmax_matched")


def test_unknown_ffn_kind():
    with pytest.raises(ValueError, match=r"unknown ffn kind 'swish'; valid: relu, gelu, softmax_memory"):
        FeedForward(D, 8, kind="swish", dropout=0.0, dtype=jnp.float32, rngs=nnx.Rngs(0))


def test_every_block_can_use_every_ffn():
    for kind in FFN_KINDS:
        cfg = models.model_config(d_model=D, num_heads=2, mlp_dim=8, max_length=6, dropout=0.0, ffn=kind)
        enc = models.Encoder(cfg, rngs=nnx.Rngs(0))
        chex.assert_shape(enc(jnp.ones((1, 6, D)), mask=None), (1, 6, D))


def test_dual_encoder_features():
    cfg = models.model_config(d_model=D, num_heads=2, mlp_dim=8, max_length=7, dropout=0.0)
    model = models.DualEncoder(cfg, vocab_size=11, num_classes=2, rngs=nnx.Rngs(0))
    a = jnp.array([[1, 2, 3, 0, 0, 0, 0]])
    b = jnp.array([[4, 5, 6, 7, 8, 0, 0]])
    chex.assert_shape(model(a, b), (1, 2))
    assert model.head.hidden.kernel[...].shape[0] == 4 * D
    assert not np.allclose(model(a, b), model(b, a))  # [x1, x2, x1·x2, x1 − x2] is ordered


def test_encoder_decoder_target_is_causal_and_source_padding_is_ignored():
    cfg = models.model_config(mixer="relu", d_model=D, num_heads=2, mlp_dim=8, max_length=8, dropout=0.0)
    model = models.EncoderDecoder(cfg, src_vocab=10, tgt_vocab=10, rngs=nnx.Rngs(0))
    src = jnp.array([[1, 2, 3, 4, 0, 0, 0, 0]])
    tgt = jnp.array([[1, 5, 6, 7, 8, 9, 2, 3]])
    base = model(src, tgt)
    changed_future = model(src, tgt.at[:, 5:].set(4))
    chex.assert_trees_all_close(base[:, :5], changed_future[:, :5], atol=1e-5)
    # Padded source positions (id 0) are masked: the padded source gives what the unpadded one does.
    chex.assert_trees_all_close(base, model(src[:, :4], tgt), atol=1e-5)


def test_parameter_counts_count_every_parameter_and_compares_with_softmax():
    cfg = models.model_config(mixer="linear", d_model=32, num_heads=4, mlp_dim=64, max_length=16)
    cfg.mixer_options.linear.feature_map = "glu"
    counts = parameter_counts.parameter_counts(cfg)
    enc = models.Encoder(cfg, rngs=nnx.Rngs(0))
    assert parameter_counts.total(counts) == sum(x.size for x in jax.tree.leaves(nnx.state(enc, nnx.Param)))
    assert set(counts) == {"block_0", "block_1", "final_norm"}
    extra_per_layer = 2 * 4 * 8 * 8  # W_f and W_g: [heads, head_dim, head_dim]
    assert counts["block_0"]["mixer"] == 4 * (32 * 32 + 32) + extra_per_layer
    text = parameter_counts.describe(cfg)
    assert "extra parameters vs softmax: +1,024" in text
    assert f"(same encoder with softmax attention, ffn={cfg.ffn} as configured)" in text
    # The baseline's softmax path is said for every mixer, not only for a softmax config.
    assert "softmax attention on this machine (the baseline's, and a softmax mixer's): XLA blocked softmax" in text


def test_a_stored_model_config_from_before_a_new_field_still_builds():
    from zoo.models import stored_model_config

    old = models.model_config(mixer="relu", num_layers=1, d_model=32, num_heads=4, max_length=16).to_dict()
    del old["remat"]  # written before model.remat existed
    del old["mixer_options"]["relu"]["gamma_init"]
    cfg = stored_model_config(old)
    assert cfg.remat == "none" and cfg.d_model == 32 and cfg.mixer_options.relu.gamma_init == 1.0
    models.Encoder(cfg, rngs=nnx.Rngs(0))


def _block_cfg(**fields):
    return models.model_config(mixer="softmax", d_model=16, num_heads=2, mlp_dim=24, max_length=8, **fields)


def test_post_ln_block_is_layernorm_after_each_residual_and_the_stack_has_no_final_norm():
    cfg = _block_cfg(norm="post", dropout=0.0)
    block = models.Block(cfg, max_length=8, cross=False, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (2, 8, 16))
    mask = jnp.ones((2, 8), bool)
    h = block.mixer_norm(x + block.mixer(x, mask=mask))
    want = block.ffn_norm(h + block.ffn(h))
    chex.assert_trees_all_close(block(x, mask=mask, causal=False), want, atol=1e-6)
    pre = models.Block(_block_cfg(dropout=0.0), max_length=8, cross=False, rngs=nnx.Rngs(0))
    h = x + pre.mixer(pre.mixer_norm(x), mask=mask)
    chex.assert_trees_all_close(pre(x, mask=mask, causal=False), h + pre.ffn(pre.ffn_norm(h)), atol=1e-6)
    assert models.Encoder(cfg, rngs=nnx.Rngs(0)).final_norm is None
    assert models.Encoder(_block_cfg(), rngs=nnx.Rngs(0)).final_norm is not None
    with pytest.raises(ValueError, match="model.norm='sandwich' must be one of pre, post"):
        models.Block(_block_cfg(norm="sandwich"), max_length=8, cross=False, rngs=nnx.Rngs(0))


def test_models_and_mixers_built_from_python_keep_the_declared_rules():
    """The commands validate a config before building; a model or mixer built in Python checks the same rules."""
    with pytest.raises(ValueError, match=r"unknown field\(s\) d_modle; valid: .*d_model"):
        models.model_config(d_modle=16)
    for field, value in [("dropout", 1.5), ("layer_norm_eps", -1.0), ("ffn_dropout", 2.0)]:
        with pytest.raises(ValueError, match=rf"config field model.{field}={value}"):
            models.Block(_block_cfg(**{field: value}), max_length=8, cross=False, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"config field model.dropout=1.5"):  # a stack checks once, for its blocks
        models.Encoder(_block_cfg(dropout=1.5), rngs=nnx.Rngs(0))
    relu = mixers.default_config("relu")
    relu.update(d_model=16, num_heads=2, norm_loss_weight=-1.0)
    with pytest.raises(ValueError, match=r"model.mixer_options.relu.norm_loss_weight=-1.0"):
        mixers.build(relu, rngs=nnx.Rngs(0))


def test_ffn_dropout_apart_from_the_residual_dropout_and_ffn_initialisers():
    block = models.Block(_block_cfg(dropout=0.3, ffn_dropout=0.0), max_length=8, cross=False, rngs=nnx.Rngs(0))
    assert block.dropout.rate == 0.3 and block.ffn.dropout.rate == 0.0  # fairseq: activation_dropout 0
    same = models.Block(_block_cfg(dropout=0.3), max_length=8, cross=False, rngs=nnx.Rngs(0))
    assert same.ffn.dropout.rate == 0.3  # -1: the residual rate (the LRA code's MlpBlock)
    with pytest.raises(ValueError, match="model.ffn_dropout=1.5 must be in"):
        models.Block(_block_cfg(ffn_dropout=1.5), max_length=8, cross=False, rngs=nnx.Rngs(0))
    d, m = 64, 256
    lra = FeedForward(d, m, kind="gelu", dropout=0.0, init="xavier_uniform", dtype=jnp.float32, rngs=nnx.Rngs(0))
    bias = lra.wi.bias[...]
    assert 0 < float(jnp.std(bias)) < 1e-5  # N(0, 1e-6²): the LRA code's MlpBlock
    assert float(jnp.max(jnp.abs(lra.wi.kernel[...]))) <= np.sqrt(6 / (d + m)) + 1e-6  # xavier_uniform's bound
    torch = FeedForward(d, m, kind="relu", dropout=0.0, init="torch", dtype=jnp.float32, rngs=nnx.Rngs(0))
    for layer, fan_in in ((torch.wi, d), (torch.wo, m)):
        bound = 1 / np.sqrt(fan_in)
        for p in (layer.kernel[...], layer.bias[...]):
            assert float(jnp.max(jnp.abs(p))) <= bound and float(jnp.max(jnp.abs(p))) > 0.9 * bound
    with pytest.raises(ValueError, match="model.ffn_init='he' is unknown"):
        FeedForward(d, m, kind="relu", dropout=0.0, init="he", dtype=jnp.float32, rngs=nnx.Rngs(0))


def test_attention_dropout_on_a_mixer_without_attention_weights_warns_once(monkeypatch):
    """Through a model or through `mixers.build` alike (the boundary both pass), once a process and mixer."""
    from zoo import mixers
    from zoo.mixers import registry

    said = []
    monkeypatch.setattr(registry, "_IGNORED_DROPOUT", set())
    monkeypatch.setattr(registry.logging, "warning", lambda message, *args: said.append(message % args))
    models.Encoder(models.model_config(mixer="linear", d_model=16, num_heads=2, attention_dropout=0.1),
                   rngs=nnx.Rngs(0))  # fmt: skip
    assert said == ["attention_dropout=0.1 does not apply to mixer 'linear': it never forms attention weights"]
    cfg = mixers.default_config("relu")
    cfg.update(d_model=16, num_heads=2, max_length=8, attention_dropout=0.2)
    mixers.build(cfg, rngs=nnx.Rngs(0))
    mixers.build(cfg, rngs=nnx.Rngs(0))
    assert said[1:] == ["attention_dropout=0.2 does not apply to mixer 'relu': it never forms attention weights"]


def _pixel_classifier(zero_is_padding, pooling="cls"):
    cfg = models.model_config(
        mixer="softmax", d_model=16, num_heads=2, mlp_dim=16, max_length=12, pad_id=-1, dropout=0.0,
        pixel_zero_is_padding=zero_is_padding, pooling=pooling,
    )  # fmt: skip
    return models.SequenceClassifier(cfg, vocab_size=256, num_classes=3, rngs=nnx.Rngs(0))


def test_pixel_zero_as_padding_hides_black_pixels_from_attention():
    """The LRA code's `inputs > 0` mask on pixel tasks: with [CLS] pooling the logits cannot depend on what a black
    pixel's token embeds to; without the quirk they do."""
    pixels = jnp.array([[0, 5, 0, 200, 7, 0, 0, 9, 1, 0, 3, 0]])
    for quirk, depends in ((True, False), (False, True)):
        model = _pixel_classifier(quirk)
        before = model(pixels)
        table = model.encoder.embed.embed.embedding
        table[...] = table[...].at[0].add(jax.random.normal(jax.random.key(1), (16,)))  # not a constant: LN
        changed = float(jnp.max(jnp.abs(model(pixels) - before))) > 1e-4
        assert changed == depends, quirk


def test_first_token_pooling_adds_no_cls_and_deeper_heads_halve():
    cfg = models.model_config(
        mixer="softmax", d_model=16, num_heads=2, mlp_dim=32, max_length=8, pooling="first", dropout=0.0
    )
    cfg.head_layers = 2
    model = models.SequenceClassifier(cfg, vocab_size=20, num_classes=2, rngs=nnx.Rngs(0))
    assert model.encoder.cls is None
    assert model.head.hidden.kernel.shape == (16, 32) and model.head.deeper[0].kernel.shape == (32, 16)
    assert model.head.logits.kernel.shape == (16, 2)
    tokens = jax.random.randint(jax.random.key(0), (2, 8), 1, 20)
    chex.assert_shape(model(tokens), (2, 2))
    one = models.SequenceClassifier(models.model_config(d_model=16, num_heads=2, mlp_dim=32, max_length=8),
                                    vocab_size=20, num_classes=2, rngs=nnx.Rngs(0))  # fmt: skip
    assert one.head.deeper is None  # a one-layer head keeps the parameter layout of older checkpoints


def test_the_layers_refuse_a_value_outside_their_choices_by_name():
    """zoo.layers built from Python, with no config validation in front: a typo is refused, not taken for the
    last branch of a dispatch."""
    from zoo.layers.embeddings import add_positions
    from zoo.layers.heads import ClassificationHead, pool

    x, mask = jnp.ones((1, 3, D)), jnp.ones((1, 3), bool)
    with pytest.raises(ValueError, match="unknown pooling 'max'; valid: cls, first, mean"):
        pool(x, mask, "max")
    with pytest.raises(ValueError, match="unknown positional encoding 'rope'"):
        add_positions(x, "rope")
    with pytest.raises(ValueError, match="a head of 0 hidden layers"):
        ClassificationHead(D, 8, 2, dtype=jnp.float32, rngs=nnx.Rngs(0), layers=0)


@pytest.mark.parametrize("cls", ["SequenceClassifier", "TextClassifier", "CausalLM", "EncoderDecoder", "Encoder"])
def test_a_model_built_from_python_checks_its_config_once_at_its_entry(cls, monkeypatch):
    """Once for the model: its stacks, their blocks and the blocks' mixers.build are told `checked=True`."""
    import zoo.models.config as config
    from zoo import config_fields
    from zoo.mixers.registry import SHARED_RULES

    checked = []
    counted = lambda cfg, fields, prefix: checked.append(prefix) or problems(cfg, fields, prefix)
    problems = config.field_problems
    monkeypatch.setattr(config, "field_problems", counted)
    shared = []  # mixers.build's check of the fields every mixer shares
    rule_problems = config_fields.rule_problems
    monkeypatch.setattr(config_fields, "rule_problems", lambda c, rules, p: shared.append(rules is SHARED_RULES)
                        or rule_problems(c, rules, p))  # fmt: skip
    sizes = {"EncoderDecoder": dict(src_vocab=5, tgt_vocab=5), "CausalLM": dict(vocab_size=5), "Encoder": {}}
    cfg = models.model_config(num_layers=3, d_model=8, num_heads=2, mlp_dim=8, max_length=8)
    getattr(models, cls)(cfg, **sizes.get(cls, dict(vocab_size=5, num_classes=2)), rngs=nnx.Rngs(0))
    assert checked.count("model") == 1, checked
    assert checked.count("model.mixer_options.linear") == 1  # every mixer's options, the inactive ones' too
    assert not any(shared)
    mixer = mixers.default_config("relu")
    mixer.update(d_model=8, num_heads=2)
    mixers.build(mixer, rngs=nnx.Rngs(0))  # built from Python, a mixer checks them itself, once
    assert sum(shared) == 1


@pytest.mark.parametrize(
    ("size", "refused"), [(np.int64(5), False), (jnp.int32(5), False), (True, True), (5.0, True), (0, True)]
)
def test_a_model_s_size_is_any_integer_at_least_1(size, refused):
    """A data set's count (numpy, or a concrete jax scalar) is an integer; a bool, a float or 0 is not."""
    cfg = models.model_config(num_layers=1, d_model=8, num_heads=2, mlp_dim=8, max_length=8)
    build = lambda: models.SequenceClassifier(cfg, vocab_size=size, num_classes=2, rngs=nnx.Rngs(0))
    if refused:
        with pytest.raises(ValueError, match=r"^SequenceClassifier: vocab_size=.* must be an integer ≥ 1$"):
            build()
    else:
        build()
