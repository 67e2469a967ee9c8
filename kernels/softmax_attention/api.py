"""Softmax attention, the baseline the other ops are measured against, at its best on each platform.

    s_ij = q_i·k_j / √d,   m_ij = key j visible to query i (key mask, and j ≤ i when causal)
    h_i  = Σ_j softmax_j(s_ij | m_ij) v_j        (a row with no visible key: h_i = 0)

Dropout on the attention weights (`dropout_rate`, `dropout_key`; flax's `attention_dropout_rate`) is formed block
by block inside impl "xla" (and "reference"), so training with it needs no T×T buffer either. Weight (i, j) is kept
by a function of (key, example, head, i, j) alone, whatever the blocks (kernels/numerics.py says how); kept
weights are scaled by 1/(1 − rate), the rate rounded to a multiple of 1/65,536.

Implementations (`SoftmaxAttentionOptions.impl`; docs/kernels.md):
  "reference"  dense fp32 definition (for tests).
  "xla"        blocked over keys with an online maximum and sum (Rabe & Staats 2021; FlashAttention's forward),
               memory O(T · xla_block_k), custom VJP from the saved log-sum-exp (xla.py).
  "dense"      `jax.nn.dot_product_attention(implementation="xla")`: the whole T×T score matrix.
  "cudnn"      `jax.nn.dot_product_attention(implementation="cudnn")` (GPU, bf16/fp16, head dim ≤ 128 and a
               multiple of 8); the key mask goes in as key lengths, exact for trailing padding.
  "splash"     JAX's Pallas TPU splash attention (mosaic_tpu.py); interpret mode on a CPU.
  "auto"       what `kernels.auto`'s table picks on this device generation ("cudnn" needs more than one query),
               else "xla".
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import ClassVar

import jax
import jax.numpy as jnp

from kernels.auto import pick
from kernels.blocking import causal_block_k, default_block_k
from kernels.checks import check_attention_inputs, check_block_length, check_options
from kernels.masking import zero_masked_rows
from kernels.numerics import dropout_seed
from kernels.platforms import largest_head_dim
from kernels.softmax_attention.mosaic_tpu import SplashBlockSizes, softmax_attention_splash, splash_refusal
from kernels.softmax_attention.reference import reference
from kernels.softmax_attention.xla import softmax_attention_xla

SOFTMAX_IMPLS = ("auto", "reference", "xla", "dense", "cudnn", "splash")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SoftmaxAttentionOptions:
    """`softmax_attention`'s options (module docstring for the impls).

    xla_block_k: the key-block length of impl "xla"; None: the platform's measured default
      (`kernels.blocking.XLA_BLOCK_K`: on a CPU 256, causal 128; else 512).
    splash_block_sizes: the splash kernels' tiles (`SplashBlockSizes`); None: its defaults.
    pallas_interpret: run the splash kernels in Pallas interpret mode; None: on a CPU backend only.
    """

    OP: ClassVar[str] = "softmax_attention"

    impl: str = "auto"
    xla_block_k: int | None = None
    splash_block_sizes: SplashBlockSizes | None = None
    pallas_interpret: bool | None = None

    def __post_init__(self):
        name = type(self).__name__
        if self.impl not in SOFTMAX_IMPLS:
            raise ValueError(f"{name}.impl: unknown softmax impl {self.impl!r}; valid: {', '.join(SOFTMAX_IMPLS)}")
        check_block_length(self, "xla_block_k")
        sizes = self.splash_block_sizes
        if sizes is not None and not isinstance(sizes, SplashBlockSizes):
            raise ValueError(f"{name}.splash_block_sizes: {type(sizes).__name__} are not SplashBlockSizes")
        if self.pallas_interpret is not None and not isinstance(self.pallas_interpret, bool):
            raise ValueError(f"{name}.pallas_interpret: must be True, False or None, got {self.pallas_interpret!r}")

    def plan(self, q: jax.Array, k: jax.Array, device: str | None = None, *, causal: bool) -> str:
        """The impl that runs for these inputs, in causal or full attention: `impl`, or for "auto" what
        `kernels.auto`'s table picks on `device` (a generation such as "cuda-sm90"; default: this machine's)."""
        if self.impl != "auto":
            return self.impl
        refusals = {"cudnn": lambda: cudnn_refusal(q) or ("one query" if q.shape[1] == 1 else None),
                    "splash": lambda: splash_refusal(q, k, q)}  # fmt: skip
        head_dim = largest_head_dim(q, k)
        length = k.shape[1]
        return pick(
            self.OP, causal=causal, length=length, dtype=q.dtype, head_dim=head_dim, refusals=refusals, device=device
        )

    def interpret(self) -> bool:
        return jax.default_backend() == "cpu" if self.pallas_interpret is None else self.pallas_interpret

    def block_k(self, *, causal: bool) -> int:
        """`xla_block_k`, or the platform's default for causal or non-causal attention when unset."""
        return self.xla_block_k or default_block_k(causal=causal)


def cudnn_refusal(q: jax.Array) -> str | None:
    """Why cuDNN flash attention cannot take queries like `q` (None: it can)."""
    if jnp.dtype(q.dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"cuDNN flash attention is bfloat16/float16 only, not {jnp.dtype(q.dtype).name}"
    if q.shape[-1] > 128 or q.shape[-1] % 8:
        return f"cuDNN flash attention needs a head dim ≤ 128 and a multiple of 8, not {q.shape[-1]}"
    return None


def _dense(q, k, v, key_mask, causal, implementation):
    if implementation == "cudnn":  # key lengths: exact for trailing padding
        masking = {"key_value_seq_lengths": jnp.sum(key_mask, axis=-1, dtype=jnp.int32)}
    else:
        masking = {"mask": key_mask[:, None, None, :]}
    out = jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation=implementation, **masking)
    return _zero_empty_rows(out, key_mask, causal)


def _zero_empty_rows(out, key_mask, causal):
    """Rows that see no key output 0 (JAX's dense attention averages every value there)."""
    if causal:
        seen = jnp.cumsum(key_mask, axis=1)[:, : out.shape[1]] > 0
    else:
        seen = jnp.broadcast_to(jnp.any(key_mask, axis=1, keepdims=True), out.shape[:2])
    return jnp.where(seen[:, :, None, None], out, jnp.zeros((), out.dtype))


# Public API


def softmax_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    key_mask: jax.Array | None = None,
    dropout_rate: float = 0.0,
    dropout_key: jax.Array | None = None,
    impl: str | None = None,
    options: SoftmaxAttentionOptions | None = None,
) -> jax.Array:
    """Softmax attention. q, k, v: `[batch, length, heads, head_dim]`; returns v's shape and dtype.

    Args:
      key_mask: `[batch, key_length]` bool, True = real token; None means every key is real. Impl "cudnn" reads
        it as key lengths (exact for trailing padding); a row that sees no key outputs 0 in every impl.
      dropout_rate, dropout_key: dropout on the attention weights (module docstring), with a JAX PRNG key;
        impls "xla" (which "auto" then is) and "reference" only.
      impl: the implementation (module docstring), in place of `options.impl`; None: `options.impl`.
      options: which implementation runs and how it is tiled; None: the defaults (impl "auto").
    """
    options = check_options(options, SoftmaxAttentionOptions, "softmax_attention", impl)
    check_attention_inputs(q, k, v, key_mask, causal)
    if isinstance(dropout_rate, bool) or not isinstance(dropout_rate, numbers.Real) or not 0 <= dropout_rate <= 1:
        raise ValueError(f"dropout_rate must be a number in [0, 1], got {dropout_rate!r}")
    if dropout_rate and dropout_key is None:
        raise ValueError(f"dropout_rate={dropout_rate} needs a dropout_key (a JAX PRNG key)")
    rate = float(dropout_rate)
    impl = "xla" if rate and options.impl == "auto" else options.plan(q, k, causal=causal)
    if rate and impl not in ("xla", "reference"):
        raise ValueError(f"softmax impl {impl!r} takes no dropout on the weights (dropout_rate={rate}): use 'xla'")
    if impl == "cudnn" and (refusal := cudnn_refusal(q)) is not None:
        raise ValueError(f"softmax impl 'cudnn': {refusal}")
    if impl == "splash" and (refusal := splash_refusal(q, k, v)) is not None:
        raise ValueError(f"softmax impl 'splash': {refusal}")
    k, v = zero_masked_rows(k, key_mask), zero_masked_rows(v, key_mask)
    key_mask = jnp.ones(k.shape[:2], bool) if key_mask is None else key_mask
    if rate == 1.0:  # every weight dropped (as `nnx.Dropout` at rate 1)
        return jnp.zeros((*q.shape[:3], v.shape[-1]), v.dtype)
    seed = dropout_seed(dropout_key) if rate else jnp.zeros((2,), jnp.uint32)
    if impl == "reference":
        return reference(q, k, v, key_mask, causal, seed, rate)
    if impl in ("dense", "cudnn"):
        return _dense(q, k, v, key_mask, causal, "cudnn" if impl == "cudnn" else "xla")
    if impl == "splash":
        out = softmax_attention_splash(
            q, k, v, key_mask, causal=causal, block_sizes=options.splash_block_sizes, interpret=options.interpret()
        )
        return _zero_empty_rows(out, key_mask, causal)
    block_k = causal_block_k(q, k, causal, options.block_k(causal=causal))
    return softmax_attention_xla(q, k, v, key_mask, seed, causal, block_k, rate)
