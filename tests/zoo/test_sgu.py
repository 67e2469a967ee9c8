"""gMLP / aMLP spatial gating unit."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from zoo import mixers, models

D, N = 16, 10


def _sgu(name="gmlp", **options):
    cfg = mixers.default_config(name)
    cfg.d_model, cfg.num_heads, cfg.max_length = D, 2, N
    cfg.update({"d_ffn": 32, **options})
    return mixers.build(cfg, rngs=nnx.Rngs(0))


def _x(t=N, seed=0):
    return jax.random.normal(jax.random.key(seed), (2, t, D))


@pytest.mark.parametrize("toeplitz", [False, True])
def test_sgu_starts_as_an_ffn(toeplitz):
    layer = _sgu(toeplitz=toeplitz)
    x = _x()
    z1, _ = layer._split_gate(x)
    ffn = layer.proj_out(z1)  # the gate ≈ 1 at init: W near zero, b = 1
    chex.assert_trees_all_close(layer(x), ffn, atol=1e-3, rtol=1e-3)
    w = layer.spatial_matrix(N, causal=False)
    assert float(jnp.abs(w).max()) <= 1e-3 / N


def test_inputs_shorter_than_n_use_the_leading_block():
    layer = _sgu()
    y_short = layer(_x(t=6))
    chex.assert_shape(y_short, (2, 6, D))
    # Causal: a prefix of a longer input gives the same outputs as the prefix alone.
    x = _x()
    chex.assert_trees_all_close(layer(x, causal=True)[:, :6], layer(x[:, :6], causal=True), atol=1e-6)


def test_causal_sgu_keeps_a_zero_upper_triangle_during_training():
    layer = _sgu()
    init_spatial = layer.spatial[...]
    opt = nnx.Optimizer(layer, optax.adamw(1e-2, weight_decay=0.0), wrt=nnx.Param)

    def loss(layer, x):
        return jnp.mean(layer(x, causal=True) ** 2)

    grad = nnx.jit(nnx.grad(loss))
    for i in range(5):
        grads = grad(layer, _x(seed=i))
        upper = np.triu(np.asarray(grads.spatial[...]), k=1)
        assert np.all(upper == 0), "gradient reaches the future"
        opt.update(layer, grads)
    spatial = np.asarray(layer.spatial[...])
    np.testing.assert_array_equal(np.triu(spatial, 1), np.triu(np.asarray(init_spatial), 1))
    assert not np.allclose(np.tril(spatial), np.tril(np.asarray(init_spatial)))  # the lower part trained
    w = np.asarray(layer.spatial_matrix(N, causal=True))
    assert np.all(np.triu(w, 1) == 0)


def test_toeplitz_has_2n_minus_1_spatial_parameters():
    layer = _sgu(toeplitz=True)
    assert layer.spatial[...].shape == (2 * N - 1,)
    w = np.asarray(layer.spatial_matrix(N, causal=False))
    for i in range(N - 1):
        np.testing.assert_array_equal(np.diag(w, i)[1:], np.diag(w, i)[:-1])
        np.testing.assert_array_equal(np.diag(w, -i)[1:], np.diag(w, -i)[:-1])
    full = _sgu(toeplitz=False)
    count = lambda m: sum(x.size for x in jax.tree.leaves(nnx.state(m, nnx.Param)))
    assert count(full) - count(layer) == N * N - (2 * N - 1)


def test_input_longer_than_n_is_a_clear_error():
    with pytest.raises(ValueError, match=r"input length 11 exceeds the spatial size max_length=10"):
        _sgu()(_x(t=11))


def test_sgu_cannot_be_cross_attention():
    with pytest.raises(ValueError, match="mixes only within a sequence"):
        _sgu()(_x(), context=_x())
    cfg = models.model_config(d_model=D, num_heads=2, mlp_dim=16, max_length=N, cross_mixer="gmlp")
    with pytest.raises(ValueError, match=r"model.cross_mixer='gmlp' mixes only within a sequence"):
        models.EncoderDecoder(cfg, src_vocab=8, tgt_vocab=8, rngs=nnx.Rngs(0))


def test_amlp_adds_tiny_attention_to_the_gate():
    amlp, gmlp = _sgu("amlp"), _sgu("gmlp")
    assert amlp.tiny_attention is not None and gmlp.tiny_attention is None
    assert amlp.tiny_attention.qkv.kernel[...].shape == (D, 3 * 64)
    assert amlp.tiny_attention.out.kernel[...].shape == (64, 16)  # d_ffn / 2
    # Same seed: every other parameter is shared, so aMLP − gMLP = (Z1 ⊙ attn) V (the bias cancels).
    x, mask = _x(), jnp.arange(N)[None] < jnp.array([[N], [6]])
    z1, _ = amlp._split_gate(x)
    attn = amlp.tiny_attention(x, mask, False)
    expected = (z1 * attn) @ amlp.proj_out.kernel[...]
    chex.assert_trees_all_close(amlp(x, mask=mask) - gmlp(x, mask=mask), expected, atol=1e-5)
    assert float(jnp.abs(expected).max()) > 1e-3


def test_gmlp_encoder_has_no_position_parameters_and_no_ffn():
    cfg = models.model_config(
        mixer="gmlp", ffn="none", positional="none", d_model=D, num_heads=2, mlp_dim=16, max_length=N, dropout=0.0
    )
    enc = models.Encoder(cfg, rngs=nnx.Rngs(0))
    assert enc.blocks[0].ffn is None
    chex.assert_shape(enc(_x(), mask=None), (2, N, D))


@pytest.mark.parametrize("variant", ["split_multiplicative", "multiplicative", "additive", "linear"])
@pytest.mark.parametrize("name", ["gmlp", "amlp"])
def test_sgu_variants_compute_their_table_3_formula_and_decode_like_the_full_pass(variant, name):
    layer = _sgu(name, sgu_variant=variant, tiny_attention_dim=8 if name == "amlp" else 0)
    layer.spatial[...] = jax.random.normal(jax.random.key(3), layer.spatial.shape) / N  # a W that mixes
    x = _x()
    mask = jnp.arange(N)[None] < jnp.array([[N], [6]])
    # The formula, written out from the layer's own parameters.
    z = jax.nn.gelu(layer.proj_in(x), approximate=layer.gelu_approximate)
    z1, z2 = jnp.split(z, 2, axis=-1) if variant == "split_multiplicative" else (z, z)
    f = jnp.einsum("ij,bjd->bid", layer.spatial[...], jnp.where(mask[..., None], layer.gate_norm(z2), 0.0))
    f = f + layer.spatial_bias[...][:, None]
    if name == "amlp":
        f = f + layer.tiny_attention(x, mask, False)
    gating = {"split_multiplicative": jnp.multiply, "multiplicative": jnp.multiply, "additive": jnp.add}
    s = gating[variant](z1, f) if variant in gating else f
    chex.assert_trees_all_close(layer(x, mask=mask), layer.proj_out(s), atol=1e-5, rtol=1e-5)
    # V takes d_ffn / 2 features after a split, d_ffn otherwise.
    assert layer.proj_out.in_features == (16 if variant == "split_multiplicative" else 32)
    # Token-by-token decoding equals the causal full pass.
    full = layer(x, causal=True)
    cache, steps = layer.init_cache(2, N), []
    for i in range(N):
        y, cache = layer.decode(x[:, i : i + 1], cache)
        steps.append(y)
    chex.assert_trees_all_close(jnp.concatenate(steps, axis=1), full, atol=1e-5, rtol=1e-5)


def test_unknown_sgu_variant_is_named():
    with pytest.raises(ValueError, match="mixer_options.gmlp.sgu_variant='gated' must be one of split_multiplicative"):
        _sgu(sgu_variant="gated")
