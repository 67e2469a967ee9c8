"""Registry of interchangeable token mixers.

    from zoo import mixers
    cfg = mixers.default_config("relu")          # complete ConfigDict; cfg.name selects the mixer
    cfg.d_model, cfg.num_heads = 256, 4
    layer = mixers.build(cfg, rngs=nnx.Rngs(0))
    y = layer(x, mask=key_mask, causal=False)    # x: [batch, length, d_model]
    y = layer(x, mask=..., context=enc, context_mask=enc_mask)   # cross-attention (attention types)
    cache = layer.init_cache(batch, max_length); y_t, cache = layer.decode(x_t, cache)  # causal steps

Families, one file each: softmax; relu (relu, relu_l, rela); sparse (sparsemax, entmax15);
linear (linear, with its feature maps); sgu (gmlp, amlp).
"""

from __future__ import annotations

from zoo.mixers import linear, relu, sgu, softmax, sparse  # noqa: F401  (registers the mixers)
from zoo.mixers.registry import (
    build,
    default_config,
    default_options,
    forward_flops,
    names,
    option_fields,
    options_config,
    register,
)

__all__ = [
    "build",
    "default_config",
    "default_options",
    "forward_flops",
    "names",
    "option_fields",
    "options_config",
    "register",
]
