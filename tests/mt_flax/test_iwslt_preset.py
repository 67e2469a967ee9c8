"""`iwslt_de_en` is fairseq's transformer_iwslt_de_en with its IWSLT'14 De-En recipe, field by field.

Reference: facebookresearch/fairseq at commit 3d262bb; paths under fairseq/ unless they start with examples/.
The fields that still differ are listed, with the reason, in docs/presets.md ("iwslt_de_en vs fairseq").
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mt_flax.configs import translation
from zoo import models
from zoo.models.decoding import _length_penalty


def test_architecture_fields_are_fairseqs():
    model = translation.get_config("iwslt_de_en").model
    # models/transformer/transformer_legacy.py:228-235 (transformer_iwslt_de_en): 512/1024/4 heads/6 layers
    assert (model.d_model, model.mlp_dim, model.num_heads, model.num_layers, model.num_decoder_layers) == (
        512, 1024, 4, 6, 0,
    )  # fmt: skip
    assert model.mixer == "softmax" and model.cross_mixer == "softmax"  # modules/multihead_attention.py
    assert model.norm == "post"  # transformer_legacy.py:175,185 normalize_before False; transformer_layer.py:207-221
    assert model.layer_norm_eps == 1e-5  # modules/layer_norm.py:28 (PyTorch's LayerNorm)
    # examples/translation/README.md:128 --dropout 0.3; transformer_legacy.py:187-188 attention/activation dropout 0
    assert (model.dropout, model.attention_dropout, model.ffn_dropout) == (0.3, 0.0, 0.0)
    assert model.ffn == "relu"  # transformer_legacy.py:189 activation_fn relu
    assert model.positional == "sinusoidal"  # transformer_legacy.py:176,186 (no learned positions)
    assert model.tie_embeddings == "decoder"  # README.md:125 --share-decoder-input-output-embed
    # models/transformer/transformer_base.py:189-192 N(0, d^-½) tables; transformer_encoder.py:65,125 × √d
    assert model.embed_scale == "sqrt_d"
    # modules/multihead_attention.py:169-182: q/k/v xavier_uniform gain 1/√2, out xavier, out bias 0
    assert (model.attention_init, model.attention_bias) == ("fairseq", True)
    assert model.ffn_init == "torch"  # modules/transformer_layer.py:70-78 nn.Linear


def test_recipe_and_generation_fields_are_fairseqs():
    config = translation.get_config("iwslt_de_en")
    train, decode = config.train, config.decode
    # examples/translation/README.md:126-130: adam (0.9, 0.98), clip-norm 0, lr 5e-4 inverse_sqrt warmup 4000,
    # weight decay 1e-4, label smoothing 0.1, max-tokens 4096; optim/adam.py:29-30 eps 1e-8 (decoupled decay)
    assert (train.b1, train.b2, train.eps, train.grad_clip_norm) == (0.9, 0.98, 1e-8, 0.0)
    assert train.schedule == "rsqrt" and train.warmup_steps == 4000
    assert train.learning_rate == pytest.approx(5e-4 * math.sqrt(4000))  # peaks at 5e-4 (tests/zoo/test_training)
    assert (train.weight_decay, train.weight_decay_mask, train.label_smoothing) == (1e-4, "all", 0.1)
    assert config.data.max_tokens == 4096 and train.batch_size == 0
    # fairseq-generate --beam 5 (README.md:143); dataclass/configs.py:823-834,867-868: max_len_a 0, b 200,
    # lenpen 1 (sequence_generator.py:675-676 divides by (step + 1) ** lenpen)
    assert (decode.beam_size, decode.length_penalty, decode.length_penalty_form) == (5, 1.0, "fairseq")
    assert (decode.max_length_a, decode.max_length_b) == (0.0, 200)


def test_fairseq_length_penalty_divides_by_the_length():
    lengths = jnp.array([1, 4, 9])
    np.testing.assert_allclose(_length_penalty(lengths, 1.0, "fairseq"), [1.0, 4.0, 9.0])
    np.testing.assert_allclose(_length_penalty(lengths, 0.5, "fairseq"), [1.0, 2.0, 3.0])
    np.testing.assert_allclose(_length_penalty(lengths, 1.0, "gnmt"), [1.0, 1.5, 14 / 6])
    with pytest.raises(ValueError, match="length_penalty_form='wu' is unknown"):
        _length_penalty(lengths, 1.0, "wu")


def test_sqrt_d_embeddings_are_fairseqs_parametrisation():
    """N(0, 1/d) table, inputs × √d, tied logits h·Eᵀ; the default keeps N(0, 1), inputs as is, logits ÷ √d. Both
    give unit-variance inputs; the logits of a given table differ by exactly the √d factor."""
    d, vocab = 64, 500
    fairseq = models.model_config(d_model=d, embed_scale="sqrt_d").embed_scale
    from zoo.layers import TokenEmbedding

    scaled = TokenEmbedding(vocab, d, dtype=jnp.float32, rngs=nnx.Rngs(0), scale=fairseq)
    plain = TokenEmbedding(vocab, d, dtype=jnp.float32, rngs=nnx.Rngs(0))
    table = scaled.embed.embedding[...]
    assert float(jnp.std(table)) == pytest.approx(d**-0.5, rel=0.05)
    tokens = jnp.arange(vocab)
    np.testing.assert_allclose(scaled(tokens), table * math.sqrt(d), rtol=1e-6)
    assert float(jnp.std(scaled(tokens))) == pytest.approx(1.0, rel=0.05)
    assert float(jnp.std(plain(tokens))) == pytest.approx(1.0, rel=0.05)
    h = jax.random.normal(jax.random.key(1), (3, d))
    np.testing.assert_allclose(scaled.attend(h), h @ table.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(plain.attend(h), h @ plain.embed.embedding[...].T / math.sqrt(d), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="model.embed_scale='x' is unknown"):
        TokenEmbedding(vocab, d, dtype=jnp.float32, rngs=nnx.Rngs(0), scale="x")


def test_fairseq_attention_initialisers():
    from zoo import mixers

    cfg = mixers.default_config("softmax")
    cfg.d_model, cfg.num_heads, cfg.attention_init = 256, 4, "fairseq"
    layer = mixers.build(cfg, rngs=nnx.Rngs(0))
    xavier = math.sqrt(6 / (256 + 256))
    for proj in (layer.query, layer.key, layer.value):  # gain 1/√2: bound xavier / √2
        kernel = proj.kernel[...]
        assert xavier / math.sqrt(2) * 0.95 < float(jnp.max(jnp.abs(kernel))) <= xavier / math.sqrt(2)
        bias = proj.bias[...]  # nn.Linear's default: U(±1/√d_in)
        assert 0.9 / 16 < float(jnp.max(jnp.abs(bias))) <= 1 / 16
    assert xavier * 0.95 < float(jnp.max(jnp.abs(layer.out.kernel[...]))) <= xavier
    assert float(jnp.max(jnp.abs(layer.out.bias[...]))) == 0.0
    cfg.attention_init = "he"
    with pytest.raises(ValueError, match="model.attention_init='he' must be one of xavier_uniform, fairseq"):
        mixers.build(cfg, rngs=nnx.Rngs(0))
