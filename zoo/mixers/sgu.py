"""gMLP's spatial gating unit and aMLP (docs/mixers.md) as token mixers.

    mixer(x) = (Z1 ⊙ (W · LN(Z2) + b [+ tiny_attn(x)])) V,   Z = GELU(x U),  Z1, Z2 = split(Z)

An encoder with `ffn="none"` and this mixer is exactly a gMLP stack. W is n×n (n = max_length), near zero with
b = 1 at init, so each block starts as an FFN. Padded rows of LN(Z2) are zeroed, so padding never reaches real
tokens. Causal: W lower-triangular. Toeplitz: W_ij = w_{i−j}. aMLP adds a one-head attention to the gate.

`sgu_variant` is the paper's Table 3 ablation of the gating function s(Z), f(Z) = W · LN(Z) + b:

    split_multiplicative   Z1 ⊙ f(Z2)     (the gMLP default; V maps d_ffn/2 → d)
    multiplicative         Z ⊙ f(Z)       (no split: V maps d_ffn → d)
    additive               Z + f(Z)
    linear                 f(Z)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from zoo.config_fields import BOOLEAN, Field, at_least, integer, one_of
from zoo.layers.common import compute_dtype, dense
from zoo.mixers.attention import append_kv, attention_core_flops, attention_pairs
from zoo.mixers.inputs import check_causal_flag, check_decode_input, check_mixer_input
from zoo.mixers.registry import register

SGU_VARIANTS = ("split_multiplicative", "multiplicative", "additive", "linear")


class TinyAttention(nnx.Module):
    """aMLP's `Dense(3·d_attn) → softmax(q kᵀ/√d_attn) v → Dense(d_out)`, one head."""

    def __init__(self, d_in: int, d_attn: int, d_out: int, *, qkv_bias: bool, dtype, rngs: nnx.Rngs):
        self.qkv = nnx.Linear(d_in, 3 * d_attn, use_bias=qkv_bias, dtype=dtype, rngs=rngs)
        self.out = nnx.Linear(d_attn, d_out, dtype=dtype, rngs=rngs)
        self.d_attn = d_attn

    def __call__(self, x, mask, causal):
        q, k, v = jnp.split(self.qkv(x)[:, :, None, :], 3, axis=-1)
        bias_mask = None if mask is None else mask[:, None, None, :]
        return self.out(jax.nn.dot_product_attention(q, k, v, mask=bias_mask, is_causal=causal)[:, :, 0])

    def init_cache(self, batch, max_length, dtype):
        shape = (batch, max_length, 1, self.d_attn)
        return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}

    def decode(self, x, cache, i):
        q, k, v = jnp.split(self.qkv(x)[:, :, None, :], 3, axis=-1)
        keys, values, visible = append_kv(cache, k, v, i)
        y = jax.nn.dot_product_attention(q, keys, values, mask=visible[None, None, None, :])[:, :, 0]
        return self.out(y), {"k": keys, "v": values}


def _widths(cfg) -> tuple[int, int]:
    """(d_ffn, the width of the gate and of V's input)."""
    d_ffn = cfg.d_ffn or 6 * cfg.d_model
    return d_ffn, d_ffn // 2 if cfg.sgu_variant == "split_multiplicative" else d_ffn


class SpatialGatingMixer(nnx.Module):
    supports_causal = True
    supports_cross = False

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        d, n = cfg.d_model, cfg.max_length
        d_ffn, width = _widths(cfg)
        if d_ffn % 2:
            raise ValueError(f"mixer {cfg.name!r}: d_ffn={d_ffn} must be even (it is split in two)")
        self.name, self.max_length, self.toeplitz = cfg.name, n, cfg.toeplitz
        self.variant = cfg.sgu_variant
        self.dtype = dtype = compute_dtype(cfg.dtype)
        self.proj_in = dense(d, d_ffn, ("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.gate_norm = nnx.LayerNorm(width, epsilon=cfg.layer_norm_eps, dtype=dtype, rngs=rngs)
        self.gelu_approximate = cfg.gelu_approximate
        self.proj_out = dense(width, d, ("mlp", "embed"), dtype=dtype, rngs=rngs)
        # Near-zero W (U(±init_scale/n)) and b = 1: the gate starts at ≈ 1 and the block acts as an FFN.
        bound = cfg.spatial_init_scale / n
        shape = (2 * n - 1,) if cfg.toeplitz else (n, n)
        self.spatial = nnx.Param(jax.random.uniform(rngs.params(), shape, jnp.float32, -bound, bound))
        self.spatial_bias = nnx.Param(jnp.ones((n,), jnp.float32))
        self.tiny_attention = (
            TinyAttention(d, cfg.tiny_attention_dim, width, qkv_bias=cfg.tiny_attention_bias, dtype=dtype, rngs=rngs)
            if cfg.tiny_attention_dim
            else None
        )

    @staticmethod
    def forward_flops(cfg, length: int, *, causal: bool) -> float:
        """Channel projections, the spatial projection (lower triangle when causal) and aMLP's tiny attention."""
        t, d = length, cfg.d_model
        d_ffn, width = _widths(cfg)
        total = 2 * t * d * d_ffn + 2 * attention_pairs(t, causal) * width + 2 * t * width * d
        if cfg.tiny_attention_dim:
            a = cfg.tiny_attention_dim
            total += 2 * t * d * 3 * a + attention_core_flops(t, t, a, causal) + 2 * t * a * width
        return total

    def spatial_matrix(self, length: int, causal: bool) -> jax.Array:
        """W restricted to the first `length` positions, `[length, length]`, lower-triangular if causal."""
        if length > self.max_length:
            raise ValueError(
                f"mixer {self.name!r}: input length {length} exceeds the spatial size max_length={self.max_length} "
                "(W is max_length × max_length); raise model.max_length"
            )
        if self.toeplitz:
            offsets = jnp.arange(length)[:, None] - jnp.arange(length)[None, :] + self.max_length - 1
            w = self.spatial[...][offsets]
        else:
            w = self.spatial[...][:length, :length]
        return jnp.tril(w) if causal else w

    def _split_gate(self, x):
        """(what the gate multiplies or adds to, the normed input of f)."""
        z = jax.nn.gelu(self.proj_in(x), approximate=self.gelu_approximate)
        if self.variant == "split_multiplicative":
            z1, z2 = jnp.split(z, 2, axis=-1)
            return z1, self.gate_norm(z2)
        return z, self.gate_norm(z)

    def _gated(self, z1, gate):
        """s(Z) from Z (or Z1) and f(Z) (or f(Z2)), by `sgu_variant`."""
        if self.variant == "additive":
            return z1 + gate
        if self.variant == "linear":
            return gate
        return z1 * gate

    def __call__(self, x, *, mask=None, causal=False, context=None, context_mask=None, rngs=None):
        if context is not None:
            raise ValueError(f"mixer {self.name!r} mixes only within a sequence; it cannot be used as cross-attention")
        check_mixer_input(self.name, x, self.proj_in.in_features, mask)
        check_causal_flag(self.name, causal)
        length = x.shape[1]
        w = self.spatial_matrix(length, causal)
        z1, z2 = self._split_gate(x)
        if mask is not None:
            z2 = jnp.where(mask[..., None], z2, jnp.zeros((), z2.dtype))
        gate = jnp.einsum("ij,bjd->bid", w.astype(z2.dtype), z2) + self.spatial_bias[:length, None].astype(z2.dtype)
        if self.tiny_attention is not None:
            gate = gate + self.tiny_attention(x, mask, causal)
        return self.proj_out(self._gated(z1, gate))

    # -- incremental decoding: the normed gate inputs seen so far -----------------------------

    def init_cache(self, batch: int, max_length: int) -> dict:
        if max_length > self.max_length:
            raise ValueError(
                f"mixer {self.name!r}: cannot decode {max_length} tokens with max_length={self.max_length}"
            )
        d_half = self.proj_out.in_features
        cache = {"z2": jnp.zeros((batch, max_length, d_half), self.dtype), "index": jnp.zeros((), jnp.int32)}
        if self.tiny_attention is not None:
            cache["tiny"] = self.tiny_attention.init_cache(batch, max_length, self.dtype)
        return cache

    def decode(self, x, cache):
        check_decode_input(self.name, x, self.proj_in.in_features, cache, "z2", positions=True)
        i = cache["index"]
        buf_len = cache["z2"].shape[1]
        z1, z2 = self._split_gate(x)
        buf = jax.lax.dynamic_update_slice(cache["z2"], z2.astype(cache["z2"].dtype), (0, i, 0))
        row = jax.lax.dynamic_index_in_dim(self.spatial_matrix(buf_len, causal=True), i, axis=0)  # [1, buf_len]
        gate = jnp.einsum("qj,bjd->bqd", row.astype(buf.dtype), buf) + self.spatial_bias[i].astype(buf.dtype)
        new_cache = {"z2": buf, "index": i + 1}
        if self.tiny_attention is not None:
            attn, new_cache["tiny"] = self.tiny_attention.decode(x, cache["tiny"], i)
            gate = gate + attn
        return self.proj_out(self._gated(z1, gate)), new_cache


def _sgu_options(tiny_attention_dim: int) -> tuple[Field, ...]:
    return (
        Field("d_ffn", 0, integer(0, 2**18), "channel width before the split (0: 6 × d_model, the paper's base)"),
        Field("toeplitz", False, BOOLEAN, "spatial weights as a Toeplitz matrix (one weight per offset)"),
        Field("spatial_init_scale", 1e-3, at_least(0), "uniform ± scale of the spatial weights' initialisation"),
        Field("tiny_attention_dim", tiny_attention_dim, integer(0, 2**16), "aMLP's one-head attention width (0: gMLP)"),
        Field("tiny_attention_bias", False, BOOLEAN, "a bias on the tiny attention's qkv (none in g-mlp-pytorch)"),
        Field("sgu_variant", "split_multiplicative", one_of(*SGU_VARIANTS), "the gating (the paper's Table 3)"),
    )


register("gmlp", SpatialGatingMixer, _sgu_options(0))
register("amlp", SpatialGatingMixer, _sgu_options(64))


def toeplitz_score(w) -> float:
    """‖T‖² / ‖W‖² in [0, 1], T the nearest Toeplitz matrix (each diagonal's mean): 1 for a Toeplitz W, about
    2/n for i.i.d. zero-mean noise."""
    w = np.asarray(w, np.float64)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise ValueError(f"toeplitz_score needs a square matrix, got shape {w.shape}")
    n = w.shape[0]
    offsets = np.arange(n)[:, None] - np.arange(n)[None, :] + n - 1  # diagonal index in [0, 2n-2]
    sums = np.bincount(offsets.ravel(), weights=w.ravel(), minlength=2 * n - 1)
    counts = np.bincount(offsets.ravel(), minlength=2 * n - 1)
    t = (sums / counts)[offsets]
    total = float(np.sum(w * w))
    return float(np.sum(t * t) / total) if total > 0 else 1.0
