"""Learning-rate schedules and the AdamW optimiser built from `config.train`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import optax

SCHEDULES = ("rsqrt", "cosine", "constant")


def make_schedule(train: ml_collections.ConfigDict) -> optax.Schedule:
    base, warmup = train.learning_rate, max(int(train.warmup_steps), 0)
    if train.schedule == "rsqrt":
        # The LRA code's constant * linear_warmup * rsqrt_decay, with the optimiser's step count from 0 as
        # there (its first update has lr 0) — also fairseq's inverse_sqrt with warmup_init_lr 0 when
        # learning_rate is fairseq's lr · √warmup (docs/presets.md).
        def rsqrt(step):
            s = jnp.asarray(step, jnp.float32)
            w = float(max(warmup, 1))
            return base * jnp.minimum(1.0, s / w) * jnp.sqrt(1.0 / jnp.maximum(s, w))

        return rsqrt
    if train.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, base, warmup, max(int(train.steps), warmup + 1), 0.0)
    if train.schedule == "constant":
        return optax.join_schedules([optax.linear_schedule(0.0, base, warmup), optax.constant_schedule(base)], [warmup])
    raise ValueError(f"config field train.schedule={train.schedule!r} is unknown; valid: {', '.join(SCHEDULES)}")


# train.weight_decay_mask: which parameters AdamW decays.
#   "all"              every parameter (the LRA code; fairseq) but those below;
#   "no_norm_or_bias"  also not LayerNorm/RMSNorm parameters nor biases (BERT's AdamWeightDecay, which
#                      excludes names containing "LayerNorm", "layer_norm" or "bias").
# Never decayed: ReLUFormer's per-head temperature (log γ) and the SGU's spatial bias (initialised to 1 on
# purpose): decay would pull them to γ = 1 / a zero gate whatever the data says.
WEIGHT_DECAY_MASKS = ("all", "no_norm_or_bias")
NEVER_DECAYED = frozenset({"log_gamma", "spatial_bias"})


def key_name(key) -> str:
    """A pytree path entry as text: a dict key, an attribute name or a sequence index."""
    return str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key))))


def decays(path: tuple[str, ...], mask: str) -> bool:
    """Whether the parameter at `path` (module names down to the parameter's) is decayed under `mask`."""
    if mask not in WEIGHT_DECAY_MASKS:
        raise ValueError(
            f"config field train.weight_decay_mask={mask!r} is unknown; valid: {', '.join(WEIGHT_DECAY_MASKS)}"
        )
    name = path[-1]
    if name in NEVER_DECAYED:
        return False
    if mask == "no_norm_or_bias":
        in_norm = any("norm" in part.lower() for part in path[:-1]) or name == "scale"
        return not (in_norm or "bias" in name)
    return True


def weight_decay_mask(mask: str):
    """optax's `mask` argument: parameters → a tree of bools (True = decay)."""

    def leaf_path(path) -> tuple[str, ...]:
        names = tuple(map(key_name, path))
        return names[:-1] if names and names[-1] == "value" else names  # an nnx Variable's value attribute

    def tree(params):
        return jax.tree_util.tree_map_with_path(lambda path, _: decays(leaf_path(path), mask), params)

    return tree


def make_optimizer(train: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """AdamW with optional global-norm clipping; the learning rate follows `make_schedule`."""
    chain = []
    if train.grad_clip_norm:
        chain.append(optax.clip_by_global_norm(train.grad_clip_norm))
    chain.append(
        optax.adamw(
            make_schedule(train), b1=train.b1, b2=train.b2, eps=train.eps, weight_decay=train.weight_decay,
            mask=weight_decay_mask(train.weight_decay_mask),
        )
    )  # fmt: skip
    return optax.chain(*chain)
