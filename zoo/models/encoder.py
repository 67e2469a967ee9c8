"""Stacks of blocks: an encoder (any mixer, optionally causal) and a decoder with incremental decoding."""

from __future__ import annotations

import jax
import ml_collections
from flax import nnx

from zoo.layers import compute_dtype
from zoo.layers.common import constrain_batch_sharded
from zoo.models.blocks import Block
from zoo.models.config import check_model_fields

# model.remat → what jax.checkpoint keeps of a block for the backward pass (None: only its inputs).
REMAT_POLICIES = {"full": None, "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


class Encoder(nnx.Module):
    """Blocks and, with pre-LN blocks, a final LayerNorm over `[batch, length, d_model]` inputs.

    `model.scan_layers`: one `Block` with every parameter stacked on a leading layer axis, applied by `nnx.scan`;
    `layers()` gives the blocks one by one either way.
    """

    def __init__(
        self,
        cfg: ml_collections.ConfigDict,
        *,
        max_length: int | None = None,
        num_layers: int | None = None,
        cross: bool = False,
        rngs: nnx.Rngs,
        checked: bool = False,
    ):
        """`checked`: the model that holds this stack has checked `cfg` (`check_model`) already."""
        if not checked:
            check_model_fields(cfg)  # once for the stack, not once per block
        max_length = cfg.max_length if max_length is None else max_length
        num_layers = cfg.num_layers if num_layers is None else num_layers
        self.num_layers, self.scan_layers = num_layers, bool(cfg.scan_layers)
        if self.scan_layers:

            @nnx.split_rngs(splits=num_layers)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def stacked_blocks(rngs: nnx.Rngs) -> Block:
                return Block(cfg, max_length=max_length, cross=cross, rngs=rngs, checked=True)

            self.blocks = stacked_blocks(rngs)
            for _, variable in nnx.iter_graph(self.blocks):  # logical axes: None (never split) for the layer axis
                if isinstance(variable, nnx.Variable) and variable.get_metadata().get("logical_axes") is not None:
                    variable.set_metadata(logical_axes=(None, *variable.get_metadata()["logical_axes"]))
        else:
            self.blocks = nnx.List(
                [Block(cfg, max_length=max_length, cross=cross, rngs=rngs, checked=True) for _ in range(num_layers)]
            )
        self.remat = cfg.remat
        self.final_norm = (
            nnx.LayerNorm(cfg.d_model, epsilon=cfg.layer_norm_eps, dtype=compute_dtype(cfg.dtype), rngs=rngs)
            if cfg.norm == "pre"
            else None
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
        if not self.scan_layers:
            for block in self.blocks:
                x = constrain_batch_sharded(apply(block, x, mask, context, context_mask, rngs))
            return self._final_norm(x)

        def layer(x, block, rngs):
            return constrain_batch_sharded(apply(block, x, mask, context, context_mask, rngs))

        if rngs is None:
            x = nnx.scan(lambda x, block: layer(x, block, None), in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)(
                x, self.blocks
            )
        else:
            with nnx.split_rngs(rngs, splits=self.num_layers):  # a key per layer, as the unrolled blocks draw
                x = nnx.scan(layer, in_axes=(nnx.Carry, 0, 0), out_axes=nnx.Carry)(x, self.blocks, rngs)
        return self._final_norm(x)

    def _final_norm(self, x: jax.Array) -> jax.Array:
        return x if self.final_norm is None else self.final_norm(x)

    def layers(self) -> list[Block]:
        """The blocks in order; with `scan_layers`, views of layer i of the stacked parameters."""
        if not self.scan_layers:
            return list(self.blocks)
        graphdef, state = nnx.split(self.blocks)
        return [nnx.merge(graphdef, jax.tree.map(lambda x, i=i: x[i], state)) for i in range(self.num_layers)]


class Decoder(Encoder):
    """A causal stack (cross-attention to an encoder when `cross=True`) that can also decode step by step."""

    def __call__(self, x, *, mask, context=None, context_mask=None, rngs=None, causal: bool = True):
        if not causal:
            raise ValueError("a Decoder is always causal")
        return super().__call__(x, mask=mask, causal=True, context=context, context_mask=context_mask, rngs=rngs)

    def init_cache(self, batch: int, max_length: int) -> list:
        return [block.init_cache(batch, max_length) for block in self.layers()]

    def project_context(self, context: jax.Array) -> list:
        """Each block's cross-attention keys/values of the encoder output (for `decode(context_kv=...)`)."""
        return [block.project_context(context) for block in self.layers()]

    def decode(self, x, cache: list, *, context=None, context_mask=None, context_kv=None) -> tuple[jax.Array, list]:
        new_cache = []
        layers = self.layers()
        context_kv = [None] * len(layers) if context_kv is None else context_kv
        for block, c, kv in zip(layers, cache, context_kv, strict=True):
            x, c = block.decode(x, c, context=context, context_mask=context_mask, context_kv=kv)
            new_cache.append(c)
        return self._final_norm(x), new_cache
