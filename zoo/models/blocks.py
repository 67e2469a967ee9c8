"""The block every model stacks: token mixer, optional cross-attention, optional FFN; pre- or post-LN."""

from __future__ import annotations

import jax
import ml_collections
from flax import nnx

from zoo import mixers
from zoo.layers import FeedForward, compute_dtype
from zoo.layers.dropout import Dropout
from zoo.models.config import check_model_fields, mixer_config


class Block(nnx.Module):
    """model.norm "pre": x + Drop(mixer(LN x)); [x + Drop(cross(LN x, context))]; [x + Drop(FFN(LN x))].
    "post": LN(x + Drop(mixer(x))); [LN(x + Drop(cross(x, context)))]; [LN(x + Drop(FFN(x)))]."""

    def __init__(
        self, cfg: ml_collections.ConfigDict, *, max_length: int, cross: bool, rngs: nnx.Rngs, checked: bool = False
    ):
        """`checked`: the caller (`Encoder`) has checked `cfg`'s declared rules (`check_model_fields`) already."""
        if not checked:
            check_model_fields(cfg)
        dtype = compute_dtype(cfg.dtype)
        eps = cfg.layer_norm_eps
        self.pre_norm = cfg.norm == "pre"
        self.mixer_norm = nnx.LayerNorm(cfg.d_model, epsilon=eps, dtype=dtype, rngs=rngs)
        self.mixer = mixers.build(mixer_config(cfg, max_length=max_length), rngs=rngs, checked=True)
        # NNX: each optional sub-module is assigned once (a module or None), never None then a module.
        cross_mixer = mixers.build(mixer_config(cfg, name=cfg.cross_mixer), rngs=rngs, checked=True) if cross else None
        if cross and not getattr(cross_mixer, "supports_cross", True):
            raise ValueError(
                f"model.cross_mixer={cfg.cross_mixer!r} mixes only within a sequence and cannot be used as "
                "cross-attention; choose an attention-type mixer"
            )
        self.cross = cross_mixer
        self.cross_norm = nnx.LayerNorm(cfg.d_model, epsilon=eps, dtype=dtype, rngs=rngs) if cross else None
        has_ffn = cfg.ffn != "none"
        self.ffn_norm = nnx.LayerNorm(cfg.d_model, epsilon=eps, dtype=dtype, rngs=rngs) if has_ffn else None
        ffn_dropout = cfg.dropout if cfg.ffn_dropout == -1.0 else cfg.ffn_dropout
        ffn_options = dict(layer_norm_eps=eps, gelu_approximate=cfg.gelu_approximate, init=cfg.ffn_init, dtype=dtype)
        self.ffn = (
            FeedForward(cfg.d_model, cfg.mlp_dim, kind=cfg.ffn, dropout=ffn_dropout, **ffn_options, rngs=rngs)
            if has_ffn
            else None
        )
        self.dropout = Dropout(cfg.dropout, rngs=rngs)

    def _residual(self, x, norm, sublayer, rngs):
        """One sub-layer with its residual and LayerNorm, before (pre) or after (post) it."""
        if self.pre_norm:
            return x + self.dropout(sublayer(norm(x)), rngs=rngs)
        return norm(x + self.dropout(sublayer(x), rngs=rngs))

    def _cross_and_ffn(self, x, context, context_mask, rngs, context_kv=None):
        if self.cross is not None:

            def cross(h):
                return self.cross(h, context=context, context_mask=context_mask, context_kv=context_kv, rngs=rngs)

            x = self._residual(x, self.cross_norm, cross, rngs)
        if self.ffn is not None:
            x = self._residual(x, self.ffn_norm, lambda h: self.ffn(h, rngs=rngs), rngs)
        return x

    def __call__(self, x, *, mask, causal: bool, context=None, context_mask=None, rngs: nnx.Rngs | None = None):
        x = self._residual(x, self.mixer_norm, lambda h: self.mixer(h, mask=mask, causal=causal, rngs=rngs), rngs)
        return self._cross_and_ffn(x, context, context_mask, rngs)

    def init_cache(self, batch: int, max_length: int) -> dict:
        return self.mixer.init_cache(batch, max_length)

    def project_context(self, context: jax.Array) -> dict | None:
        return None if self.cross is None else self.cross.project_context(context)

    def decode(
        self, x: jax.Array, cache: dict, *, context=None, context_mask=None, context_kv=None
    ) -> tuple[jax.Array, dict]:
        """One causal step for x `[batch, 1, d_model]` (inference: no dropout)."""
        if self.pre_norm:
            y, cache = self.mixer.decode(self.mixer_norm(x), cache)
            x = x + y
        else:
            y, cache = self.mixer.decode(x, cache)
            x = self.mixer_norm(x + y)
        return self._cross_and_ffn(x, context, context_mask, None, context_kv), cache
