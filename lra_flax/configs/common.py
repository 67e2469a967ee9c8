"""Config pieces every LRA task shares: the LRA code's optimiser and schedule, and the sections around them."""

from __future__ import annotations

import ml_collections

from zoo.training import mesh_config, train_config


def lra_code_train(*, steps: int, warmup_steps: int, batch_size: int = 32) -> ml_collections.ConfigDict:
    """AdamW (β2 0.98, ε 1e-9, weight decay 0.1), lr 0.05 with linear warmup then rsqrt decay (SPEC §3)."""
    return train_config(
        steps=steps,
        batch_size=batch_size,
        learning_rate=0.05,
        schedule="rsqrt",
        warmup_steps=warmup_steps,
        weight_decay=0.1,
        b2=0.98,
        eps=1e-9,
        log_every=100,
        eval_every=1000,
        checkpoint_every=1000,
    )


def base_config(task: str) -> ml_collections.ConfigDict:
    """task, seed and mesh; the task's config adds data, model and train."""
    config = ml_collections.ConfigDict()
    config.task = task
    config.seed = 0
    config.mesh = mesh_config()
    return config


def check_preset(preset: str, presets: tuple[str, ...], task: str) -> None:
    if preset not in presets:
        raise ValueError(f"unknown {task} preset {preset!r}; valid presets: {', '.join(presets)}")
