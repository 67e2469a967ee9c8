"""Registry of interchangeable token mixers.

    from zoo import mixers
    cfg = mixers.default_config("relu")          # complete ConfigDict; cfg.name selects the mixer
    cfg.d_model, cfg.num_heads = 256, 4
    layer = mixers.build(cfg, rngs=nnx.Rngs(0))
    y = layer(x, mask=key_mask, causal=False)    # x: [batch, length, d_model]

Each family lives in its own file and registers its names on import.
"""

from __future__ import annotations

from zoo.mixers import relu, softmax  # noqa: F401  (registers the mixers)
from zoo.mixers.registry import build, default_config, names, options_config, register

__all__ = ["build", "default_config", "names", "options_config", "register"]
