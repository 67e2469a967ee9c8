"""Embedding tying in the generative models (fairseq's --share-decoder-input-output-embed and
--share-all-embeddings): the tied model is the untied one with its tables set equal, and a shared
table's gradient is the sum over its uses."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mt_flax.configs import translation
from tests.zoo.decoding_check import assert_encoder_decoder_decodes_like_its_full_forward
from zoo import models
from zoo.layers import add_positions

T, V, D = 7, 11, 16


def _cfg(tie):
    return models.model_config(
        mixer="softmax", num_layers=1, d_model=D, num_heads=2, mlp_dim=32, max_length=T, dropout=0.0, tie_embeddings=tie
    )


def _batch():
    src = jax.random.randint(jax.random.key(1), (2, T), 1, V).at[1, 5:].set(0)
    tgt = jax.random.randint(jax.random.key(2), (2, T), 1, V)
    return src, tgt


def _untied_copy(tied, tie):
    """An untied model whose tables are the tied model's: src (=tgt if 'all'), tgt, and output = tgtᵀ/√d."""
    untied = models.EncoderDecoder(_cfg("none"), src_vocab=V, tgt_vocab=V, rngs=nnx.Rngs(0))
    untied.encoder, untied.decoder = tied.encoder, tied.decoder  # the same blocks (shared references)
    table = tied.tgt_embed.embed.embedding[...]
    untied.tgt_embed.embed.embedding[...] = table
    untied.src_embed.embed.embedding[...] = table if tie == "all" else tied.src_embed.embed.embedding[...]
    untied.logits.kernel[...] = table.T / math.sqrt(D)
    untied.logits.bias[...] = jnp.zeros((V,))
    return untied


@pytest.mark.parametrize("tie", ["decoder", "all"])
def test_tied_model_is_the_untied_model_with_equal_tables(tie):
    tied = models.EncoderDecoder(_cfg(tie), src_vocab=V, tgt_vocab=V, rngs=nnx.Rngs(0))
    assert tied.logits is None
    assert (tied.src_embed is tied.tgt_embed) == (tie == "all")
    untied = _untied_copy(tied, tie)
    src, tgt = _batch()
    chex.assert_trees_all_close(tied(src, tgt), untied(src, tgt), atol=1e-5)

    # d loss / d table (tied) = Σ over its uses of the untied gradients (the output use through Eᵀ/√d).
    def loss(model):
        return jnp.sum(jnp.sin(model(src, tgt)))

    grad = nnx.jit(nnx.grad(loss))
    g_tied, g_untied = grad(tied), grad(untied)
    expected = g_untied.tgt_embed.embed.embedding[...] + g_untied.logits.kernel[...].T / math.sqrt(D)
    if tie == "all":
        expected = expected + g_untied.src_embed.embed.embedding[...]
    # A shared module appears once in the state, under its first path in NNX's (sorted) graph order.
    shared = g_tied.src_embed if tie == "all" else g_tied.tgt_embed
    chex.assert_trees_all_close(shared.embed.embedding[...], expected, atol=1e-5)


@pytest.mark.parametrize("tie", ["none", "decoder", "all"])
def test_parameter_counts_and_decoding_with_tied_tables(tie):
    model = models.EncoderDecoder(_cfg(tie), src_vocab=V, tgt_vocab=V, rngs=nnx.Rngs(0))
    count = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    untied = sum(x.size for x in jax.tree.leaves(nnx.state(_untied_copy(model, "decoder"), nnx.Param)))
    saved = {"none": 0, "decoder": V * D + V, "all": 2 * V * D + V}[tie]
    assert untied - count == saved
    model.eval()
    src, tgt = _batch()
    assert_encoder_decoder_decodes_like_its_full_forward(model, src, tgt)


def test_causal_lm_tying_and_errors():
    lm = models.CausalLM(_cfg("decoder"), vocab_size=V, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(0), (2, T), 1, V)
    hidden = lm.decoder(add_positions(lm.embed(tokens), lm.positional), mask=tokens != 0)
    table = np.asarray(lm.embed.embed.embedding[...], np.float64)
    np.testing.assert_allclose(lm(tokens), np.asarray(hidden, np.float64) @ table.T / math.sqrt(D), atol=1e-4)
    with pytest.raises(ValueError, match="needs one joint vocabulary; got 11 source and 12 target"):
        models.EncoderDecoder(_cfg("all"), src_vocab=V, tgt_vocab=V + 1, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="model.tie_embeddings='both' must be one of none, decoder, all"):
        models.CausalLM(_cfg("both"), vocab_size=V, rngs=nnx.Rngs(0))


def test_iwslt_preset_ties_like_the_fairseq_recipe():
    model = translation.get_config("iwslt_de_en").model
    assert model.tie_embeddings == "decoder" and model.layer_norm_eps == 1e-5
