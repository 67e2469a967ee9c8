"""Linear attention with a feature map φ (docs/mixers.md), given φ(q) and φ(k).

    h_i = φ(q_i)ᵀ S_i / stab(φ(q_i)ᵀ z_i),   S_i = Σ_j m_ij φ(k_j) v_jᵀ,   z_i = Σ_j m_ij φ(k_j)

m_ij: key j is real (key mask) and, when causal, j ≤ i. Padded keys have φ(k_j) zeroed, so they add
nothing to S or z (the original LRA code forgot this).

The denominator's ε, two conventions (`eps_mode`):
  "add"    stab(x) = x + ε everywhere (Katharopoulos et al.'s fast-transformers). Harmless when φ is
           O(1) (elu+1, softplus): the denominator is ≥ T·min φ ≫ ε.
  "guard"  stab(x) = x + 2ε only where |x| ≤ ε (Performer's FAVOR+ code). FAVOR+'s stabilisers scale φ by
           exp(−max), so its denominators can be ~ε: adding ε there pulls outputs towards 0.

Implementations (`impl`; docs/kernels.md):
  "reference"   the dense fp32 definition through φ(Q)φ(K)ᵀ (reference.py; for tests).
  "xla"         non-causal two einsums; causal chunkwise with an fp32 (S | z) state (xla.py).
  "triton"      Pallas Triton kernels, any CUDA GPU; deprecated upstream from jax 0.11 (triton.py).
  "mosaic_gpu"  Pallas Mosaic GPU kernels, Hopper, chunk-parallel (mosaic_gpu.py).
  "mosaic_tpu"  Pallas Mosaic TPU kernels (mosaic_tpu.py).
  "auto"        what `kernels.auto`'s table picks on this device generation, else "xla".
The Pallas kernels run in interpret mode on a CPU.

`linear_attention_step` advances the causal state by one token: O(1) memory per generated token.
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
from jax.experimental import checkify

from kernels.checks import check_attention_inputs, check_non_negative, check_options, check_step_inputs, is_concrete
from kernels.linear_attention.mosaic_gpu import MgpuChunkSizes, linear_attention_mosaic_gpu, supported
from kernels.linear_attention.mosaic_tpu import linear_attention_mosaic_tpu
from kernels.linear_attention.reference import reference
from kernels.linear_attention.triton import LinearBlockSizes, linear_attention_triton
from kernels.linear_attention.xla import linear_attention_xla_causal, linear_attention_xla_full
from kernels.masking import zero_masked_rows
from kernels.numerics import check_eps_mode, stabilise_denominator
from kernels.options import LinearAttentionOptions
from kernels.platforms import largest_head_dim

DEFAULT_CHUNK = 64


# Which implementation runs, and the kernels


def _mgpu_sizes(options: LinearAttentionOptions) -> MgpuChunkSizes:
    """The Mosaic GPU kernels' sizes the options ask for; ValueError if they are another build's or invalid."""
    sizes = options.pallas_block_sizes
    if sizes is not None and not isinstance(sizes, MgpuChunkSizes):
        raise ValueError(f"block sizes {type(sizes).__name__} are not MgpuChunkSizes")
    return sizes or (MgpuChunkSizes(chunk=options.chunk_size) if options.chunk_size else MgpuChunkSizes())


def _mosaic_refusal(phi_q, v, options: LinearAttentionOptions, causal: bool):
    """Why the Mosaic GPU kernels cannot take these inputs (None: they can)."""

    def refusal():
        try:
            sizes = _mgpu_sizes(options)
        except ValueError as e:
            return str(e)
        return supported(phi_q, v, sizes, causal=causal)

    return refusal


def _kernels(build: str, options: LinearAttentionOptions, phi_q, phi_k, v, causal: bool, eps, eps_mode):
    """Runs the Pallas `build` (`LinearAttentionOptions.plan`). What every linear build takes: φ(q), φ(k)
    `[batch, length, heads, m]` with padded keys' rows zeroed, v `[..., d_v]`, `causal`, ε and its mode, and its
    own block-size dataclass; it returns the output `[..., d_v]` in v's dtype."""
    if build == "mosaic_gpu":
        sizes = _mgpu_sizes(options)
        return linear_attention_mosaic_gpu(
            phi_q, phi_k, v, causal=causal, eps=eps, eps_mode=eps_mode, block_sizes=sizes
        )
    sizes = options.block_sizes_for(build)
    if build == "mosaic_tpu":
        interpret = options.tpu_interpret()
        return linear_attention_mosaic_tpu(
            phi_q, phi_k, v, causal=causal, eps=eps, eps_mode=eps_mode, block_sizes=sizes, interpret=interpret
        )
    if sizes is None and options.chunk_size:
        sizes = LinearBlockSizes(chunk=options.chunk_size)
    return linear_attention_triton(
        phi_q, phi_k, v, causal=causal, eps=eps, eps_mode=eps_mode, block_sizes=sizes,
        backend=options.triton_platform(), interpret=options.interpret(),
    )  # fmt: skip


def _check_eps(eps, eps_mode: str, op: str) -> None:
    """ε > 0 and finite (it keeps the denominator off 0), and its mode."""
    check_eps_mode(eps_mode)
    if isinstance(eps, numbers.Real) and not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"{op} eps={eps!r} must be a finite number > 0 (it keeps the denominator off 0)")
    if not is_concrete(eps):  # a traced ε: checked under jax.experimental.checkify
        checkify.debug_check(jnp.isfinite(eps) & (eps > 0), f"{op} eps={{e}} must be a finite number > 0", e=eps)


# Public API


def linear_attention(
    phi_q: jax.Array,
    phi_k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    key_mask: jax.Array | None = None,
    eps: float = 1e-6,
    eps_mode: str = "add",
    impl: str | None = None,
    options: LinearAttentionOptions | None = None,
) -> jax.Array:
    """Linear attention over non-negative features. phi_q, phi_k: `[batch, length, heads, m]`; v: `[..., d_v]`.

    φ must be non-negative (elu+1, softplus, FAVOR+'s exp features): with negative features the
    denominator can reach 0 and the output is meaningless. "reference" checks it on concrete inputs.

    Returns v's shape and dtype. `eps_mode`: how ε enters the denominator (module docstring). `options`: which
    implementation runs and how it is chunked and tiled (`kernels.options`); None: the defaults (impl "auto").
    `impl`: the implementation (module docstring), in place of `options.impl`; None: `options.impl`.
    """
    options = check_options(options, LinearAttentionOptions, "linear_attention", impl)
    check_attention_inputs(phi_q, phi_k, v, key_mask, causal, linear=True)
    _check_eps(eps, eps_mode, "linear_attention")
    refusal = _mosaic_refusal(phi_q, v, options, causal)
    impl = options.plan(phi_k.shape[1], refusal, causal=causal, dtype=v.dtype, head_dim=largest_head_dim(phi_q, v))
    phi_k, v = zero_masked_rows(phi_k, key_mask), zero_masked_rows(v, key_mask)
    # φ must be non-negative: checked wherever the inputs are concrete (a negative feature gives any impl a
    # denominator near 0 and garbage out); the reference refuses NaN too, the others let it reach the output.
    check_non_negative("phi_q", phi_q, nan_passes=impl != "reference")
    check_non_negative("phi_k", phi_k, nan_passes=impl != "reference")
    if impl == "reference":
        return reference(phi_q, phi_k, v, causal, eps, eps_mode)
    if impl != "xla":
        if not is_concrete(eps):
            raise ValueError(f"linear_attention impl={impl!r} compiles eps into its kernels: give it as a number")
        return _kernels(impl, options, phi_q, phi_k, v, causal, eps, eps_mode)
    if not causal:
        return linear_attention_xla_full(phi_q, phi_k, v, eps, eps_mode)
    return linear_attention_xla_causal(phi_q, phi_k, v, eps, eps_mode, options.chunk_size or DEFAULT_CHUNK)


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
    φ must be non-negative, as for `linear_attention` (checked where the inputs are concrete).
    """
    check_step_inputs(state, phi_q, phi_k, v, key_mask)
    _check_eps(eps, eps_mode, "linear_attention_step")
    s, z = state
    if key_mask is not None:
        phi_k = jnp.where(key_mask[:, None, None], phi_k, jnp.zeros((), phi_k.dtype))
    check_non_negative("phi_q", phi_q, nan_passes=True)  # as the xla impl: NaN reaches the output
    check_non_negative("phi_k", phi_k, nan_passes=True)  # a padded token's features are never used
    kf = phi_k.astype(jnp.float32)
    s = s + jnp.einsum("bhm,bhd->bhmd", kf, v.astype(jnp.float32))
    z = z + kf
    qf = phi_q.astype(jnp.float32)
    num = jnp.einsum("bhm,bhmd->bhd", qf, s)
    den = jnp.einsum("bhm,bhm->bh", qf, z)[..., None]
    return (s, z), (num / stabilise_denominator(den, eps, eps_mode)).astype(v.dtype)
