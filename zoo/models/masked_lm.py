"""Bidirectional text encoders for masked language modelling and the classifiers fine-tuned from them.

`TextEncoder` (token + optional learned position embeddings → encoder) is the part a fine-tuning run
copies from a pretraining checkpoint: `MaskedLM` and `TextClassifier` both hold one as `.backbone`, so
`nnx.update(classifier.backbone, nnx.state(masked_lm.backbone))` transfers it exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from zoo.layers import (
    ClassificationHead,
    LearnedPositions,
    TokenEmbedding,
    add_positions,
    check_indices,
    compute_dtype,
    dense,
)
from zoo.layers.dropout import Dropout
from zoo.layers.heads import pool
from zoo.models.classifiers import PAD_ID
from zoo.models.config import check_model
from zoo.models.encoder import Encoder


class TextEncoder(nnx.Module):
    """tokens `[batch, length]` (id 0 = padding) → `[batch, length, d_model]`, bidirectional; length at most
    `cfg.max_length` (the SGU's spatial size)."""

    def __init__(self, cfg: ml_collections.ConfigDict, *, vocab_size: int, rngs: nnx.Rngs, checked: bool = False):
        """`checked`: the model that holds this encoder has checked `cfg` and `vocab_size` already."""
        if not checked:
            check_model(cfg, "TextEncoder", vocab_size=vocab_size)
        dtype = compute_dtype(cfg.dtype)
        self.max_length, self.positional = cfg.max_length, cfg.positional
        self.embed = TokenEmbedding(vocab_size, cfg.d_model, dtype=dtype, rngs=rngs, scale=cfg.embed_scale)
        self.positions = (
            LearnedPositions(cfg.max_length, cfg.d_model, stddev=cfg.position_init_stddev, rngs=rngs)
            if cfg.positional == "learned"
            else None
        )
        self.encoder = Encoder(cfg, rngs=rngs, checked=True)
        self.dropout = Dropout(cfg.dropout, rngs=rngs)

    def __call__(self, tokens: jax.Array, *, rngs: nnx.Rngs | None = None) -> jax.Array:
        if tokens.shape[1] > self.max_length:
            raise ValueError(
                f"input length {tokens.shape[1]} exceeds model.max_length={self.max_length} "
                "(the spatial size of gMLP's W, or the number of learned positions)"
            )
        x = self.embed(tokens)
        x = self.positions(x) if self.positions is not None else add_positions(x, self.positional)
        return self.encoder(self.dropout(x, rngs=rngs), mask=tokens != PAD_ID, rngs=rngs)


class MaskedLM(nnx.Module):
    """tokens → logits `[batch, length, vocab]` (float32), or `[batch, P, vocab]` at `positions` `[batch, P]` only.
    Head (BERT's): Dense → GELU → LayerNorm, then the input embedding table transposed (tied) plus a bias."""

    def __init__(self, cfg: ml_collections.ConfigDict, *, vocab_size: int, rngs: nnx.Rngs):
        check_model(cfg, "MaskedLM", vocab_size=vocab_size)
        dtype = compute_dtype(cfg.dtype)
        self.backbone = TextEncoder(cfg, vocab_size=vocab_size, rngs=rngs, checked=True)
        self.transform = dense(cfg.d_model, cfg.d_model, ("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.transform_norm = nnx.LayerNorm(cfg.d_model, epsilon=cfg.layer_norm_eps, dtype=dtype, rngs=rngs)
        self.gelu_approximate = cfg.gelu_approximate
        self.output_bias = nnx.Param(jnp.zeros((vocab_size,), jnp.float32))

    def __call__(
        self, tokens: jax.Array, *, positions: jax.Array | None = None, rngs: nnx.Rngs | None = None
    ) -> jax.Array:
        h = self.backbone(tokens, rngs=rngs)
        if positions is not None:
            check_indices("positions", positions, tokens.shape[1])
            h = jnp.take_along_axis(h, positions[..., None], axis=1)
        h = self.transform_norm(jax.nn.gelu(self.transform(h), approximate=self.gelu_approximate))
        return self.backbone.embed.attend(h).astype(jnp.float32) + self.output_bias[...]


class TextClassifier(nnx.Module):
    """tokens (`[CLS] a [SEP] (b [SEP])`) → logits `[batch, num_classes]` from the pooled encoder output."""

    def __init__(self, cfg: ml_collections.ConfigDict, *, vocab_size: int, num_classes: int, rngs: nnx.Rngs):
        check_model(cfg, "TextClassifier", vocab_size=vocab_size, num_classes=num_classes)
        self.backbone = TextEncoder(cfg, vocab_size=vocab_size, rngs=rngs, checked=True)
        self.pooling = cfg.pooling
        self.dropout = Dropout(cfg.dropout, rngs=rngs)
        self.head = ClassificationHead(cfg.d_model, cfg.d_model, num_classes, dtype=compute_dtype(cfg.dtype), rngs=rngs)

    def __call__(self, tokens: jax.Array, *, rngs: nnx.Rngs | None = None) -> jax.Array:
        x = self.backbone(tokens, rngs=rngs)
        return self.head(self.dropout(pool(x, tokens != PAD_ID, self.pooling), rngs=rngs))
