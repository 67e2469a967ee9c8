"""The ReLU family (docs/mixers.md): ReLUFormer, ReLA and ReLU/L attention.

ReLUFormer: ReLU scores scaled by 1/(γ_h √(n_i/2)), with a normalisation and an entropy regulariser
computed in training only (a module in `.eval()` mode skips them) and sown, already weighted, as
`AuxLoss`; the trainer adds them to the task loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

import kernels
from zoo.config_fields import BOOLEAN, Field, above, at_least, in_range
from zoo.layers.common import AuxLoss, collects_aux_loss
from zoo.mixers.attention import MultiHeadMixer
from zoo.mixers.registry import IMPL_OPTION, register

_EPS = 1e-6


def relu_regularisers(row_sum, row_xlogx, counts, query_mask, margin):
    """(L_norm, L_ent) from per-row sums S_i, Σ a log a `[batch, length, heads]` and visible counts n_i
    `[batch, length]`, averaged over real rows."""
    s = row_sum + _EPS
    entropy = -row_xlogx / s + (row_sum / s) * jnp.log(s)
    l_norm = jnp.abs(jnp.log(s))
    l_ent = jnp.maximum(entropy - margin * jnp.log(jnp.maximum(counts, 2.0))[..., None], 0.0)
    w = jnp.broadcast_to(query_mask[..., None], row_sum.shape).astype(jnp.float32)
    denom = jnp.maximum(w.sum(), 1.0)
    return (l_norm * w).sum() / denom, (l_ent * w).sum() / denom


class ReLUAttention(MultiHeadMixer):
    """ReLUFormer attention."""

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        log_gamma = jnp.full((self.num_heads,), jnp.log(cfg.gamma_init), jnp.float32)
        # γ is log-parameterised so it stays positive; a fixed γ is kept out of the trainable params.
        variable = nnx.Param if cfg.gamma_learnable else nnx.Variable
        self.log_gamma = variable(log_gamma, logical_axes=("heads",))
        self.row_scale = "sqrt_half" if cfg.variance_reduction else "none"
        self.norm_loss_weight = cfg.norm_loss_weight
        self.entropy_loss_weight = cfg.entropy_loss_weight
        self.entropy_margin = cfg.entropy_margin
        self.options = kernels.ReluAttentionOptions(impl=cfg.impl)
        self.deterministic = False  # set by .eval(); regularisers are training-only

    def attend(self, q, k, v, mask, causal):
        gamma = jnp.exp(self.log_gamma[...])
        opts = dict(causal=causal, key_mask=mask, gamma=gamma, row_scale=self.row_scale, options=self.options)
        regularised = not self.deterministic and (self.norm_loss_weight or self.entropy_loss_weight)
        if not regularised or not collects_aux_loss(
            self, f"mixer {self.name!r}: norm_loss_weight / entropy_loss_weight"
        ):
            return kernels.relu_attention(q, k, v, **opts)
        # The regularisers' row statistics come out of the same pass as the output (on the GPU kernels).
        out, row_sum, row_xlogx = kernels.relu_attention_and_row_stats(q, k, v, **opts)
        keys = jnp.ones(k.shape[:2], bool) if mask is None else mask
        counts = kernels.visible_key_counts(keys, causal=causal, q_length=q.shape[1])
        # Real query rows: the key mask for self-attention, every row for cross-attention.
        real = keys if q.shape[1] == k.shape[1] else jnp.ones(q.shape[:2], bool)
        l_norm, l_ent = relu_regularisers(row_sum, row_xlogx, counts, real, self.entropy_margin)
        self.sow(AuxLoss, "relu_regularisers", self.norm_loss_weight * l_norm + self.entropy_loss_weight * l_ent)
        return out


class ReLUPerLength(MultiHeadMixer):
    """ReLU/L (Wortsman et al. 2023): a_ij = ReLU(s_ij) / L, L the row's visible-key count."""

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        self.options = kernels.ReluAttentionOptions(impl=cfg.impl)

    def attend(self, q, k, v, mask, causal):
        return kernels.relu_attention(q, k, v, causal=causal, key_mask=mask, row_scale="count", options=self.options)


class RMSNormGate(nnx.Module):
    """ReLA's output stabiliser on merged heads: g ⊙ RMSNorm(o) ⊙ σ(w ⊙ o), g initialised to ones."""

    def __init__(self, d: int, *, eps: float, dtype):
        self.eps = eps
        self.scale = nnx.Param(jnp.ones((d,), jnp.float32))
        self.gate = nnx.Param(jnp.ones((d,), jnp.float32))
        self.dtype = dtype

    def __call__(self, o: jax.Array) -> jax.Array:
        of = o.astype(jnp.float32)
        normed = of * jax.lax.rsqrt(jnp.mean(of * of, axis=-1, keepdims=True) + self.eps)
        return (self.scale[...] * normed * jax.nn.sigmoid(self.gate[...] * of)).astype(self.dtype)


class ReLA(MultiHeadMixer):
    """ReLA (Zhang, Titov & Sennrich 2021): A = ReLU(q·k/√d)·mask (rows may be all zero), then the gate."""

    def __init__(self, cfg, *, rngs: nnx.Rngs):
        super().__init__(cfg, rngs=rngs)
        self.options = kernels.ReluAttentionOptions(impl=cfg.impl)
        self.gate = RMSNormGate(self.num_heads * self.head_dim, eps=cfg.rms_norm_eps, dtype=self.dtype)

    def attend(self, q, k, v, mask, causal):
        return kernels.relu_attention(q, k, v, causal=causal, key_mask=mask, row_scale="none", options=self.options)

    def combine(self, o):
        return self.gate(o)


RELU_OPTIONS = (
    Field("variance_reduction", True, BOOLEAN, "divide by √(n_i/2) (False: the paper's non-converging ablation)"),
    Field("gamma_init", 1.0, above(0), "initial per-head scale γ (the paper does not publish it)"),
    Field("gamma_learnable", True, BOOLEAN, "train γ (False: fixed at gamma_init)"),
    Field("norm_loss_weight", 0.0, at_least(0), "λ_norm of the normalisation regulariser (the paper's is unknown)"),
    Field("entropy_loss_weight", 0.0, at_least(0), "λ_ent of the entropy regulariser"),
    Field("entropy_margin", 0.7, in_range(0, 1), "C of the entropy regulariser (from the one public implementation)"),
    IMPL_OPTION,
)


register("relu", ReLUAttention, RELU_OPTIONS)
register("relu_l", ReLUPerLength, (IMPL_OPTION,))
# RMSNorm ε 1e-8 as in the ReLA reference code (Zhang, Titov & Sennrich); the paper does not give it.
register(
    "rela", ReLA, (IMPL_OPTION, Field("rms_norm_eps", 1e-8, above(0), "ε of ReLA's RMSNorm over the heads' outputs"))
)
