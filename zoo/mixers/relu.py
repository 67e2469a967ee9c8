"""ReLUFormer attention (SPEC §1.2): ReLU scores scaled by 1/(γ_h √(n_i/2)), with its two regularisers.

The regularisers are computed in training only (a module in `.eval()` mode skips them) and sown,
already weighted, as `AuxLoss`; the trainer adds them to the task loss.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

import kernels
from zoo.layers.common import AuxLoss
from zoo.mixers.attention import MultiHeadMixer
from zoo.mixers.registry import register

_EPS = 1e-6


def relu_regularisers(row_sum, row_xlogx, counts, query_mask, margin):
    """(L_norm, L_ent) from per-row sums S_i, Σ a log a and visible counts n_i, averaged over real rows.

    row_sum, row_xlogx: `[batch, length, heads]`; counts, query_mask: `[batch, length]`.
    """
    s = row_sum + _EPS
    entropy = -row_xlogx / s + (row_sum / s) * jnp.log(s)
    l_norm = jnp.abs(jnp.log(s))
    l_ent = jnp.maximum(entropy - margin * jnp.log(jnp.maximum(counts, 2.0))[..., None], 0.0)
    w = jnp.broadcast_to(query_mask[..., None], row_sum.shape).astype(jnp.float32)
    denom = jnp.maximum(w.sum(), 1.0)
    return (l_norm * w).sum() / denom, (l_ent * w).sum() / denom


class ReLUAttention(MultiHeadMixer):
    def __init__(self, cfg, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        if cfg.gamma_init <= 0:
            raise ValueError(f"mixer 'relu': gamma_init must be positive, got {cfg.gamma_init}")
        log_gamma = jnp.full((self.num_heads,), jnp.log(cfg.gamma_init), jnp.float32)
        # γ is log-parameterised so it stays positive; a fixed γ is kept out of the trainable params.
        self.log_gamma = nnx.Param(log_gamma) if cfg.gamma_learnable else nnx.Variable(log_gamma)
        self.variance_reduction = cfg.variance_reduction
        self.norm_loss_weight = cfg.norm_loss_weight
        self.entropy_loss_weight = cfg.entropy_loss_weight
        self.entropy_margin = cfg.entropy_margin
        self.impl = cfg.impl
        self.deterministic = False  # set by .eval(); regularisers are training-only

    def attend(self, q, k, v, mask, causal):
        gamma = jnp.exp(self.log_gamma[...])
        opts = dict(causal=causal, key_mask=mask, gamma=gamma, row_scale="sqrt_half" if self.variance_reduction else "none")
        out = kernels.relu_attention(q, k, v, impl=self.impl, **opts)
        if not self.deterministic and (self.norm_loss_weight or self.entropy_loss_weight):
            row_sum, row_xlogx = kernels.relu_attention_row_stats(q, k, impl=self.impl, **opts)
            real = jnp.ones(q.shape[:2], bool) if mask is None else mask
            counts = kernels.visible_key_counts(real, causal=causal)
            l_norm, l_ent = relu_regularisers(row_sum, row_xlogx, counts, real, self.entropy_margin)
            self.sow(AuxLoss, "relu_regularisers", self.norm_loss_weight * l_norm + self.entropy_loss_weight * l_ent)
        return out


def _options() -> dict:
    return {
        "variance_reduction": True,  # False: the paper's non-converging ablation
        "gamma_init": 1.0,  # the paper does not publish γ
        "gamma_learnable": True,
        "norm_loss_weight": 0.0,  # λ_norm; the paper's value is unknown
        "entropy_loss_weight": 0.0,  # λ_ent
        "entropy_margin": 0.7,  # C, from the one public implementation
        "impl": "auto",
    }


register("relu", ReLUAttention, _options)
