"""Loss functions with the trainer's signature: (model, batch, rngs, train) → (objective_sum, metric sums).

Sums (not means) let the trainer average exactly over padded batches, processes and micro-batches.
Every metric dict has `loss` and `count`; the trainer reports `loss/count` and `accuracy = correct/count`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx


def classification_loss(label_smoothing: float = 0.0, input_fields: tuple[str, ...] = ("inputs",)):
    """Cross-entropy of `model(*batch[input_fields])` against `batch['targets']`, weighted by `batch['weights']`;
    label smoothing in training only. Evaluation also counts each predicted class (`predictions`: a collapsed
    classifier shows)."""

    def loss_fn(model: nnx.Module, batch: dict, rngs: nnx.Rngs | None, train: bool):
        logits = model(*(batch[name] for name in input_fields), rngs=rngs)
        num_classes = logits.shape[-1]
        targets = jax.nn.one_hot(batch["targets"], num_classes)
        if train and label_smoothing:
            targets = targets * (1.0 - label_smoothing) + label_smoothing / num_classes
        ce = optax.softmax_cross_entropy(logits, targets)
        w = batch["weights"].astype(jnp.float32)
        predicted = jnp.argmax(logits, -1)
        correct = (predicted == batch["targets"]).astype(jnp.float32)
        loss_sum = jnp.sum(ce * w)
        sums = {"loss": loss_sum, "correct": jnp.sum(correct * w), "count": jnp.sum(w)}
        if not train:
            sums["predictions"] = jnp.sum(jax.nn.one_hot(predicted, num_classes) * w[:, None], axis=0)
        return loss_sum, sums

    return loss_fn


def token_cross_entropy(
    logits: jax.Array, targets: jax.Array, weights: jax.Array, *, label_smoothing: float = 0.0
) -> tuple[jax.Array, dict]:
    """Per-token cross-entropy summed over positions with weight > 0 (translation, masked LM): logits `[..., vocab]`,
    targets and weights `[...]` → (objective sum, metric sums). Label smoothing applies to the objective only, not to
    the reported `loss`; `count` is the number of scored tokens."""
    w = weights.astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    objective = ce
    if label_smoothing:
        smooth = optax.softmax_cross_entropy(logits, jnp.full(logits.shape, 1.0 / logits.shape[-1], logits.dtype))
        objective = (1.0 - label_smoothing) * ce + label_smoothing * smooth
    loss_sum = jnp.sum(ce * w)
    correct = jnp.sum((jnp.argmax(logits, -1) == targets) * w)
    sums = {"loss": loss_sum, "log_perplexity": loss_sum, "correct": correct, "count": jnp.sum(w)}
    return jnp.sum(objective * w), sums
