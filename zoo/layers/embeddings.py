"""Token embeddings, fixed sinusoidal positions and learned absolute positions (BERT)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from kernels.checks import is_concrete
from zoo.layers.common import logical

POSITIONAL = ("sinusoidal", "learned", "none")


def sinusoidal_positions(length: int, d_model: int) -> jax.Array:
    """The Transformer's fixed sin/cos position table, `[length, d_model]` float32."""
    pos = np.arange(length)[:, None]
    div = np.exp(np.arange(0, d_model, 2) * (-np.log(10000.0) / d_model))
    table = np.zeros((length, d_model), np.float32)
    table[:, 0::2] = np.sin(pos * div)
    table[:, 1::2] = np.cos(pos * div)[:, : d_model // 2]
    return jnp.asarray(table)


def add_positions(x: jax.Array, kind: str, offset: int = 0) -> jax.Array:
    """Adds position encodings of `kind` to `[batch, length, d]` inputs starting at position `offset`."""
    if kind == "none":
        return x
    if kind == "learned":
        raise ValueError("learned positions are parameters: this model supports only 'sinusoidal' or 'none'")
    if kind == "sinusoidal":
        table = sinusoidal_positions(offset + x.shape[1], x.shape[-1])[offset:]
        return x + table[None].astype(x.dtype)
    raise ValueError(f"unknown positional encoding {kind!r}; valid: {', '.join(POSITIONAL)}")


EMBED_SCALES = ("none", "sqrt_d")


def check_indices(name: str, indices: jax.Array, size: int) -> None:
    """Integer indices into a table of `size` rows, in [0, size) where concrete: a gather wraps -1 to the last row
    and gives NaN past the table, never an error of its own."""
    if not jnp.issubdtype(indices.dtype, jnp.integer):
        raise ValueError(f"{name} must be integers, got dtype {indices.dtype}")
    if is_concrete(indices) and indices.size:
        values = np.asarray(indices)  # numpy: concrete indices may be met while a jit is traced
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= size:
            raise ValueError(f"{name} must be in [0, {size}), got {low} … {high}")


class TokenEmbedding(nnx.Module):
    """Token ids → vectors in the compute dtype (positions are added by the model, after any [CLS]).

    `scale` (model.embed_scale) — two parametrisations with unit-variance inputs and O(1) tied logits at init:
      "none"    an N(0, 1) table, used as it is; tied logits h · Eᵀ / √d (the LRA code's embedding).
      "sqrt_d"  an N(0, 1/d) table, inputs E[t] · √d; tied logits h · Eᵀ (fairseq, Vaswani et al.). Adam's
                steps are ~√d larger relative to this table, so the two train differently.
    """

    def __init__(self, vocab_size: int, d_model: int, *, dtype, rngs: nnx.Rngs, scale: str = "none"):
        if scale not in EMBED_SCALES:
            raise ValueError(f"config field model.embed_scale={scale!r} is unknown; valid: {', '.join(EMBED_SCALES)}")
        self.scale = scale
        stddev = 1.0 if scale == "none" else d_model**-0.5
        self.embed = nnx.Embed(
            vocab_size,
            d_model,
            dtype=dtype,
            # Vocabulary rows stay whole: a gather from a vocab-sharded table forces XLA to rematerialise
            # it. Output projections shard the vocabulary instead ("vocab" → tensor).
            embedding_init=logical(nnx.initializers.normal(stddev=stddev), None, "embed"),
            rngs=rngs,
        )
        self.dtype = dtype

    def __call__(self, tokens: jax.Array) -> jax.Array:
        check_indices("token ids", tokens, self.embed.num_embeddings)
        x = self.embed(tokens).astype(self.dtype)
        return x * math.sqrt(x.shape[-1]) if self.scale == "sqrt_d" else x

    def attend(self, h: jax.Array) -> jax.Array:
        """Tied output logits `[..., vocab]`: h · Eᵀ, ÷ √d for the N(0, 1) table (O(1) at init either way)."""
        table = self.embed.embedding[...]
        logits = jnp.einsum("...d,vd->...v", h, table.astype(h.dtype))
        return logits * (1.0 / math.sqrt(table.shape[-1])) if self.scale == "none" else logits


class LearnedPositions(nnx.Module):
    """Learned absolute position embeddings: a `[max_length, d_model]` table N(0, stddev²) added to the inputs
    (scale relative to N(0, 1) tokens: BERT's equal scales are `stddev=1.0`; model.position_init_stddev)."""

    def __init__(self, max_length: int, d_model: int, *, stddev: float, rngs: nnx.Rngs):
        init = logical(nnx.initializers.normal(stddev=stddev), None, "embed")
        self.table = nnx.Param(init(rngs.params(), (max_length, d_model), jnp.float32))

    def __call__(self, x: jax.Array) -> jax.Array:
        length, max_length = x.shape[1], self.table.shape[0]
        if length > max_length:
            raise ValueError(f"input length {length} exceeds the {max_length} learned positions (model.max_length)")
        return x + self.table[:length][None].astype(x.dtype)
