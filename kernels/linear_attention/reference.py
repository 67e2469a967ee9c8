"""Linear attention by its definition: dense, float32, through the T×T matrix φ(Q)φ(K)ᵀ (for tests, and the
reference every other impl is compared with; docs/mixers.md)."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from kernels.numerics import stabilise_denominator


def reference(phi_q, phi_k, v, causal, eps, eps_mode):
    f32 = jnp.float32
    a = jnp.einsum("bqhm,bkhm->bhqk", phi_q.astype(f32), phi_k.astype(f32), precision=lax.Precision.HIGHEST)
    if causal:
        t = phi_q.shape[1]
        a = jnp.where(jnp.tril(jnp.ones((t, t), bool)), a, 0.0)
    num = jnp.einsum("bhqk,bkhd->bqhd", a, v.astype(f32), precision=lax.Precision.HIGHEST)
    den = a.sum(-1).transpose(0, 2, 1)[..., None]
    return (num / stabilise_denominator(den, eps, eps_mode)).astype(v.dtype)
