"""Learning-rate schedules and the AdamW optimiser built from `config.train`."""

from __future__ import annotations

import jax.numpy as jnp
import ml_collections
import optax

SCHEDULES = ("rsqrt", "cosine", "constant")


def make_schedule(train: ml_collections.ConfigDict) -> optax.Schedule:
    base, warmup = train.learning_rate, max(int(train.warmup_steps), 0)
    if train.schedule == "rsqrt":
        # LRA: constant * linear_warmup * rsqrt_decay (step counted from 1, as in the LRA code).
        def rsqrt(step):
            s = jnp.asarray(step, jnp.float32) + 1.0
            w = float(max(warmup, 1))
            return base * jnp.minimum(1.0, s / w) * jnp.sqrt(1.0 / jnp.maximum(s, w))

        return rsqrt
    if train.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, base, warmup, max(int(train.steps), warmup + 1), 0.0)
    if train.schedule == "constant":
        return optax.join_schedules([optax.linear_schedule(0.0, base, warmup), optax.constant_schedule(base)], [warmup])
    raise ValueError(f"config field train.schedule={train.schedule!r} is unknown; valid: {', '.join(SCHEDULES)}")


def make_optimizer(train: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """AdamW with optional global-norm clipping; the learning rate follows `make_schedule`."""
    chain = []
    if train.grad_clip_norm:
        chain.append(optax.clip_by_global_norm(train.grad_clip_norm))
    chain.append(
        optax.adamw(make_schedule(train), b1=train.b1, b2=train.b2, eps=train.eps, weight_decay=train.weight_decay)
    )
    return optax.chain(*chain)
