"""Loss functions with the trainer's signature: (model, batch, rngs, train) → (objective_sum, metric sums).

Sums (not means) let the trainer average exactly over padded batches, processes and micro-batches.
Every metric dict has `loss` and `count`; the trainer reports `loss/count` and `accuracy = correct/count`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx


def classification_loss(label_smoothing: float = 0.0):
    """Cross-entropy on `batch['inputs']` → `batch['targets']`, weighted by `batch['weights']`.

    Label smoothing applies in training only; evaluation reports the plain cross-entropy.
    """

    def loss_fn(model: nnx.Module, batch: dict, rngs: nnx.Rngs | None, train: bool):
        logits = model(batch["inputs"], rngs=rngs)
        num_classes = logits.shape[-1]
        targets = jax.nn.one_hot(batch["targets"], num_classes)
        if train and label_smoothing:
            targets = targets * (1.0 - label_smoothing) + label_smoothing / num_classes
        ce = optax.softmax_cross_entropy(logits, targets)
        w = batch["weights"].astype(jnp.float32)
        correct = (jnp.argmax(logits, -1) == batch["targets"]).astype(jnp.float32)
        loss_sum = jnp.sum(ce * w)
        return loss_sum, {"loss": loss_sum, "correct": jnp.sum(correct * w), "count": jnp.sum(w)}

    return loss_fn
