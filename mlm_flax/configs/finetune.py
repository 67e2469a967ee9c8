"""Fine-tuning a pretrained MLM encoder as a sentence(-pair) classifier: SST-2, MNLI, or the offline sample.

Preset (after the colon): TASK or TASK,ENCODER — TASK in polarity | sst2 | mnli; ENCODER one of
mlm_flax/configs/pretrain.py's ARCH_SIZE presets (default gmlp_demo), which must be the one the
pretraining run used (its checkpoint is loaded into the classifier's encoder; a mismatch is an error).

  polarity    offline: 200 labelled movie-review sentences from the gensim wheel (140 train / 30 / 30).
                mlm-finetune --config=mlm_flax/configs/finetune.py:polarity \\
                  --config.pretrained.workdir=runs/mlm-demo --workdir=runs/polarity-demo
              Hardware: 2 CPU cores, about a minute. Expected: little above chance — 140 sentences are a
              smoke test of the transfer, not a benchmark.
  sst2        GLUE SST-2 (TSVs in data.dir, or data.source=tfds); valid = 1000 held-out training sentences,
              test = GLUE dev. Paper (base models): gMLP 94.2, aMLP 93.4, BERT 93.8 % accuracy.
                mlm-finetune --config=mlm_flax/configs/finetune.py:sst2,gmlp_base \\
                  --config.pretrained.workdir=runs/gmlp-base --config.data.dir=data/glue/SST-2 --workdir=runs/sst2
  mnli        GLUE MNLI: test = dev_matched, test_mismatched = dev_mismatched. Paper: gMLP 83.7/84.1,
              aMLP 85.9/85.8, BERT 85.6/85.7.

results.json: test_accuracy (and test_mismatched_accuracy for MNLI), valid_accuracy, pretrained_step (the encoder's
checkpoint step; a pretraining run without results.json is used with a warning that it is unfinished).
"""

from __future__ import annotations

import ml_collections

from mlm_flax.configs import pretrain
from zoo.config_fields import TEXT, Field, integer, one_of, section
from zoo.training import small_run_config, task_config, train_config
from zoo.training.data import TFDS_DATA_DIR, WHEEL_CACHE

TASKS = ("polarity", "sst2", "mnli")

PRETRAINED_FIELDS: tuple[Field, ...] = (
    Field(
        "workdir",
        "",
        TEXT,
        "the mlm-train workdir whose encoder is fine-tuned (its spm.model, config.json and checkpoints/)",
    ),
    Field("step", 0, integer(0, 10**10), "its checkpoint at this step; 0: the latest"),
)
DATA_FIELDS: tuple[Field, ...] = (
    Field("task", "polarity", one_of(*TASKS), "the classification task (the preset sets it)"),
    Field("source", "polarity_sample", one_of("glue_tsv", "tfds", "polarity_sample"), "glue_tsv: GLUE's TSVs in "
          "data.dir; tfds: GLUE from TFDS, prepared; polarity_sample: the movie-review sentences of a wheel"),
    Field("dir", "", TEXT, "source=glue_tsv: the task's GLUE folder (SST-2/, MNLI/)"),
    TFDS_DATA_DIR,
    WHEEL_CACHE,
    Field("cache_dir", "", TEXT, "where the cached examples go; '': data.dir (glue_tsv), else data/finetune-cache"),
    Field("valid_size", 1000, integer(1, 10**8), "training examples held out as `valid` (GLUE tasks)"),
)  # fmt: skip
CONFIG_SECTIONS = {"pretrained": PRETRAINED_FIELDS, "data": DATA_FIELDS}


def get_config(preset: str = "polarity") -> ml_collections.ConfigDict:
    task, _, encoder = preset.partition(",")
    if task not in TASKS:
        raise ValueError(f"unknown fine-tuning task {task!r} in preset {preset!r}; valid: {', '.join(TASKS)}")
    arch, size = pretrain.parse_preset(encoder or "gmlp_demo")
    if arch not in pretrain.ENCODERS:
        raise ValueError(
            f"preset {preset!r}: {arch!r} is a causal language model, not an encoder to fine-tune; "
            f"valid encoders: {', '.join(pretrain.ENCODERS)}"
        )
    data = section(
        DATA_FIELDS,
        task=task,
        source="polarity_sample" if task == "polarity" else "glue_tsv",
        dir={"sst2": "data/glue/SST-2", "mnli": "data/glue/MNLI"}.get(task, ""),
    )
    config = task_config("mlm_finetune", pretrained=section(PRETRAINED_FIELDS), data=data)
    config.model = pretrain.encoder_config(arch, size)
    config.model.dropout = 0.1
    if task == "polarity":
        config.train = small_run_config(
            150, batch_size=16, learning_rate=5e-4, warmup_steps=15, weight_decay=0.01, log_every=25, eval_every=50
        )
        config.train.checkpoint_every = 150
    else:
        config.train = train_config(
            steps=20_000 if task == "mnli" else 6_000, batch_size=32, learning_rate=5e-5, schedule="cosine",
            warmup_steps=500, weight_decay=0.01, log_every=100, eval_every=1000, checkpoint_every=1000,
        )  # fmt: skip
    config.train.weight_decay_mask = "no_norm_or_bias"  # BERT's fine-tuning optimiser, as in pre-training
    config.lock()
    return config
