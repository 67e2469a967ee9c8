"""Incremental decoding equals the full causal forward, token by token, for every causal mixer."""

import chex
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from tests.zoo.decoding_check import assert_encoder_decoder_decodes_like_its_full_forward
from zoo import mixers, models
from zoo.mixers.attention import MultiHeadMixer

T, V = 9, 13
# Every mixer family, plus the feature maps whose decode state differs (random features, gates).
CASES = [(name, {}) for name in mixers.names()] + [
    ("linear", {"feature_map": "favor", "num_features": 16}),
    ("linear", {"feature_map": "aoglu", "kernel_depth": 2}),
    ("gmlp", {"toeplitz": True}),
]


def _cfg(mixer, options, **extra):
    fields = dict(mixer=mixer, num_layers=2, d_model=32, num_heads=4, mlp_dim=32, max_length=T, dropout=0.0)
    cfg = models.model_config(**{**fields, **extra})
    cfg.mixer_options[mixer].update(options)
    if mixer in ("gmlp", "amlp"):
        cfg.mixer_options[mixer].d_ffn = 32
    return cfg


def _tokens(batch=2, seed=0):
    return jax.random.randint(jax.random.key(seed), (batch, T), 1, V)


@pytest.mark.parametrize("mixer, options", CASES, ids=[f"{m}-{'-'.join(map(str, o.values()))}" for m, o in CASES])
def test_causal_lm_decode_equals_full_forward(mixer, options):
    model = models.CausalLM(_cfg(mixer, options), vocab_size=V, rngs=nnx.Rngs(0))
    model.eval()
    tokens = _tokens()

    @jax.jit
    def full_and_stepwise(tokens):
        def step(cache, token):
            logits, cache = model.decode(token[:, None], cache)
            return cache, logits[:, 0]

        _, logits = jax.lax.scan(step, model.init_cache(tokens.shape[0]), tokens.T)
        return model(tokens), logits.transpose(1, 0, 2)

    full, stepwise = full_and_stepwise(tokens)
    chex.assert_trees_all_close(stepwise, full, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize(
    "mixer, norm",
    [("softmax", "pre"), ("relu", "pre"), ("linear", "pre"), ("gmlp", "pre"), ("softmax", "post"), ("relu", "post")],
)
def test_encoder_decoder_decode_equals_full_forward(mixer, norm):
    """Post-LN (fairseq's layout) too: the step-by-step decoder normalises after each residual as the full forward."""
    cfg = _cfg(mixer, {}, cross_mixer="relu", norm=norm)
    model = models.EncoderDecoder(cfg, src_vocab=V, tgt_vocab=V, rngs=nnx.Rngs(0))
    model.eval()
    src = _tokens(seed=1).at[1, 6:].set(0)  # padded source
    tgt = _tokens(seed=2)
    assert_encoder_decoder_decodes_like_its_full_forward(model, src, tgt)


def test_linear_decode_state_does_not_grow_with_length():
    def cache_bytes(max_length):
        model = models.CausalLM(_cfg("linear", {}, max_length=max_length), vocab_size=V, rngs=nnx.Rngs(0))
        return sum(x.nbytes for x in jax.tree.leaves(model.init_cache(1, max_length)))

    softmax_bytes = lambda n: sum(
        x.nbytes
        for x in jax.tree.leaves(
            models.CausalLM(_cfg("softmax", {}, max_length=n), vocab_size=V, rngs=nnx.Rngs(0)).init_cache(1, n)
        )
    )
    assert cache_bytes(64) == cache_bytes(4096)
    assert softmax_bytes(4096) > 32 * softmax_bytes(64)


def test_relu_decode_uses_the_same_row_counts_as_training():
    # n_i = i + 1 in both: a single-layer check that step i's output matches the causal row i exactly.
    cfg = mixers.default_config("relu")
    cfg.d_model, cfg.num_heads = 16, 2
    layer = mixers.build(cfg, rngs=nnx.Rngs(0))
    layer.eval()
    x = jax.random.normal(jax.random.key(0), (1, 6, 16))
    full = layer(x, causal=True)
    cache = layer.init_cache(1, 6)
    for i in range(6):
        y, cache = layer.decode(x[:, i : i + 1], cache)
        chex.assert_trees_all_close(y[:, 0], full[:, i], atol=1e-5)


class _NoCausal(MultiHeadMixer):
    supports_causal = False

    def attend(self, q, k, v, mask, causal):
        return v


def test_mixer_without_causal_form_says_so():
    cfg = mixers.default_config("softmax")
    cfg.d_model, cfg.num_heads = 16, 2
    layer = _NoCausal(cfg, rngs=nnx.Rngs(0))
    x = jnp.ones((1, 4, 16))
    layer(x)  # the bidirectional form works
    with pytest.raises(ValueError, match="mixer 'softmax' has no causal form"):
        layer(x, causal=True)
    with pytest.raises(ValueError, match="has no causal form, so it cannot decode incrementally"):
        layer.decode(x[:, :1], layer.init_cache(1, 4))


def test_cross_attention_is_not_causal():
    cfg = mixers.default_config("softmax")
    cfg.d_model, cfg.num_heads = 16, 2
    layer = mixers.build(cfg, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="cross-attention cannot be causal"):
        layer(jnp.ones((1, 3, 16)), causal=True, context=jnp.ones((1, 5, 16)))


def test_generative_models_refuse_inputs_longer_than_max_length():
    """Their caches and positions are sized for model.max_length, as the classifiers' are."""
    longer = jax.random.randint(jax.random.key(0), (2, T + 1), 1, V)
    lm = models.CausalLM(_cfg("softmax", {}), vocab_size=V, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=rf"input length {T + 1} exceeds model.max_length={T}"):
        lm(longer)
    seq2seq = models.EncoderDecoder(_cfg("softmax", {}), src_vocab=V, tgt_vocab=V, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=rf"source length {T + 1} exceeds"):
        seq2seq(longer, _tokens())
    with pytest.raises(ValueError, match=rf"target length {T + 1} exceeds"):
        seq2seq(_tokens(), longer)


@pytest.mark.parametrize("name", ["softmax", "relu", "linear", "gmlp"])
def test_a_decoding_step_is_checked_against_its_cache(name):
    """One token of the cache's batch, inside the cache: a wrong call is named, never clamped or broadcast."""
    cfg = mixers.default_config(name)
    cfg.update(d_model=16, num_heads=2, max_length=4)
    if name == "gmlp":
        cfg.d_ffn = 32
    layer = mixers.build(cfg, rngs=nnx.Rngs(0))
    layer.eval()
    x = jax.random.normal(jax.random.key(0), (2, 5, 16))
    cache = layer.init_cache(2, 4)
    with pytest.raises(ValueError, match=r"a decoding step takes x \[batch=2, 1, d_model\] .*got shape \(2, 2, 16\)"):
        layer.decode(x[:, :2], cache)
    with pytest.raises(ValueError, match=r"got shape \(1, 1, 16\)"):
        layer.decode(x[:1, :1], cache)
    with pytest.raises(ValueError, match="cache must be the dict init_cache returns, got NoneType"):
        layer.decode(x[:, :1], None)
    for i in range(4):
        _, cache = layer.decode(x[:, i : i + 1], cache)
    if name == "linear":  # a running state: any number of steps
        layer.decode(x[:, 4:5], cache)
    else:
        with pytest.raises(ValueError, match=r"position 4 is past the cache's 4 \(init_cache's max_length\)"):
            layer.decode(x[:, 4:5], cache)


@pytest.mark.parametrize("name", ["sparsemax", "gmlp", "softmax"])
def test_causal_must_be_a_bool_in_every_mixer(name):
    cfg = mixers.default_config(name)
    cfg.update(d_model=16, num_heads=2, max_length=4)
    layer = mixers.build(cfg, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=rf"mixer '{name}': causal must be a bool, got 'yes'"):
        layer(jnp.ones((1, 4, 16)), causal="yes")


def test_token_ids_and_decoding_steps_are_checked_by_the_models():
    lm = models.CausalLM(_cfg("softmax", {}), vocab_size=V, rngs=nnx.Rngs(0))
    tokens = _tokens()
    for bad, shown in [(tokens.at[0, 0].set(-1), r"-1 … \d+"), (tokens.at[1, 2].set(V), rf"\d+ … {V}")]:
        with pytest.raises(ValueError, match=rf"token ids must be in \[0, {V}\), got {shown}"):
            lm(bad)  # a gather would wrap -1 to the last row and give NaN past the table
    with pytest.raises(ValueError, match="token ids must be integers, got dtype float32"):
        lm(tokens.astype(jnp.float32))
    with pytest.raises(ValueError, match=r"a decoding step takes token \[batch, 1\], got shape \(2,\)"):
        lm.decode(tokens[:, 0], lm.init_cache(2))
    jax.jit(lambda t: lm(t))(tokens.at[0, 0].set(-1))  # traced ids cannot be checked: the model runs
