"""LRA ListOps: classify the value (0-9) of a nested MIN / MAX / MED / SM expression.

Presets (after the colon):

  demo      Short expressions (20 < length < 128 tokens, depth <= 6, <= 6 arguments) generated into
            data/listops-demo; 2-layer, d 128, 4-head ReLU-attention encoder.
              lra-train --config=lra_flax/configs/listops.py:demo --workdir=runs/listops-demo
            Hardware: 2 CPU cores, about 3 minutes. Expected: test accuracy well above the majority-class
            rate (about 12%); docs/results.md has the measured figure.
  lra_code  The LRA code's ListOps Transformer at 2K tokens, softmax attention (every field: docs/presets.md).
            Data: the LRA release TSVs in data.dir, or 96k/2k/2k generated there with --config.data.generate=True.
              lra-train --config=lra_flax/configs/listops.py:lra_code --workdir=runs/listops \\
                --config.data.dir=/path/to/lra_release/listops-1000
            Hardware: one GPU or TPU host. Expected: about 36-37% test accuracy with softmax
            attention (LRA paper 36.37, e-lra re-run 37.35).
  paper     As lra_code with the paper's 6 layers and MLP 2048.

Override any field with --config.a.b=value; unknown fields are errors. Mixers: --config.model.mixer=NAME,
their own fields under --config.model.mixer_options.NAME.FIELD.
"""

from __future__ import annotations

import ml_collections

from lra_flax.configs.common import base_config, lra_code_model, lra_code_train
from zoo.config_fields import BOOLEAN, PATH, Field, integer, nested
from zoo.models import model_config
from zoo.training import small_run_config
from zoo.training.data import cache_dir_field

PRESETS = ("demo", "lra_code", "paper")

# LRA's generator (listops/listops.py): trees of depth ≤ max_depth, 2..max_args arguments, kept when
# min_length < tokens < max_length.
GENERATOR_FIELDS: tuple[Field, ...] = (
    Field("num_train", 96000, integer(1, 10**8), "training expressions"),
    Field("num_valid", 2000, integer(1, 10**8), "validation expressions"),
    Field("num_test", 2000, integer(1, 10**8), "test expressions"),
    Field("seed", 0, integer(0), "the generator's seed (the same seed gives the same files)"),
    Field("min_length", 500, integer(0, 10**6), "expressions are longer than this many tokens"),
    Field("max_length", 2000, integer(2, 10**6), "and shorter than this many"),
    Field("max_depth", 10, integer(1, 100), "deepest nesting of operators"),
    Field("max_args", 10, integer(2, 100), "most arguments of an operator"),
)
DATA_FIELDS: tuple[Field, ...] = (
    Field("dir", "data/listops", PATH, "the LRA release's basic_{train,val,test}.tsv, or where they are generated"),
    cache_dir_field("data.dir"),
    Field("generate", True, BOOLEAN, "generate the splits into data.dir when it holds no TSVs"),
    Field("truncate", False, BOOLEAN, "cut inputs longer than model.max_length (LRA's pipeline does); unset, such "
          "an input is an error"),
    nested("generator", GENERATOR_FIELDS, "the generator's settings, when data.generate writes the splits"),
)  # fmt: skip
CONFIG_SECTIONS = {"data": DATA_FIELDS}


def get_config(preset: str = "demo") -> ml_collections.ConfigDict:
    config = base_config("listops", "ListOps", preset, PRESETS, DATA_FIELDS)
    if preset == "demo":
        config.data.dir = "data/listops-demo"
        config.data.generator.update(
            num_train=6000, num_valid=500, num_test=1000, min_length=20, max_length=128, max_depth=6, max_args=6
        )
        config.model = model_config(
            mixer="relu", num_layers=2, d_model=128, num_heads=4, mlp_dim=256, max_length=128, dropout=0.0
        )
        config.train = small_run_config(
            700, eval_every=350, batch_size=64, learning_rate=1e-3, warmup_steps=70, weight_decay=0.01
        )
    else:
        layers, mlp = (4, 1024) if preset == "lra_code" else (6, 2048)
        config.model = lra_code_model(
            num_layers=layers, d_model=512, num_heads=8, mlp_dim=mlp, max_length=2000, dropout=0.1,
            attention_dropout=0.1,
        )  # fmt: skip
        config.data.truncate = True  # the LRA pipeline cuts at max_length
        config.train = lra_code_train(steps=5000, warmup_steps=1000)
    # A preset that names the release reads it; it generates data only when asked: a mistyped data.dir is
    # refused, not filled with synthetic data that the run would then train on.
    config.data.generate = preset == "demo"
    config.lock()
    return config
