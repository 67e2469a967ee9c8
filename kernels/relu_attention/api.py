"""ReLU attention with ReLUFormer's variance-reduction factor (docs/mixers.md).

    s_ij = q_i·k_j / √d
    m_ij = 1 if key j is visible to query i (key mask, and j ≤ i when causal)
    n_i  = max(1, Σ_j m_ij)
    a_ij = m_ij · ReLU(s_ij) / (γ_h · √(n_i / 2))
    h_i  = Σ_j a_ij v_j

`row_scale` swaps √(n_i/2) for n_i (ReLU/L, Wortsman et al. 2023) or 1 (ReLA; the ablation).

Implementations (`impl`, as `jax.nn.dot_product_attention`'s `implementation`; docs/kernels.md):
  "reference"   the dense fp32 definition (reference.py; for tests).
  "xla"         blocked over keys in jnp, custom VJP; no T×T buffer (xla.py).
  "triton"      Pallas Triton kernels, any CUDA GPU; deprecated upstream from jax 0.11 (triton.py).
  "mosaic_gpu"  Pallas Mosaic GPU kernels, Hopper (mosaic_gpu.py).
  "mosaic_tpu"  Pallas Mosaic TPU kernels (mosaic_tpu.py).
  "auto"        what `kernels.auto`'s table picks on this device generation, else "xla".
The Pallas kernels run in interpret mode on a CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels.blocking import causal_block_k
from kernels.checks import check_attention_inputs, check_options, check_positive
from kernels.masking import zero_masked_rows
from kernels.options import ReluAttentionOptions
from kernels.platforms import largest_head_dim
from kernels.relu_attention.mosaic_gpu import MgpuBlockSizes, default_block_sizes, relu_attention_mosaic_gpu, supported
from kernels.relu_attention.mosaic_tpu import relu_attention_mosaic_tpu
from kernels.relu_attention.reference import ROW_SCALES, mask_factor, reference, reference_row_stats
from kernels.relu_attention.triton import relu_attention_triton
from kernels.relu_attention.xla import relu_attention_xla, row_stats


def _prepare(q, k, v, key_mask, gamma, causal, row_scale, impl, options, *, fused_row_stats=False, plan=True):
    """Checks the inputs; returns (options, the impl that runs, k, v with padded keys' rows zeroed, the bool key
    mask, γ per head `[heads]` float32)."""
    options = check_options(options, ReluAttentionOptions, "relu_attention", impl)
    check_attention_inputs(q, k, v, key_mask, causal)
    if row_scale not in ROW_SCALES:
        raise ValueError(f"unknown row_scale {row_scale!r}; valid: {', '.join(ROW_SCALES)}")
    h = q.shape[2]
    if (gshape := jnp.shape(gamma)) not in ((), (1,), (h,)):
        raise ValueError(f"gamma must be a scalar or have shape [heads]=({h},), got {gshape}")
    check_positive("gamma", gamma)
    impl = options.impl
    if plan:
        refusal = _mosaic_refusal(q, k, v, options, causal, fused_row_stats)
        impl = options.plan(k.shape[1], refusal, causal=causal, dtype=v.dtype, head_dim=largest_head_dim(q, v))
    k, v = zero_masked_rows(k, key_mask), zero_masked_rows(v, key_mask)
    key_mask = jnp.ones(k.shape[:2], dtype=bool) if key_mask is None else key_mask.astype(bool)
    gamma_h = jnp.broadcast_to(jnp.asarray(gamma, jnp.float32).reshape(-1), (h,))
    return options, impl, k, v, key_mask, gamma_h


# Which implementation runs, and the kernels


def _mosaic_refusal(q, k, v, options: ReluAttentionOptions, causal: bool, fused_row_stats: bool = False):
    """Why the Mosaic GPU kernels cannot take these inputs (None: they can)."""

    def refusal():
        sizes = options.pallas_block_sizes
        if fused_row_stats:
            return "the row statistics come out of the Triton forward kernel only"
        if sizes is not None and not isinstance(sizes, MgpuBlockSizes):
            return f"block sizes {type(sizes).__name__} are for other kernels"
        return supported(q, k, v, sizes or default_block_sizes(max(q.shape[-1], v.shape[-1])), causal)

    return refusal


def _kernels(build: str, options: ReluAttentionOptions, q, k, v, key_mask, factor, causal: bool, row_stats=False):
    """Runs the Pallas `build` (`ReluAttentionOptions.plan`). What every ReLU build takes: q, k, v
    `[batch, length, heads, dim]` with padded keys' rows zeroed, key_mask `[batch, key_length]` bool, the row
    factor 1/(γ_h r(n_i)) `[batch, heads, q_length]` float32 (differentiable: dγ flows through it), `causal`, and
    its own block-size dataclass; it returns Σ_j factor_i · ReLU(q_i·k_j/√d) · m_ij · v_j in v's dtype. With
    `row_stats` (Triton only) also Σ_j p_ij and Σ_j p_ij log p_ij of the unscaled p, `[batch, heads, q_length]`."""
    sizes = options.block_sizes_for(build)
    if build == "mosaic_gpu":  # Hopper kernels (MgpuBlockSizes.backward picks the backward)
        return relu_attention_mosaic_gpu(q, k, v, key_mask, factor, causal=causal, block_sizes=sizes)
    if build == "mosaic_tpu":
        return relu_attention_mosaic_tpu(
            q, k, v, key_mask, factor, causal=causal, block_sizes=sizes, interpret=options.tpu_interpret()
        )
    return relu_attention_triton(
        q, k, v, key_mask, factor, causal=causal, block_sizes=sizes, backend=options.triton_platform(),
        interpret=options.interpret(), row_stats=row_stats,
    )  # fmt: skip


def _attend(q, k, v, key_mask, gamma_h, causal, row_scale, options: ReluAttentionOptions, impl):
    """The output by `impl` ("reference", "xla" or a Pallas build), on `_prepare`d inputs."""
    if impl == "reference":
        return reference(q, k, v, key_mask, gamma_h, causal, row_scale)
    if impl == "xla":
        block_k = causal_block_k(q, k, causal, options.block_k(causal=causal))
        return relu_attention_xla(q, k, v, key_mask, gamma_h, causal, row_scale, block_k)
    factor = mask_factor(key_mask, gamma_h, causal, row_scale, q.shape[1])  # differentiable: dγ flows through it
    return _kernels(impl, options, q, k, v, key_mask, factor, causal)


def _row_stats(q, k, key_mask, gamma_h, causal, row_scale, impl, block_k):
    """(S_i, E_i) `[batch, q_length, heads]` on prepared inputs: dense for "reference", else key-blocked XLA."""
    if impl == "reference":
        return reference_row_stats(q, k, key_mask, gamma_h, causal, row_scale)
    return row_stats(q, k, key_mask, gamma_h, causal, row_scale, block_k)


# Public API


def relu_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    key_mask: jax.Array | None = None,
    gamma: jax.Array | float = 1.0,
    row_scale: str = "sqrt_half",
    impl: str | None = None,
    options: ReluAttentionOptions | None = None,
) -> jax.Array:
    """ReLU attention (docs/mixers.md). q, k, v: `[batch, length, heads, head_dim]`; returns v's shape and dtype.

    Args:
      key_mask: `[batch, key_length]` bool, True = real token; None means every key is real.
      gamma: scalar or `[heads]`, the per-head temperature γ_h (positive).
      row_scale: "sqrt_half" divides row i by √(n_i/2) (ReLUFormer); "count" by n_i (ReLU/L);
        "none" by 1 (ReLA, and ReLUFormer's non-converging ablation).
      impl: the implementation (module docstring), in place of `options.impl`; None: `options.impl`.
      options: which implementation runs and how it is tiled (`kernels.options`); None: the defaults (impl "auto").
    """
    options, impl, k, v, key_mask, gamma_h = _prepare(q, k, v, key_mask, gamma, causal, row_scale, impl, options)
    return _attend(q, k, v, key_mask, gamma_h, causal, row_scale, options, impl)


def relu_attention_row_stats(
    q: jax.Array,
    k: jax.Array,
    *,
    causal: bool = False,
    key_mask: jax.Array | None = None,
    gamma: jax.Array | float = 1.0,
    row_scale: str = "sqrt_half",
    impl: str | None = None,
    options: ReluAttentionOptions | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Row sums S_i = Σ_j a_ij and E_i = Σ_j a_ij log a_ij, each `[batch, q_length, heads]` float32.

    These are what ReLUFormer's normalisation and entropy regularisers need (the entropy of
    p = a / (S + ε) is −E/(S+ε) + S/(S+ε)·log(S+ε)). Every impl but "reference" recomputes each key block of
    the XLA impl under `jax.checkpoint`, so neither forward nor backward holds the T×T matrix. Arguments as
    `relu_attention`.
    """
    options, impl, k, _, key_mask, gamma_h = _prepare(
        q, k, k, key_mask, gamma, causal, row_scale, impl, options, plan=False
    )
    return _row_stats(q, k, key_mask, gamma_h, causal, row_scale, impl, options.block_k(causal=causal))


def relu_attention_and_row_stats(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    key_mask: jax.Array | None = None,
    gamma: jax.Array | float = 1.0,
    row_scale: str = "sqrt_half",
    impl: str | None = None,
    options: ReluAttentionOptions | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`relu_attention`'s output and `relu_attention_row_stats`' (S_i, E_i), `[batch, q_length, heads]`.

    With the Triton kernels (impl "triton", or "pallas" with pallas_backend "gpu", which picks them here on Hopper
    too; interpret mode on a CPU) the forward kernel accumulates Σ_j p_ij and Σ_j p_ij log p_ij of the unscaled
    p = ReLU(s)·m in the pass that computes the output, and the backward kernels take their cotangents: no second
    T² pass. With a row factor f_i > 0, S_i = f_i Σ p and E_i = Σ f p log(f p) = f_i (log f_i · Σ p + Σ p log p).
    Other impls (and the TPU and Mosaic GPU kernels) compute the two separately. Arguments as `relu_attention`.
    """
    options, impl, k, v, key_mask, gamma_h = _prepare(
        q, k, v, key_mask, gamma, causal, row_scale, impl, options, fused_row_stats=True
    )
    if impl != "triton":
        out = _attend(q, k, v, key_mask, gamma_h, causal, row_scale, options, impl)
        return out, *_row_stats(q, k, key_mask, gamma_h, causal, row_scale, impl, options.block_k(causal=causal))
    factor = mask_factor(key_mask, gamma_h, causal, row_scale, q.shape[1])
    out, p_sum, p_xlogx = _kernels(impl, options, q, k, v, key_mask, factor, causal, row_stats=True)
    row_sum = factor * p_sum
    row_xlogx = factor * (jnp.log(factor) * p_sum + p_xlogx)
    return out, row_sum.transpose(0, 2, 1), row_xlogx.transpose(0, 2, 1)
