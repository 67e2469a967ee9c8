"""Stacks of pre-LN blocks: an encoder (any mixer, optionally causal) and a decoder with incremental decoding."""

from __future__ import annotations

import jax
import ml_collections
from flax import nnx

from zoo.layers import compute_dtype
from zoo.models.blocks import Block

# model.remat → what jax.checkpoint keeps of a block for the backward pass (None: only its inputs).
REMAT_POLICIES = {"full": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}
REMAT = ("none", *REMAT_POLICIES)


class Encoder(nnx.Module):
    """Blocks and a final LayerNorm over `[batch, length, d_model]` inputs."""

    def __init__(
        self,
        cfg: ml_collections.ConfigDict,
        *,
        max_length: int | None = None,
        num_layers: int | None = None,
        cross: bool = False,
        rngs: nnx.Rngs,
    ):
        max_length = cfg.max_length if max_length is None else max_length
        num_layers = cfg.num_layers if num_layers is None else num_layers
        self.blocks = nnx.List([Block(cfg, max_length=max_length, cross=cross, rngs=rngs) for _ in range(num_layers)])
        if cfg.remat not in REMAT:
            raise ValueError(f"config field model.remat={cfg.remat!r} is unknown; valid: {', '.join(REMAT)}")
        self.remat = cfg.remat
        self.final_norm = nnx.LayerNorm(
            cfg.d_model, epsilon=cfg.layer_norm_eps, dtype=compute_dtype(cfg.dtype), rngs=rngs
        )

    def __call__(
        self,
        x: jax.Array,
        *,
        mask: jax.Array | None,
        causal: bool = False,
        context: jax.Array | None = None,
        context_mask: jax.Array | None = None,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        def apply(block, x, mask, context, context_mask, rngs):
            return block(x, mask=mask, causal=causal, context=context, context_mask=context_mask, rngs=rngs)

        if self.remat != "none":  # activations inside a block are recomputed in the backward pass
            apply = nnx.remat(apply, policy=REMAT_POLICIES[self.remat])
        for block in self.blocks:
            x = apply(block, x, mask, context, context_mask, rngs)
        return self.final_norm(x)


class Decoder(Encoder):
    """A causal stack (cross-attention to an encoder when `cross=True`) that can also decode step by step."""

    def __call__(self, x, *, mask, context=None, context_mask=None, rngs=None, causal: bool = True):
        if not causal:
            raise ValueError("a Decoder is always causal")
        return super().__call__(x, mask=mask, causal=True, context=context, context_mask=context_mask, rngs=rngs)

    def init_cache(self, batch: int, max_length: int) -> list:
        return [block.init_cache(batch, max_length) for block in self.blocks]

    def project_context(self, context: jax.Array) -> list:
        """Each block's cross-attention keys/values of the encoder output (for `decode(context_kv=...)`)."""
        return [block.project_context(context) for block in self.blocks]

    def decode(self, x, cache: list, *, context=None, context_mask=None, context_kv=None) -> tuple[jax.Array, list]:
        new_cache = []
        context_kv = [None] * len(self.blocks) if context_kv is None else context_kv
        for block, c, kv in zip(self.blocks, cache, context_kv, strict=True):
            x, c = block.decode(x, c, context=context, context_mask=context_mask, context_kv=kv)
            new_cache.append(c)
        return self.final_norm(x), new_cache
