"""Masked-LM encoders: position parameters per preset, tied head, padding invariance, relative bias, Toeplitz score."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy.linalg import toeplitz

from mlm_flax.configs import pretrain
from zoo import mixers
from zoo.mixers.sgu import toeplitz_score
from zoo.mixers.softmax import relative_position_buckets
from zoo.models import MaskedLM, TextClassifier, model_config


def _param_paths(model):
    return ["/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))]


@pytest.mark.parametrize("size", pretrain.SIZES)
@pytest.mark.parametrize("arch", pretrain.ENCODERS)
def test_position_parameters_per_preset(arch, size):
    cfg = pretrain.encoder_config(arch, size)
    cfg.num_layers = min(cfg.num_layers, 2)  # every layer is built alike: two show what the preset's stack holds
    model = nnx.eval_shape(lambda: MaskedLM(cfg, vocab_size=100, rngs=nnx.Rngs(0)))
    paths = _param_paths(model)
    has_positions = any("positions" in p for p in paths)
    if arch in ("gmlp", "amlp"):
        assert not has_positions and not any("relative_bias" in p for p in paths)
        assert not any("ffn" in p for p in paths)
    else:
        assert has_positions
        assert any("relative_bias" in p for p in paths) == (arch == "bert_relpos")


def test_demo_presets_have_matched_sizes():
    counts = {}
    for arch in ("gmlp", "amlp", "bert"):
        model = nnx.eval_shape(
            lambda a=arch: MaskedLM(pretrain.encoder_config(a, "demo"), vocab_size=4000, rngs=nnx.Rngs(0))
        )
        counts[arch] = sum(x.size for x in jax.tree.leaves(nnx.state(model.backbone.encoder, nnx.Param)))
    assert max(counts.values()) / min(counts.values()) < 1.15, counts


def _model(mixer, **kw):
    options = dict(ffn="none", positional="none") if mixer in ("gmlp", "amlp") else dict(positional="learned")
    cfg = model_config(mixer=mixer, d_model=32, num_heads=2, mlp_dim=64, max_length=16, num_layers=2, dropout=0.0)
    cfg.update({**options, **kw})
    return cfg


@pytest.mark.parametrize("mixer", ["gmlp", "amlp", "softmax"])
def test_padding_does_not_change_real_positions(mixer):
    model = MaskedLM(_model(mixer), vocab_size=50, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 10), 7, 50)
    padded = jnp.pad(tokens, ((0, 0), (0, 6)))
    chex.assert_trees_all_close(model(padded)[:, :10], model(tokens), atol=2e-5)


class LogitsAtPositionsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_positions_gather_the_full_logits(self):
        model = MaskedLM(_model("gmlp"), vocab_size=50, rngs=nnx.Rngs(0))
        tokens = jax.random.randint(jax.random.key(1), (2, 16), 7, 50)
        positions = jnp.array([[0, 3, 15], [2, 2, 9]])
        graphdef, state = nnx.split(model)
        full = self.variant(lambda s, t: nnx.merge(graphdef, s)(t))(state, tokens)
        picked = self.variant(lambda s, t, p: nnx.merge(graphdef, s)(t, positions=p))(state, tokens, positions)
        chex.assert_shape(picked, (2, 3, 50))
        chex.assert_trees_all_close(picked, jnp.take_along_axis(full, positions[..., None], axis=1), atol=1e-5)

    def test_positions_outside_the_sequence_are_refused(self):
        model = MaskedLM(_model("gmlp"), vocab_size=50, rngs=nnx.Rngs(0))
        tokens = jax.random.randint(jax.random.key(1), (2, 16), 7, 50)
        for bad in (jnp.array([[0, -1], [2, 3]]), jnp.array([[0, 16], [2, 3]])):
            with pytest.raises(ValueError, match=r"positions must be in \[0, 16\), got"):
                model(tokens, positions=bad)


def test_head_is_tied_to_the_input_embeddings():
    model = MaskedLM(_model("gmlp"), vocab_size=50, rngs=nnx.Rngs(0))
    assert not any("logits" in p or "output_embedding" in p for p in _param_paths(model))
    tokens = jnp.array([[8, 9, 10]])
    before = model(tokens)
    table = model.backbone.embed.embed.embedding
    table[...] = table[...].at[20].add(jax.random.normal(jax.random.key(2), (32,)))  # row 20: the logit of 20
    after = model(tokens)
    changed = np.flatnonzero(np.abs(np.asarray(after - before)).max(axis=(0, 1)) > 1e-6)
    np.testing.assert_array_equal(changed, [20])


def test_classifier_shares_the_backbone_structure():
    cfg = _model("gmlp")
    mlm = MaskedLM(cfg, vocab_size=50, rngs=nnx.Rngs(0))
    clf = TextClassifier(cfg, vocab_size=50, num_classes=3, rngs=nnx.Rngs(1))
    source = nnx.state(mlm.backbone, nnx.Param)
    nnx.update(clf.backbone, source)
    chex.assert_trees_all_equal(nnx.state(clf.backbone, nnx.Param), source)
    chex.assert_shape(clf(jnp.ones((4, 16), jnp.int32)), (4, 3))


def test_sequence_longer_than_the_spatial_size_is_a_clear_error():
    model = MaskedLM(_model("gmlp"), vocab_size=50, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="exceeds model.max_length=16"):
        model(jnp.ones((1, 17), jnp.int32))


def test_relative_position_buckets():
    b = relative_position_buckets(300, num_buckets=32, max_distance=128)
    assert (np.diag(b) == 0).all()
    # Depends only on j − i (Toeplitz), keys before and after the query use disjoint buckets.
    assert toeplitz_score(b.astype(float)) == pytest.approx(1.0)
    before, after = set(b[200, :200].tolist()), set(b[200, 201:].tolist())
    assert not before & after and max(before | after) == 31
    # Exact for small distances, monotone, capped at max_distance.
    assert list(b[100, 100:108]) == [0, 17, 18, 19, 20, 21, 22, 23]
    assert (np.diff(b[0, :]) >= 0).all() and b[0, 128] == b[0, 299] == 31
    causal = relative_position_buckets(50, num_buckets=32, max_distance=128, bidirectional=False)
    assert (causal[np.triu_indices(50)] == 0).all()


def test_relative_bias_starts_at_plain_softmax_and_learns_per_head_offsets():
    cfg = mixers.default_config("softmax").copy_and_resolve_references()
    cfg.update(d_model=32, num_heads=2, max_length=16)
    plain = mixers.build(cfg, rngs=nnx.Rngs(0))
    cfg.relative_buckets = 8
    biased = mixers.build(cfg, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (2, 16, 32))
    mask = jnp.arange(16)[None] < jnp.array([[16], [11]])
    chex.assert_trees_all_close(biased(x, mask=mask), plain(x, mask=mask), atol=1e-6)
    biased.relative_bias[...] = jax.random.normal(jax.random.key(1), (8, 2))
    assert not np.allclose(biased(x, mask=mask), plain(x, mask=mask), atol=1e-3)
    with pytest.raises(ValueError, match="self-attention only"):
        biased(x, context=x)


def test_toeplitz_score_is_one_for_toeplitz_and_low_for_noise():
    rng = np.random.default_rng(0)
    assert toeplitz_score(toeplitz(rng.normal(size=64), rng.normal(size=64))) == pytest.approx(1.0)
    assert toeplitz_score(np.eye(64) + 3.0) == pytest.approx(1.0)
    noise = toeplitz_score(rng.normal(size=(64, 64)))
    assert noise < 0.06  # about 2/n
    # In between: a Toeplitz matrix plus noise of equal energy scores about one half.
    t = toeplitz(rng.normal(size=64), rng.normal(size=64))
    mixed = t + rng.normal(size=(64, 64)) * np.sqrt((t**2).mean())
    assert 0.4 < toeplitz_score(mixed) < 0.6
    with pytest.raises(ValueError, match="square"):
        toeplitz_score(np.ones((3, 4)))
