"""The model section every task config shares, and the mixer config derived from it."""

from __future__ import annotations

import ml_collections

from zoo import mixers


def model_config(**overrides) -> ml_collections.ConfigDict:
    """Defaults for a pre-LN encoder; `mixer_options.<name>` holds each mixer's own fields."""
    cfg = ml_collections.ConfigDict(
        {
            "mixer": "relu",
            "num_layers": 2,
            "d_model": 128,
            "num_heads": 4,
            "mlp_dim": 256,
            "max_length": 512,
            "dropout": 0.1,
            "ffn": "relu",
            "positional": "sinusoidal",
            "pooling": "cls",
            "dtype": "float32",  # compute dtype; parameters stay float32
            "mixer_options": mixers.options_config(),
        }
    )
    cfg.update(overrides)
    return cfg


def mixer_config(model: ml_collections.ConfigDict, *, max_length: int | None = None) -> ml_collections.ConfigDict:
    """The selected mixer's complete config: shared fields from `model`, options from `model.mixer_options`."""
    cfg = mixers.default_config(model.mixer)  # raises, listing valid names, for an unknown mixer
    cfg.update(model.mixer_options[model.mixer])
    cfg.d_model, cfg.num_heads, cfg.dtype = model.d_model, model.num_heads, model.dtype
    cfg.max_length = model.max_length if max_length is None else max_length
    return cfg
