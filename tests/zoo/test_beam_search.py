"""Greedy and beam search over incremental state: equal to full-forward decoding, beam 1 = greedy, limits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from zoo.models import EncoderDecoder, model_config
from zoo.models.decoding import beam_search, decode_limits, greedy_search, translate

BOS, EOS, VOCAB = 2, 3, 24
FAMILIES = ("softmax", "relu", "linear", "sparsemax", "gmlp")


SPECIALS = dict(bos_id=BOS, eos_id=EOS)
LIMIT_4 = dict(max_length_b=4, **SPECIALS)  # hypotheses of at most max_length_a · |src| + 4 tokens


def _model(mixer, seed=0):
    cfg = model_config(mixer=mixer, num_layers=2, d_model=32, num_heads=2, mlp_dim=64, max_length=24, dropout=0.0)
    model = EncoderDecoder(cfg, src_vocab=VOCAB, tgt_vocab=VOCAB, rngs=nnx.Rngs(seed))
    model.eval()
    return model


def _src():
    src = jax.random.randint(jax.random.key(1), (3, 9), 4, VOCAB)
    return src.at[0, 6:].set(0).at[2, 4:].set(0)


def _full_forward_greedy(model, src, max_length, limits):
    """Re-runs the whole causal decoder on the prefix at every step (no cache). The prefix is padded to a
    fixed length so one compiled forward serves every step: causality keeps the padding out of position t."""
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda state, src, prefix: nnx.merge(graphdef, state)(src, prefix))
    prefix = np.zeros((src.shape[0], max_length), np.int32)
    prefix[:, 0] = BOS
    done = np.zeros(src.shape[0], bool)
    out = np.zeros((src.shape[0], max_length), np.int32)
    for t in range(max_length):
        logits = np.array(forward(state, src, jnp.asarray(prefix))[:, t])
        logits[:, [0, BOS]] = -1e9
        logits[np.asarray(t + 1 >= limits)] = np.where(np.arange(VOCAB) == EOS, 0.0, -1e9)
        token = np.where(done, 0, logits.argmax(-1))
        out[:, t] = token
        done |= token == EOS
        if t + 1 < max_length:
            prefix[:, t + 1] = token
    return out


@pytest.mark.parametrize("mixer", FAMILIES)
def test_incremental_greedy_equals_full_forward(mixer):
    model, src = _model(mixer), _src()
    limits = decode_limits(src, max_length=16, max_length_a=1.0, max_length_b=4)
    fast = translate(model, src, beam_size=1, length_penalty=0.0, max_length=16, max_length_a=1.0, **LIMIT_4)
    np.testing.assert_array_equal(np.asarray(fast), _full_forward_greedy(model, src, 16, np.asarray(limits)))


@pytest.mark.parametrize("mixer", FAMILIES)
def test_beam_size_one_is_greedy(mixer):
    model, src = _model(mixer, seed=3), _src()
    kw = dict(max_length=16, max_length_a=1.0, **LIMIT_4)
    greedy = translate(model, src, beam_size=1, length_penalty=0.0, **kw)  # the greedy_search path
    beam = jax.jit(lambda s: beam_search(model, s, beam_size=1, length_penalty=0.0, **kw))(src)
    np.testing.assert_array_equal(np.asarray(beam), np.asarray(greedy))


def _logprob(model, src, tokens):
    """Sum of log p(token) of each hypothesis up to and including its EOS."""
    tgt_in = jnp.concatenate([jnp.full((src.shape[0], 1), BOS), tokens[:, :-1]], axis=1)
    logp = jax.nn.log_softmax(model(src, tgt_in), axis=-1)
    picked = jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]
    return jnp.sum(jnp.where(tokens != 0, picked, 0.0), axis=1)


def test_beam_hypotheses_end_within_limit_and_score_like_the_full_model():
    model, src = _model("relu", seed=5), _src()
    tokens = translate(
        model, src, beam_size=4, max_length=16, length_penalty=0.0, max_length_a=0.5, max_length_b=2, **SPECIALS
    )
    limits = np.asarray(decode_limits(src, max_length=16, max_length_a=0.5, max_length_b=2))
    tokens = np.asarray(tokens)
    for row, limit in zip(tokens, limits, strict=True):
        ends = np.flatnonzero(row == EOS)
        assert len(ends) >= 1 and ends[0] < limit  # ended with EOS no later than its own limit
        assert not row[ends[0] + 1 :].any()  # then padding only
        assert not np.isin(row[: ends[0]], [0, BOS, EOS]).any()
    # With alpha = 0 a wide beam never returns a hypothesis less likely than greedy's on this model.
    greedy = np.asarray(
        greedy_search(model, src, max_length=16, max_length_a=0.5, max_length_b=2, bos_id=BOS, eos_id=EOS)
    )
    beam_lp, greedy_lp = _logprob(model, src, jnp.asarray(tokens)), _logprob(model, src, jnp.asarray(greedy))
    assert np.all(np.asarray(beam_lp) >= np.asarray(greedy_lp) - 1e-4)
