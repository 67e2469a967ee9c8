"""Sequence classifiers (LRA style): a single-text classifier and a two-tower dual encoder."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from zoo.layers import ClassificationHead, TokenEmbedding, add_positions, compute_dtype
from zoo.layers.heads import pool
from zoo.models.encoder import Encoder

PAD_ID = 0


class SequenceEncoder(nnx.Module):
    """tokens → [CLS] + embeddings + positions → encoder → pooled `[batch, d_model]`. Id 0 is padding.

    `cfg.max_length` counts input tokens (without [CLS]).
    """

    def __init__(self, cfg: ml_collections.ConfigDict, *, vocab_size: int, rngs: nnx.Rngs):
        dtype = compute_dtype(cfg.dtype)
        self.max_length, self.pooling, self.positional = cfg.max_length, cfg.pooling, cfg.positional
        self.embed = TokenEmbedding(vocab_size, cfg.d_model, dtype=dtype, rngs=rngs)
        self.cls = nnx.Param(jnp.zeros((cfg.d_model,), jnp.float32)) if cfg.pooling == "cls" else None
        extra = 1 if cfg.pooling == "cls" else 0
        self.encoder = Encoder(cfg, max_length=cfg.max_length + extra, rngs=rngs)
        self.dropout = nnx.Dropout(cfg.dropout)

    def __call__(self, tokens: jax.Array, *, rngs: nnx.Rngs | None = None) -> jax.Array:
        if tokens.shape[1] > self.max_length:
            raise ValueError(f"input length {tokens.shape[1]} exceeds model.max_length={self.max_length}")
        mask = tokens != PAD_ID
        x = self.embed(tokens)
        if self.cls is not None:
            cls = jnp.broadcast_to(self.cls[...].astype(x.dtype), (x.shape[0], 1, x.shape[2]))
            x = jnp.concatenate([cls, x], axis=1)
            mask = jnp.concatenate([jnp.ones((x.shape[0], 1), bool), mask], axis=1)
        x = add_positions(x, self.positional)  # after [CLS], as LRA does, so [CLS] is not all-zero
        x = self.encoder(self.dropout(x, rngs=rngs), mask=mask, rngs=rngs)
        return pool(x, mask, self.pooling)


class SequenceClassifier(nnx.Module):
    """tokens `[batch, length]` → logits `[batch, num_classes]` (Dense → ReLU → Dense head)."""

    def __init__(self, cfg: ml_collections.ConfigDict, *, vocab_size: int, num_classes: int, rngs: nnx.Rngs):
        self.encoder = SequenceEncoder(cfg, vocab_size=vocab_size, rngs=rngs)
        self.head = ClassificationHead(cfg.d_model, cfg.mlp_dim, num_classes, dtype=compute_dtype(cfg.dtype), rngs=rngs)

    def __call__(self, tokens: jax.Array, *, rngs: nnx.Rngs | None = None) -> jax.Array:
        return self.head(self.encoder(tokens, rngs=rngs))


class DualEncoder(nnx.Module):
    """Two texts through one shared encoder; the head sees [x1, x2, x1·x2, x1 − x2] (LRA Retrieval)."""

    def __init__(self, cfg: ml_collections.ConfigDict, *, vocab_size: int, num_classes: int, rngs: nnx.Rngs):
        self.encoder = SequenceEncoder(cfg, vocab_size=vocab_size, rngs=rngs)
        dtype = compute_dtype(cfg.dtype)
        self.head = ClassificationHead(4 * cfg.d_model, cfg.mlp_dim, num_classes, dtype=dtype, rngs=rngs)

    def __call__(self, tokens1: jax.Array, tokens2: jax.Array, *, rngs: nnx.Rngs | None = None) -> jax.Array:
        x1, x2 = self.encoder(tokens1, rngs=rngs), self.encoder(tokens2, rngs=rngs)
        return self.head(jnp.concatenate([x1, x2, x1 * x2, x1 - x2], axis=-1))
