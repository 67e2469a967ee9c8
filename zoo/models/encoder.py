"""Pre-LN Transformer encoder whose token mixer is any registered mixer."""

from __future__ import annotations

import jax
import ml_collections
from flax import nnx

from zoo import mixers
from zoo.layers import FeedForward, compute_dtype
from zoo.models.config import mixer_config


class EncoderBlock(nnx.Module):
    """x + Dropout(mixer(LN(x))); x + Dropout(FFN(LN(x)))."""

    def __init__(self, cfg: ml_collections.ConfigDict, *, max_length: int, rngs: nnx.Rngs):
        dtype = compute_dtype(cfg.dtype)
        self.mixer_norm = nnx.LayerNorm(cfg.d_model, dtype=dtype, rngs=rngs)
        self.mixer = mixers.build(mixer_config(cfg, max_length=max_length), rngs=rngs)
        self.ffn_norm = nnx.LayerNorm(cfg.d_model, dtype=dtype, rngs=rngs)
        self.ffn = FeedForward(cfg.d_model, cfg.mlp_dim, kind=cfg.ffn, dropout=cfg.dropout, dtype=dtype, rngs=rngs)
        self.dropout = nnx.Dropout(cfg.dropout)

    def __call__(self, x, *, mask, causal: bool, rngs: nnx.Rngs | None = None):
        x = x + self.dropout(self.mixer(self.mixer_norm(x), mask=mask, causal=causal), rngs=rngs)
        return x + self.dropout(self.ffn(self.ffn_norm(x), rngs=rngs), rngs=rngs)


class Encoder(nnx.Module):
    """A stack of pre-LN blocks and a final LayerNorm over `[batch, length, d_model]` inputs."""

    def __init__(self, cfg: ml_collections.ConfigDict, *, max_length: int | None = None, rngs: nnx.Rngs):
        max_length = cfg.max_length if max_length is None else max_length
        self.blocks = nnx.List([EncoderBlock(cfg, max_length=max_length, rngs=rngs) for _ in range(cfg.num_layers)])
        self.final_norm = nnx.LayerNorm(cfg.d_model, dtype=compute_dtype(cfg.dtype), rngs=rngs)

    def __call__(self, x: jax.Array, *, mask: jax.Array | None, causal: bool = False, rngs: nnx.Rngs | None = None):
        for block in self.blocks:
            x = block(x, mask=mask, causal=causal, rngs=rngs)
        return self.final_norm(x)
