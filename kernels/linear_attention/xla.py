"""Linear attention in plain jnp (impl "xla").

Non-causal: two einsums. Causal: chunkwise — an fp32 state (S | z) carried across chunks by `lax.scan`, the
intra-chunk part a masked C×C product; a ones column appended to v gives S and z from one matmul. Memory O(T·C)
forward and backward; JAX differentiates it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from kernels.numerics import stabilise_denominator


def _with_ones(v):
    """[v | 1]: one matmul then yields both S (numerator) and z (normaliser)."""
    return jnp.concatenate([v, jnp.ones((*v.shape[:-1], 1), v.dtype)], axis=-1)


def _split_num_den(acc, eps, eps_mode, dtype):
    return (acc[..., :-1] / stabilise_denominator(acc[..., -1:], eps, eps_mode)).astype(dtype)


def linear_attention_xla_full(phi_q, phi_k, v, eps, eps_mode):
    va = _with_ones(v)
    if jax.default_backend() == "cpu":  # XLA:CPU has no bf16 x bf16 -> f32 dot for this contraction
        phi_k, va = phi_k.astype(jnp.float32), va.astype(jnp.float32)
    state = jnp.einsum("bkhm,bkhd->bhmd", phi_k, va, preferred_element_type=jnp.float32)
    acc = jnp.einsum("bqhm,bhmd->bqhd", phi_q.astype(jnp.float32), state)
    return _split_num_den(acc, eps, eps_mode, v.dtype)


def linear_attention_xla_causal(phi_q, phi_k, v, eps, eps_mode, chunk):
    b, t, h, m = phi_q.shape
    c = min(chunk, t)
    n = -(-t // c)
    pad = n * c - t
    va = _with_ones(v)
    if pad:  # padded positions have φ = 0: they add nothing and their outputs are dropped
        padding = ((0, 0), (0, pad), (0, 0), (0, 0))
        phi_q, phi_k, va = jnp.pad(phi_q, padding), jnp.pad(phi_k, padding), jnp.pad(va, padding)

    def chunks(x):  # [B, n·C, H, X] → [n, B, H, C, X]
        return x.reshape(b, n, c, h, x.shape[-1]).transpose(1, 0, 3, 2, 4)

    causal_mask = jnp.tril(jnp.ones((c, c), bool))

    def body(state, xs):
        q_c, k_c, v_c = xs
        inter = jnp.einsum("bhcm,bhmd->bhcd", q_c.astype(jnp.float32), state)
        scores = jnp.einsum("bhcm,bhkm->bhck", q_c, k_c, preferred_element_type=jnp.float32)
        scores = jnp.where(causal_mask, scores, 0.0)
        intra = jnp.einsum("bhck,bhkd->bhcd", scores.astype(v_c.dtype), v_c, preferred_element_type=jnp.float32)
        state = state + jnp.einsum("bhkm,bhkd->bhmd", k_c, v_c, preferred_element_type=jnp.float32)
        return state, inter + intra

    state0 = jnp.zeros((b, h, m, va.shape[-1]), jnp.float32)
    _, acc = lax.scan(body, state0, (chunks(phi_q), chunks(phi_k), chunks(va)))
    acc = acc.transpose(1, 0, 3, 2, 4).reshape(b, n * c, h, va.shape[-1])[:, :t]
    return _split_num_den(acc, eps, eps_mode, v.dtype)
