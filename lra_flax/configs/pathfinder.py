"""LRA Pathfinder (32×32, 1,024 tokens) and Path-X (128×128, 16,384 tokens): are the markers joined?

Presets (after the colon):

  demo        4,000 pathfinder32 "hard" images generated into data/lra-pathfinder (the published algorithm
              with LRA's parameters, all CPU cores), a 1-layer d 32 encoder, mean pooling, 300 steps.
                lra-train --config=lra_flax/configs/pathfinder.py:demo --workdir=runs/pathfinder-demo
              Hardware: 2 CPU cores, about 5 minutes of training after ~5 minutes of generation. Expected:
              near the 50% majority rate — Pathfinder stays at chance for many models for thousands of steps;
              docs/results.md has the measured figure.
  lra_code    The LRA code's Pathfinder-32 Transformer, softmax attention (every field: docs/presets.md), black
              pixels hidden from attention (the LRA code's `inputs > 0` mask); 62,400 steps, 200 epochs of 160k.
              Data: LRA's release (data.dir = lra_release), or 200k images generated with --config.data.generate=True.
                lra-train --config=lra_flax/configs/pathfinder.py:lra_code --workdir=runs/pathfinder \\
                  --config.data.dir=/path/to/lra_release
              Hardware: one GPU or TPU host. Expected: about 71% with softmax attention (LRA paper 71.40).
  pathx       The LRA code's Path-X (pathfinder128 hard, 16,384 tokens), softmax attention, black pixels hidden
              (docs/presets.md). Softmax attention's T×T scores are 1 GiB per head and example at fp32.
                lra-train --config=lra_flax/configs/pathfinder.py:pathx --workdir=runs/pathx \\
                  --config.model.mixer=linear --config.data.dir=/path/to/lra_release
              Every model in the LRA paper failed Path-X (50%); S5 reaches 98.58.
  pathx_demo  Path-X on a CPU: 64 generated images (~7 s each) and a few training steps of a linear mixer.

Override any field with --config.a.b=value; unknown fields are errors.
"""

from __future__ import annotations

import ml_collections

from lra_flax.configs.common import base_config, lra_code_model
from lra_flax.configs.image import pixel_model
from lra_flax.pathfinder_generator import DIFFICULTY_DIRS
from zoo.config_fields import BOOLEAN, PATH, TEXT, Field, integer, one_of
from zoo.training import train_config

PRESETS = ("demo", "lra_code", "pathx", "pathx_demo")

DATA_FIELDS: tuple[Field, ...] = (
    Field("dir", "data/lra-pathfinder", PATH, "holds pathfinder<resolution>/<difficulty folder>/ (LRA's "
          "lra_release folder works as it is), or where images are generated"),
    Field("resolution", 32, one_of(32, 64, 128, 256), "image side: 32 Pathfinder, 128 Path-X (the generator "
          "draws these two; the release also has 64 and 256)"),
    Field("difficulty", "hard", one_of(*DIFFICULTY_DIRS), "LRA's difficulty (contour length 6 / 9 / 14)"),
    Field("generate", True, BOOLEAN, "generate data.num_images images there when the folder has no metadata"),
    Field("num_images", 200000, integer(10, 10**7), "images to generate, split 80/10/10 (LRA: 200,000 per "
          "difficulty)"),
    Field("seed", 0, integer(0), "the generator's seed"),
    Field("workers", 0, integer(0, 4096), "generator processes; 0: all cores"),
    Field("cache_dir", "", TEXT, "cached examples go under cache/ there; '': data.dir"),
)  # fmt: skip
CONFIG_SECTIONS = {"data": DATA_FIELDS}


def get_config(preset: str = "demo") -> ml_collections.ConfigDict:
    config = base_config("pathfinder", "Pathfinder", preset, PRESETS, DATA_FIELDS)
    config.data.resolution = 128 if preset.startswith("pathx") else 32
    config.data.num_images = {"demo": 4000, "lra_code": 200000, "pathx": 200000, "pathx_demo": 64}[preset]
    if preset == "demo":
        config.model = pixel_model(
            mixer="relu", num_layers=1, d_model=32, num_heads=4, mlp_dim=32, max_length=1024, dropout=0.0,
            pooling="mean",
        )  # fmt: skip
    elif preset == "lra_code":  # pathfinder32/base_pathfinder32_config.py and transformer_base.py
        config.model = lra_code_model(
            pad_id=-1, pixel_zero_is_padding=True, num_layers=4, d_model=32, qkv_dim=16, num_heads=4, mlp_dim=32,
            max_length=1024, dropout=0.2, attention_dropout=0.1, pooling="mean",
        )  # fmt: skip
    elif preset == "pathx":  # pathfinder128/base_pathfinder128_config.py
        config.model = lra_code_model(
            pad_id=-1, pixel_zero_is_padding=True, num_layers=1, d_model=32, qkv_dim=16, num_heads=2, mlp_dim=32,
            max_length=128 * 128, dropout=0.1, attention_dropout=0.1, pooling="mean", positional="learned",
        )  # fmt: skip
    else:
        config.model = pixel_model(
            mixer="linear", num_layers=1, d_model=32, num_heads=2, mlp_dim=32, max_length=128 * 128, dropout=0.0,
            pooling="mean",
        )  # fmt: skip
    # Cosine schedule, no weight decay; per preset:
    names = ("steps", "batch_size", "learning_rate", "warmup_steps", "grad_clip_norm")
    names += ("log_every", "eval_every", "checkpoint_every", "eval_batch_size")
    train = {
        "demo": (300, 32, 2e-3, 30, 1.0, 50, 0, 150, 256),
        "lra_code": (62400, 512, 1e-3, 312, 0.0, 100, 1000, 1000, 0),
        "pathx": (500000, 64, 1e-3, 2500, 1.0, 100, 1000, 1000, 0),
        "pathx_demo": (5, 8, 1e-3, 1, 1.0, 1, 0, 5, 8),
    }[preset]
    config.train = train_config(schedule="cosine", weight_decay=0.0, **dict(zip(names, train, strict=True)))
    # A preset that names the release reads it; it generates data only when asked: a mistyped data.dir is
    # refused, not filled with synthetic data that the run would then train on.
    config.data.generate = preset.endswith("demo")
    config.lock()
    return config
