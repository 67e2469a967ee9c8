"""Conventions that differ between reference implementations are config fields, used everywhere.

Each is checked against an independent float64 formula, and the presets' choices are pinned to their
sources (docs/conventions.md).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lra_flax.configs import image, listops, text
from mlm_flax.configs import pretrain
from mt_flax.configs import translation
from zoo import mixers
from zoo.layers import FeedForward
from zoo.mixers.relu import RMSNormGate
from zoo.models import Encoder, SequenceEncoder, model_config
from zoo.models.masked_lm import TextEncoder


def _gelu64(x, approximate):
    x = np.asarray(x, np.float64)
    if approximate:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _layer_norms(module):
    return [m for _, m in nnx.iter_graph(module) if isinstance(m, nnx.LayerNorm)]


@pytest.mark.parametrize("mixer, ffn", [("softmax", "gelu"), ("gmlp", "none"), ("amlp", "none")])
@pytest.mark.parametrize("eps", [1e-5, 1e-12])
def test_every_layer_norm_takes_model_layer_norm_eps(mixer, ffn, eps):
    cfg = model_config(mixer=mixer, ffn=ffn, d_model=16, num_heads=2, mlp_dim=32, max_length=8, layer_norm_eps=eps)
    cfg.mixer_options[mixer].update({"d_ffn": 32} if mixer in ("gmlp", "amlp") else {})
    if mixer == "amlp":
        cfg.mixer_options.amlp.tiny_attention_dim = 8
    encoder = Encoder(cfg, rngs=nnx.Rngs(0))
    norms = _layer_norms(encoder)
    assert len(norms) >= 3  # block norms, the SGU's gate norm or the FFN's, the final norm
    assert {n.epsilon for n in norms} == {eps}
    # And it is the ε in the arithmetic: a near-constant row normalises to (x − μ)/√(σ² + ε).
    x = jnp.array([[-5e-4, 5e-4] * 8])  # σ² = 2.5e-7: ε 1e-5 and 1e-12 give very different outputs
    mu, var = np.mean(np.asarray(x, np.float64)), np.var(np.asarray(x, np.float64))
    expected = (np.asarray(x, np.float64) - mu) / np.sqrt(var + eps)
    np.testing.assert_allclose(norms[-1](x), expected, rtol=2e-3, atol=1e-4)


@pytest.mark.parametrize("approximate", [True, False])
def test_gelu_form_in_the_ffn_the_sgu_and_the_mlm_head(approximate):
    x = jnp.linspace(-4.0, 4.0, 64).reshape(1, 4, 16)
    ffn = FeedForward(
        16, 16, kind="gelu", dropout=0.0, gelu_approximate=approximate, dtype=jnp.float32, rngs=nnx.Rngs(0)
    )
    ffn.wi.kernel[...] = jnp.eye(16)
    ffn.wi.bias[...] = jnp.zeros(16)
    ffn.wo.kernel[...] = jnp.eye(16)
    ffn.wo.bias[...] = jnp.zeros(16)
    np.testing.assert_allclose(ffn(x), _gelu64(x, approximate), atol=1e-6)
    # The two forms differ by up to ~5e-4 on this range: the test can tell them apart.
    np.testing.assert_raises(AssertionError, np.testing.assert_allclose, ffn(x), _gelu64(x, not approximate), 0, 1e-4)

    cfg = mixers.default_config("gmlp")
    cfg.update(d_model=16, max_length=4, d_ffn=32, gelu_approximate=approximate)
    sgu = mixers.build(cfg, rngs=nnx.Rngs(0))
    z1, _ = sgu._split_gate(x)
    pre = np.asarray(sgu.proj_in(x), np.float64)[..., :16]
    np.testing.assert_allclose(z1, _gelu64(pre, approximate), atol=1e-5)


def test_amlp_tiny_attention_qkv_bias_is_a_choice():
    def tiny(bias):
        cfg = mixers.default_config("amlp")
        cfg.update(d_model=16, max_length=4, d_ffn=32, tiny_attention_dim=8, tiny_attention_bias=bias)
        return mixers.build(cfg, rngs=nnx.Rngs(0)).tiny_attention.qkv

    assert tiny(False).bias is None  # g-mlp-pytorch: to_qkv = nn.Linear(dim_in, 3·dim_inner, bias=False)
    assert tiny(True).bias is not None
    assert mixers.default_config("amlp").tiny_attention_bias is False


@pytest.mark.parametrize("eps", [1e-8, 1e-6])
def test_rela_rms_norm_eps(eps):
    # Small activations (|o| ~ 1e-4) are where 1e-6 and 1e-8 differ: mean(o²) ~ 1e-8.
    o = jax.random.normal(jax.random.key(0), (2, 3, 8)) * 1e-4
    gate = RMSNormGate(8, eps=eps, dtype=jnp.float32)
    o64 = np.asarray(o, np.float64)
    expected = o64 / np.sqrt(np.mean(o64**2, -1, keepdims=True) + eps) / (1 + np.exp(-o64))
    np.testing.assert_allclose(gate(o), expected, rtol=1e-4)
    assert mixers.default_config("rela").rms_norm_eps == 1e-8  # the ReLA reference code's


def test_presets_follow_their_sources():
    for module, preset in ((listops, "lra_code"), (text, "lra_code")):  # the LRA code: flax defaults
        m = module.get_config(preset).model
        assert (m.layer_norm_eps, m.gelu_approximate) == (1e-6, True)
    for size in pretrain.SIZES:
        bert = pretrain.get_config(f"bert_{size}").model
        assert (bert.layer_norm_eps, bert.gelu_approximate) == (1e-12, True)  # BERT's TF code
        assert bert.position_init_stddev == 1.0  # BERT: positions drawn like the (N(0, 1) here) tokens
        for arch in ("gmlp", "amlp"):
            m = pretrain.get_config(f"{arch}_{size}").model
            assert (m.layer_norm_eps, m.gelu_approximate) == (1e-5, False)  # g-mlp-pytorch
    assert translation.get_config("iwslt_de_en").model.layer_norm_eps == 1e-5  # fairseq


@pytest.mark.parametrize("stddev", [0.02, 1.0])
@pytest.mark.parametrize("encoder", [SequenceEncoder, TextEncoder])
def test_learned_positions_are_drawn_at_model_position_init_stddev(encoder, stddev):
    cfg = model_config(mixer="softmax", d_model=64, num_heads=2, mlp_dim=32, max_length=256, positional="learned")
    cfg.position_init_stddev = stddev
    model = encoder(cfg, vocab_size=50, rngs=nnx.Rngs(0))
    table = np.asarray(model.positions.table[...], np.float64)
    tokens = np.asarray(model.embed.embed.embedding[...], np.float64)
    assert abs(table.std() / stddev - 1) < 0.03  # 16k draws: the sample std is within 1% of σ
    assert abs(tokens.std() - 1) < 0.05  # the token table the scale is relative to


def test_lra_learned_positions_keep_the_lra_codes_scale():
    # The LRA code: AddPositionEmbs N(0, 0.02²) beside Embed N(0, 1).
    assert image.get_config("lra_code").model.position_init_stddev == 0.02
    assert model_config().position_init_stddev == 0.02
