"""Sequence classifiers (LRA style): a single-text classifier and a two-tower dual encoder."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from zoo.layers import ClassificationHead, TokenEmbedding, add_positions, compute_dtype
from zoo.layers.dropout import Dropout
from zoo.layers.embeddings import LearnedPositions
from zoo.layers.heads import pool
from zoo.models.config import check_model, check_tie_embeddings
from zoo.models.encoder import Encoder

PAD_ID = 0


class SequenceEncoder(nnx.Module):
    """tokens → [CLS] + embeddings + positions → encoder → pooled `[batch, d_model]`.

    `cfg.max_length` counts input tokens (without [CLS]); "cls" pooling prepends a learned [CLS] (zeros at init).
    `cfg.pixel_zero_is_padding` hides black pixels from attention as keys; they still count for pooling.
    """

    def __init__(self, cfg: ml_collections.ConfigDict, *, vocab_size: int, rngs: nnx.Rngs, checked: bool = False):
        """`checked`: the model that holds this encoder has checked `cfg` and `vocab_size` already."""
        if not checked:
            check_model(cfg, "SequenceEncoder", vocab_size=vocab_size)
        dtype = compute_dtype(cfg.dtype)
        self.max_length, self.pooling, self.positional = cfg.max_length, cfg.pooling, cfg.positional
        self.pad_id = cfg.get("pad_id", PAD_ID)
        self.zero_is_padding = cfg.get("pixel_zero_is_padding", False)
        self.embed = TokenEmbedding(vocab_size, cfg.d_model, dtype=dtype, rngs=rngs, scale=cfg.embed_scale)
        self.cls = nnx.Param(jnp.zeros((cfg.d_model,), jnp.float32)) if cfg.pooling == "cls" else None
        extra = 1 if cfg.pooling == "cls" else 0
        self.encoder = Encoder(cfg, max_length=cfg.max_length + extra, rngs=rngs, checked=True)
        self.positions = (
            LearnedPositions(cfg.max_length + extra, cfg.d_model, stddev=cfg.position_init_stddev, rngs=rngs)
            if cfg.positional == "learned"
            else None
        )
        self.dropout = Dropout(cfg.dropout, rngs=rngs)

    def __call__(self, tokens: jax.Array, *, rngs: nnx.Rngs | None = None) -> jax.Array:
        if tokens.shape[1] > self.max_length:
            raise ValueError(f"input length {tokens.shape[1]} exceeds model.max_length={self.max_length}")
        mask = tokens != self.pad_id
        keys = mask & (tokens != 0) if self.zero_is_padding else mask
        x = self.embed(tokens)
        if self.cls is not None:
            cls = jnp.broadcast_to(self.cls[...].astype(x.dtype), (x.shape[0], 1, x.shape[2]))
            x = jnp.concatenate([cls, x], axis=1)
            mask, keys = (jnp.concatenate([jnp.ones((x.shape[0], 1), bool), m], axis=1) for m in (mask, keys))
        # after [CLS], as LRA does, so [CLS] is not all-zero
        x = self.positions(x) if self.positions is not None else add_positions(x, self.positional)
        x = self.encoder(self.dropout(x, rngs=rngs), mask=keys, rngs=rngs)
        return pool(x, mask, self.pooling)


class SequenceClassifier(nnx.Module):
    """tokens `[batch, length]` → logits `[batch, num_classes]` (Dense → ReLU → Dense head)."""

    def __init__(self, cfg: ml_collections.ConfigDict, *, vocab_size: int, num_classes: int, rngs: nnx.Rngs):
        check_model(cfg, "SequenceClassifier", vocab_size=vocab_size, num_classes=num_classes)
        check_tie_embeddings(cfg, ("none",), "a classifier (it has no output embedding)")
        self.encoder = SequenceEncoder(cfg, vocab_size=vocab_size, rngs=rngs, checked=True)
        self.head = ClassificationHead(
            cfg.d_model, cfg.mlp_dim, num_classes, dtype=compute_dtype(cfg.dtype), rngs=rngs, layers=cfg.head_layers
        )

    def __call__(self, tokens: jax.Array, *, rngs: nnx.Rngs | None = None) -> jax.Array:
        return self.head(self.encoder(tokens, rngs=rngs))


class DualEncoder(nnx.Module):
    """Two texts through one shared encoder, no attention between them (LRA Retrieval). `cfg.pair_features`:
    "nli" (default) gives the head [x1, x2, x1·x2, x1 − x2] (the LRA paper's), "concat" [x1, x2] (its code's)."""

    PAIR_FEATURES = ("nli", "concat")

    def __init__(self, cfg: ml_collections.ConfigDict, *, vocab_size: int, num_classes: int, rngs: nnx.Rngs):
        self.pair_features = cfg.get("pair_features", "nli")
        if self.pair_features not in self.PAIR_FEATURES:
            valid = ", ".join(self.PAIR_FEATURES)
            raise ValueError(f"model.pair_features={self.pair_features!r} is unknown; valid: {valid}")
        check_model(cfg, "DualEncoder", vocab_size=vocab_size, num_classes=num_classes)
        check_tie_embeddings(cfg, ("none",), "a classifier (it has no output embedding)")
        self.encoder = SequenceEncoder(cfg, vocab_size=vocab_size, rngs=rngs, checked=True)
        dtype = compute_dtype(cfg.dtype)
        width = (4 if self.pair_features == "nli" else 2) * cfg.d_model
        self.head = ClassificationHead(width, cfg.mlp_dim, num_classes, dtype=dtype, rngs=rngs, layers=cfg.head_layers)

    def features(self, x1: jax.Array, x2: jax.Array) -> jax.Array:
        if self.pair_features == "concat":
            return jnp.concatenate([x1, x2], axis=-1)
        return jnp.concatenate([x1, x2, x1 * x2, x1 - x2], axis=-1)

    def __call__(self, tokens1: jax.Array, tokens2: jax.Array, *, rngs: nnx.Rngs | None = None) -> jax.Array:
        if tokens1.shape != tokens2.shape:
            raise ValueError(f"the two texts of a pair must have one shape, got {tokens1.shape} and {tokens2.shape}")
        # One pass over both towers' inputs (shared weights): the same result as two calls, half the launches.
        x1, x2 = jnp.split(self.encoder(jnp.concatenate([tokens1, tokens2]), rngs=rngs), 2)
        return self.head(self.features(x1, x2))
