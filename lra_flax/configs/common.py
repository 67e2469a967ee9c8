"""Config pieces every LRA task shares: the LRA code's optimiser and schedule, and the sections around them."""

from __future__ import annotations

import ml_collections

from zoo.config_fields import section
from zoo.models import model_config
from zoo.training import task_config, train_config

# The LRA code read for these presets: google-research/long-range-arena at commit cd31e5c (docs/presets.md,
# "lra_code vs the LRA code"; tests/lra_flax/test_lra_code_presets.py cites file and line per field).
LRA_CODE_COMMIT = "cd31e5c6b8e5bceabd28de2d2afb23f7ae5d36d8"


def lra_code_model(**fields) -> ml_collections.ConfigDict:
    """The LRA code's Transformer encoder (models/transformer/transformer.py, layers/common_layers.py): softmax
    attention without q/k/v/out biases and with dropout on its weights, pre-LN, an MLP Dense → GELU (tanh) →
    Dense with xavier_uniform kernels and N(0, 1e-6²) biases. `fields`: the task's sizes and rates (qkv_dim,
    attention_dropout, ...); other mixers by override (`--config.model.mixer=relu`)."""
    block = dict(mixer="softmax", attention_bias=False, ffn="gelu", ffn_init="xavier_uniform", norm="pre")
    return model_config(**{**block, **fields})


def lra_code_train(*, steps: int, warmup_steps: int) -> ml_collections.ConfigDict:
    """AdamW (β2 0.98, ε 1e-9, weight decay 0.1), lr 0.05 with linear warmup then rsqrt decay, no gradient
    clipping (the text tasks' train.py clips nothing)."""
    return train_config(
        steps=steps,
        batch_size=32,
        learning_rate=0.05,
        schedule="rsqrt",
        warmup_steps=warmup_steps,
        weight_decay=0.1,
        b2=0.98,
        eps=1e-9,
        grad_clip_norm=0.0,
        log_every=100,
        eval_every=1000,
        checkpoint_every=1000,
    )


def byte_level_demo(config: ml_collections.ConfigDict, *, steps: int) -> None:
    """Text's and Retrieval's demo model and training, sized for 2 CPU cores: T² attention at 512 bytes costs
    ~1.5 s a step there, so 256 bytes; mean pooling, because a [CLS] token stayed at chance for the first 300
    steps of such a short run."""
    config.model = model_config(
        mixer="relu", num_layers=2, d_model=64, num_heads=4, mlp_dim=128, max_length=256, dropout=0.1
    )
    config.model.pooling = "mean"
    config.train = train_config(
        steps=steps,
        batch_size=32,
        learning_rate=2e-3,
        schedule="cosine",
        warmup_steps=steps // 10,
        weight_decay=0.01,
        log_every=50,
        eval_every=0,
        checkpoint_every=steps // 2,
        eval_batch_size=128,
    )


def base_config(task: str, label: str, preset: str, presets: tuple[str, ...], data_fields) -> ml_collections.ConfigDict:
    """task, seed, mesh and the data section; the task's config adds model and train. An unknown preset is refused,
    naming the task by `label`."""
    if preset not in presets:
        raise ValueError(f"unknown {label} preset {preset!r}; valid presets: {', '.join(presets)}")
    return task_config(task, data=section(data_fields))
