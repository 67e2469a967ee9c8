"""Shared multi-head plumbing for attention-type mixers: projections, cross-attention, a key-value cache.

Subclasses implement `attend(q, k, v, mask, causal)` on `[batch, length, heads, head_dim]` and may override
`combine` (on the merged heads, before the output projection). Decoding through the key-value cache works for any
`attend` that honours a key mask: position i sees slots 0..i (which also gives ReLU attention its n_i = i + 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from zoo.layers.common import compute_dtype, dense
from zoo.layers.dropout import Dropout
from zoo.mixers.inputs import check_causal_flag, check_decode_input, check_mixer_input

ATTENTION_INITS = ("xavier_uniform", "fairseq")


def attention_initializers(kind: str, d_model: int) -> tuple:
    """(kernel, bias) initialisers of the q/k/v projections by model.attention_init (out: xavier, zero bias)."""
    if kind == "xavier_uniform":
        return nnx.initializers.xavier_uniform(), None
    if kind == "fairseq":  # fairseq/modules/multihead_attention.py reset_parameters, nn.Linear's default bias
        from zoo.layers.ffn import initializers

        return nnx.initializers.variance_scaling(0.5, "fan_avg", "uniform"), initializers("torch", d_model)[1]
    raise ValueError(f"config field model.attention_init={kind!r} is unknown; valid: {', '.join(ATTENTION_INITS)}")


def append_kv(cache: dict, k: jax.Array, v: jax.Array, i: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(keys, values, visible `[length]`): `cache`'s "k", "v" `[batch, length, heads, head_dim]` with position i's
    k, v written in, and the slots it may see."""
    keys = jax.lax.dynamic_update_slice(cache["k"], k.astype(cache["k"].dtype), (0, i, 0, 0))
    values = jax.lax.dynamic_update_slice(cache["v"], v.astype(cache["v"].dtype), (0, i, 0, 0))
    return keys, values, jnp.arange(keys.shape[1]) <= i


def attention_pairs(length: int, causal: bool) -> float:
    """(query, key) pairs a mixer computes: the lower triangle T(T+1)/2 when causal, not the masked square."""
    return length * (length + 1) / 2 if causal else float(length) * length


def attention_core_flops(t_q: int, t_k: int, d_qkv: int, causal: bool) -> float:
    """Forward FLOPs of one attention's scores and weighted values, all heads (4 per pair and q/k/v channel)."""
    pairs = attention_pairs(t_q, True) if causal and t_q == t_k else float(t_q) * t_k
    return 4 * pairs * d_qkv


class MultiHeadMixer(nnx.Module):
    supports_causal = True
    # Whether `attend` forms the attention probabilities and applies `weights_dropout` to them (it then takes
    # an `rngs` argument); model.attention_dropout does not apply to mixers that do not.
    has_attention_weights = False

    def __init__(self, cfg: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
        d, h = cfg.d_model, cfg.num_heads
        width = cfg.qkv_dim or d
        if width % h:
            what = f"qkv_dim={width}" if cfg.qkv_dim else f"d_model={d}"  # model.qkv_dim 0: as wide as d_model
            raise ValueError(f"mixer {cfg.name!r}: {what} is not divisible by num_heads={h}")
        self.name = cfg.name
        self.d_model, self.num_heads, self.head_dim = d, h, width // h
        self.dtype = compute_dtype(cfg.dtype)
        bias, (qkv_init, qkv_bias_init) = cfg.attention_bias, attention_initializers(cfg.attention_init, d)
        # Heads are split over the `tensor` mesh axis: q/k/v shard their outputs, `out` its inputs.
        self.query, self.key, self.value = (
            dense(
                d,
                width,
                ("embed", "heads"),
                init=qkv_init,
                bias_init=qkv_bias_init,
                use_bias=bias,
                dtype=self.dtype,
                rngs=rngs,
            )
            for _ in range(3)
        )
        out_init = nnx.initializers.xavier_uniform()
        self.out = dense(width, d, ("heads", "embed"), init=out_init, use_bias=bias, dtype=self.dtype, rngs=rngs)
        self.weights_dropout = Dropout(cfg.attention_dropout, rngs=rngs)

    @staticmethod
    def projection_flops(cfg: ml_collections.ConfigDict, length: int) -> float:
        """The q/k/v and out projections over one sequence, which every attention-type mixer does."""
        return 8 * length * cfg.d_model * (cfg.qkv_dim or cfg.d_model)

    @staticmethod
    def forward_flops(cfg: ml_collections.ConfigDict, length: int, *, causal: bool) -> float:
        """Model FLOPs of one forward pass over one sequence (zoo/training/flops.py): projections and core."""
        core = attention_core_flops(length, length, cfg.qkv_dim or cfg.d_model, causal)
        return MultiHeadMixer.projection_flops(cfg, length) + core

    def attend(self, q, k, v, mask, causal):
        raise NotImplementedError

    def attend_densely(self, q, k, v, mask, causal, weights, rngs, bias=None):
        """Attention through explicit float32 probabilities `weights(scores, visible)` `[b, h, q, k]`, dropped by
        model.attention_dropout (per element, rescaled by 1/(1 − rate), as flax's attention_dropout_rate)."""
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / np.sqrt(q.shape[-1])
        if bias is not None:
            s = s + bias.astype(jnp.float32)
        visible = jnp.ones((1, 1, 1, k.shape[1]), bool) if mask is None else mask[:, None, None, :]
        if causal:
            visible = visible & jnp.tril(jnp.ones((q.shape[1], k.shape[1]), bool))[None, None]
        p = self.weights_dropout(weights(s, visible), rngs=rngs)
        return jnp.einsum("bhqk,bkhd->bqhd", p.astype(v.dtype), v)

    def combine(self, o: jax.Array) -> jax.Array:
        """Merged heads `[batch, length, d_model]` → the output projection's input."""
        return o

    def _split(self, y):
        return y.reshape(*y.shape[:2], self.num_heads, self.head_dim)

    def __call__(
        self,
        x: jax.Array,
        *,
        mask: jax.Array | None = None,
        causal: bool = False,
        context: jax.Array | None = None,
        context_mask: jax.Array | None = None,
        context_kv: dict | None = None,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        """Self-attention over x, or cross-attention from x to `context` when given; `context_kv` (from
        `project_context`) replaces `context` by its projected keys and values. `rngs`: attention dropout."""
        check_causal_flag(self.name, causal)
        if causal and not self.supports_causal:
            raise ValueError(f"mixer {self.name!r} has no causal form")
        if context is not None and causal:
            raise ValueError(f"mixer {self.name!r}: cross-attention cannot be causal")
        check_mixer_input(self.name, x, self.d_model, mask if context is None and context_kv is None else None)
        if context is not None:
            check_mixer_input(self.name, context, self.d_model, context_mask, what="context")
        q = self._split(self.query(x))
        if context_kv is not None:
            k, v, source_mask = context_kv["k"], context_kv["v"], context_mask
        else:
            source, source_mask = (x, mask) if context is None else (context, context_mask)
            k, v = self._split(self.key(source)), self._split(self.value(source))
        extra = {"rngs": rngs} if self.has_attention_weights else {}
        o = self.attend(q, k, v, source_mask, causal, **extra)
        return self.out(self.combine(o.reshape(*x.shape[:2], -1)))

    # -- incremental decoding ------------------------------------------------------------------

    def project_context(self, context: jax.Array) -> dict:
        """Cross-attention keys and values of `context` `[batch, S, d_model]`, computed once per source."""
        return {"k": self._split(self.key(context)), "v": self._split(self.value(context))}

    def init_cache(self, batch: int, max_length: int) -> dict:
        shape = (batch, max_length, self.num_heads, self.head_dim)
        return {"k": jnp.zeros(shape, self.dtype), "v": jnp.zeros(shape, self.dtype), "index": jnp.zeros((), jnp.int32)}

    def decode(self, x: jax.Array, cache: dict) -> tuple[jax.Array, dict]:
        """One causal step: x `[batch, 1, d_model]` at position cache["index"] → (y `[batch, 1, d_model]`, cache)."""
        if not self.supports_causal:
            raise ValueError(f"mixer {self.name!r} has no causal form, so it cannot decode incrementally")
        check_decode_input(self.name, x, self.d_model, cache, "k", positions=True)
        i = cache["index"]
        q, k, v = (self._split(proj(x)) for proj in (self.query, self.key, self.value))
        keys, values, visible = append_kv(cache, k, v, i)
        o = self.attend(q, keys, values, jnp.broadcast_to(visible, keys.shape[:2]), False)
        y = self.out(self.combine(o.reshape(x.shape[0], 1, -1)))
        return y, {"k": keys, "v": values, "index": i + 1}
