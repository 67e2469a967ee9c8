"""Linear attention with a feature map φ (docs/mixers.md), given φ(q) and φ(k).

    h_i = φ(q_i)ᵀ S_i / stab(φ(q_i)ᵀ z_i),   S_i = Σ_j m_ij φ(k_j) v_jᵀ,   z_i = Σ_j m_ij φ(k_j)

m_ij: key j is real (key mask) and, when causal, j ≤ i. Padded keys have φ(k_j) zeroed, so they add
nothing to S or z (the original LRA code forgot this).

The denominator's ε, two conventions (`eps_mode`):
  "add"    stab(x) = x + ε everywhere (Katharopoulos et al.'s fast-transformers). Harmless when φ is
           O(1) (elu+1, softplus): the denominator is ≥ T·min φ ≫ ε.
  "guard"  stab(x) = x + 2ε only where |x| ≤ ε (Performer's FAVOR+ code). FAVOR+'s stabilisers scale φ by
           exp(−max), so its denominators can be ~ε: adding ε there pulls outputs towards 0.

Implementations (`LinearAttentionOptions.impl`, kernels/options.py):
  "reference"  dense fp32 definition through the T×T matrix φ(Q)φ(K)ᵀ (for tests).
  "xla"        non-causal: two einsums. Causal: chunkwise — an fp32 state (S | z) carried across chunks
               by `lax.scan`, the intra-chunk part a masked C×C product; a ones column appended to v
               gives S and z from one matmul. Memory O(T·C) forward and backward.
  "pallas"     one program per (batch, head) scanning chunks, custom VJP with a forward scan for dφ(q)
               and a reverse scan for dφ(k), dv: `linear_attention_tpu` (Mosaic) for TPU,
               `linear_attention_pallas` (Triton) for GPU; interpret mode on CPU. `linear_attention_mgpu`
               (Mosaic GPU, Hopper) is chunk-parallel instead.
  "auto"       "pallas" where `kernels/kernel_passes.json` records that these kernels passed their tests on
               this device class (and jax minor) and beat "xla" from this length on; "xla" everywhere else
               (`kernels.platforms`).

`linear_attention_step` advances the causal state by one token: O(1) memory per generated token.
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
from jax import lax

from kernels.checks import (
    check_causal,
    check_floating,
    check_key_mask,
    check_lengths,
    check_non_negative,
    check_options,
)
from kernels.linear_attention_mgpu import MgpuChunkSizes, linear_attention_mgpu, supported
from kernels.linear_attention_pallas import LinearBlockSizes, linear_attention_pallas
from kernels.linear_attention_tpu import linear_attention_tpu
from kernels.masking import zero_masked_rows
from kernels.numerics import check_eps_mode, stabilise_denominator
from kernels.options import LinearAttentionOptions
from kernels.platforms import largest_head_dim

DEFAULT_CHUNK = 64


def _check(phi_q, phi_k, v, key_mask, causal):
    check_causal(causal)
    check_key_mask(key_mask)
    if phi_q.ndim != 4 or phi_k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"phi_q, phi_k, v must be [batch, length, heads, dim]; got shapes {phi_q.shape}, {phi_k.shape}, {v.shape}"
        )
    check_floating(phi_q=phi_q, phi_k=phi_k, v=v)
    check_lengths(query_length=phi_q.shape[1], key_length=phi_k.shape[1], feature_dim=phi_q.shape[-1])
    if phi_k.shape[:3] != v.shape[:3]:
        raise ValueError(f"phi_k shape {phi_k.shape} does not match v shape {v.shape} (batch, length, heads)")
    if phi_q.shape[0] != phi_k.shape[0] or phi_q.shape[2:] != phi_k.shape[2:]:
        raise ValueError(f"phi_q shape {phi_q.shape} does not match phi_k shape {phi_k.shape} (batch, heads, dim)")
    if key_mask is not None and key_mask.shape != phi_k.shape[:2]:
        raise ValueError(f"key_mask shape {key_mask.shape} must be [batch, key_length] = {phi_k.shape[:2]}")
    if causal and phi_q.shape[1] != phi_k.shape[1]:
        raise ValueError(
            f"causal linear attention needs equal query and key lengths, got {phi_q.shape[1]}, {phi_k.shape[1]}"
        )


def _reference(phi_q, phi_k, v, causal, eps, eps_mode):
    f32 = jnp.float32
    a = jnp.einsum("bqhm,bkhm->bhqk", phi_q.astype(f32), phi_k.astype(f32), precision=lax.Precision.HIGHEST)
    if causal:
        t = phi_q.shape[1]
        a = jnp.where(jnp.tril(jnp.ones((t, t), bool)), a, 0.0)
    num = jnp.einsum("bhqk,bkhd->bqhd", a, v.astype(f32), precision=lax.Precision.HIGHEST)
    den = a.sum(-1).transpose(0, 2, 1)[..., None]
    return (num / stabilise_denominator(den, eps, eps_mode)).astype(v.dtype)


def _with_ones(v):
    """[v | 1]: one matmul then yields both S (numerator) and z (normaliser)."""
    return jnp.concatenate([v, jnp.ones((*v.shape[:-1], 1), v.dtype)], axis=-1)


def _split_num_den(acc, eps, eps_mode, dtype):
    return (acc[..., :-1] / stabilise_denominator(acc[..., -1:], eps, eps_mode)).astype(dtype)


def _xla_noncausal(phi_q, phi_k, v, eps, eps_mode):
    va = _with_ones(v)
    if jax.default_backend() == "cpu":  # XLA:CPU has no bf16 x bf16 -> f32 dot for this contraction
        phi_k, va = phi_k.astype(jnp.float32), va.astype(jnp.float32)
    state = jnp.einsum("bkhm,bkhd->bhmd", phi_k, va, preferred_element_type=jnp.float32)
    acc = jnp.einsum("bqhm,bhmd->bqhd", phi_q.astype(jnp.float32), state)
    return _split_num_den(acc, eps, eps_mode, v.dtype)


def _xla_causal(phi_q, phi_k, v, eps, eps_mode, chunk):
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


# ----------------------------------------------------------------------------------------------
# Which implementation runs, and the kernels
# ----------------------------------------------------------------------------------------------


def _mgpu_sizes(options: LinearAttentionOptions) -> MgpuChunkSizes:
    """The Mosaic GPU kernels' sizes the options ask for; ValueError if they are another build's or invalid."""
    sizes = options.pallas_block_sizes
    if sizes is not None:
        if not isinstance(sizes, MgpuChunkSizes):
            raise ValueError(f"block sizes {type(sizes).__name__} are not MgpuChunkSizes")
        return sizes
    return MgpuChunkSizes(chunk=options.chunk_size) if options.chunk_size else MgpuChunkSizes()


def _mosaic_refusal(phi_q, v, options: LinearAttentionOptions, causal: bool):
    """Why the Mosaic GPU kernels cannot take these inputs (None: they can)."""

    def refusal():
        try:
            sizes = _mgpu_sizes(options)
        except ValueError as e:
            return str(e)
        return supported(phi_q, v, sizes, causal=causal)

    return refusal


def _kernels(backend: str, options: LinearAttentionOptions, phi_q, phi_k, v, causal: bool, eps, eps_mode):
    """Runs the kernels `backend` names (`LinearAttentionOptions.plan`). What every linear backend takes: φ(q), φ(k)
    `[batch, length, heads, m]` with padded keys' rows zeroed, v `[..., d_v]`, `causal`, ε and its mode, and its
    own block-size dataclass; it returns the output `[..., d_v]` in v's dtype."""
    if backend == "mosaic_gpu":
        sizes = _mgpu_sizes(options)
        return linear_attention_mgpu(phi_q, phi_k, v, causal=causal, eps=eps, eps_mode=eps_mode, block_sizes=sizes)
    sizes = options.block_sizes_for(backend)
    interpret = options.interpret()
    if backend == "tpu":
        return linear_attention_tpu(
            phi_q, phi_k, v, causal=causal, eps=eps, eps_mode=eps_mode, block_sizes=sizes, interpret=interpret
        )
    if sizes is None and options.chunk_size:
        sizes = LinearBlockSizes(chunk=options.chunk_size)
    return linear_attention_pallas(
        phi_q, phi_k, v, causal=causal, eps=eps, eps_mode=eps_mode, block_sizes=sizes, backend=backend,
        interpret=interpret,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------


def linear_attention(
    phi_q: jax.Array,
    phi_k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    key_mask: jax.Array | None = None,
    eps: float = 1e-6,
    eps_mode: str = "add",
    options: LinearAttentionOptions | None = None,
) -> jax.Array:
    """Linear attention over non-negative features. phi_q, phi_k: `[batch, length, heads, m]`; v: `[..., d_v]`.

    φ must be non-negative (elu+1, softplus, FAVOR+'s exp features): with negative features the
    denominator can reach 0 and the output is meaningless. "reference" checks it on concrete inputs.

    Returns v's shape and dtype. `eps_mode`: how ε enters the denominator (module docstring). `options`: which
    implementation runs and how it is chunked and tiled (`kernels.options`); None: the defaults (impl "auto").
    """
    options = check_options(options, LinearAttentionOptions, "linear_attention")
    _check(phi_q, phi_k, v, key_mask, causal)
    check_eps_mode(eps_mode)
    if isinstance(eps, numbers.Real) and not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"linear_attention eps={eps!r} must be a finite number > 0 (it keeps the denominator off 0)")
    impl, backend = options.plan(
        phi_k.shape[1],
        _mosaic_refusal(phi_q, v, options, causal),
        causal=causal,
        dtype=v.dtype,
        head_dim=largest_head_dim(phi_q, v),
    )
    phi_k, v = zero_masked_rows(phi_k, key_mask), zero_masked_rows(v, key_mask)
    # φ must be non-negative: checked wherever the inputs are concrete (a negative feature gives any impl a
    # denominator near 0 and garbage out); the reference refuses NaN too, the others let it reach the output.
    check_non_negative("phi_q", phi_q, nan_passes=impl != "reference")
    check_non_negative("phi_k", phi_k, nan_passes=impl != "reference")
    if impl == "reference":
        return _reference(phi_q, phi_k, v, causal, eps, eps_mode)
    if impl == "pallas":
        return _kernels(backend, options, phi_q, phi_k, v, causal, eps, eps_mode)
    if not causal:
        return _xla_noncausal(phi_q, phi_k, v, eps, eps_mode)
    return _xla_causal(phi_q, phi_k, v, eps, eps_mode, options.chunk_size or DEFAULT_CHUNK)


def linear_attention_init_state(
    batch: int, heads: int, feature_dim: int, value_dim: int
) -> tuple[jax.Array, jax.Array]:
    """The empty causal state (S `[batch, heads, m, d_v]`, z `[batch, heads, m]`), float32."""
    return (
        jnp.zeros((batch, heads, feature_dim, value_dim), jnp.float32),
        jnp.zeros((batch, heads, feature_dim), jnp.float32),
    )


def linear_attention_step(
    state: tuple[jax.Array, jax.Array],
    phi_q: jax.Array,
    phi_k: jax.Array,
    v: jax.Array,
    *,
    key_mask: jax.Array | None = None,
    eps: float = 1e-6,
    eps_mode: str = "add",
) -> tuple[tuple[jax.Array, jax.Array], jax.Array]:
    """One causal token: adds φ(k) vᵀ and φ(k) to (S, z), then reads out φ(q). Inputs `[batch, heads, dim]`.

    key_mask `[batch]` (False: the token is padding and leaves the state unchanged). Returns (state, out).
    """
    s, z = state
    if key_mask is not None:
        phi_k = jnp.where(key_mask[:, None, None], phi_k, jnp.zeros((), phi_k.dtype))
    kf = phi_k.astype(jnp.float32)
    s = s + jnp.einsum("bhm,bhd->bhmd", kf, v.astype(jnp.float32))
    z = z + kf
    qf = phi_q.astype(jnp.float32)
    num = jnp.einsum("bhm,bhmd->bhd", qf, s)
    den = jnp.einsum("bhm,bhm->bh", qf, z)[..., None]
    return (s, z), (num / stabilise_denominator(den, eps, eps_mode)).astype(v.dtype)
