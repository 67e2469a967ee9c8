"""Softmax attention, the baseline the other ops are measured against, at its best on each platform.

    s_ij = q_i·k_j / √d,   m_ij = key j visible to query i (key mask, and j ≤ i when causal)
    h_i  = Σ_j softmax_j(s_ij | m_ij) v_j        (a row with no visible key: h_i = 0)

Dropout on the attention weights (`dropout_rate`, `dropout_key`; training): h_i = Σ_j a_ij z_ij / (1 − rate) v_j,
z_ij kept with probability 1 − rate — flax's `attention_dropout_rate`, formed block by block inside impl "xla" (and
"reference"), so training with it needs no T×T buffer either. z_ij is a function of (key, example, head, i, j)
alone, the same whatever the blocks (`keep_mask`): 16 random bits decide each weight (the rate is rounded to
1/65,536), a quarter of a Threefry hash. The loop over key blocks forms the next block's decisions, one hash for
four weights, and carries them packed four to a byte (`keep_bits`); the query-tiled causal path forms each weight's
where it is used (kernels/numerics.py says why).

Implementations (`SoftmaxAttentionOptions.impl`):
  "reference"  dense fp32 definition (for tests).
  "xla"        blocked over keys with an online maximum and sum (Rabe & Staats 2021, "Self-attention does not need
               O(n²) memory"; the forward of FlashAttention): memory O(T · xla_block_k), as the ReLU and linear
               ops' "xla" impls; a custom VJP recomputes each block's scores from the saved log-sum-exp, five
               matmuls a block. Causal self-attention is tiled over queries too (`kernels.blocking`): the work is
               the lower triangle plus the diagonal blocks.
  "dense"      `jax.nn.dot_product_attention(implementation="xla")`: XLA's fused softmax over the whole T×T
               score matrix (what the zoo ran before this op existed).
  "cudnn"      `jax.nn.dot_product_attention(implementation="cudnn")`: cuDNN flash attention (GPU, bf16/fp16,
               head dim ≤ 128 and a multiple of 8). The key mask goes in as per-example key lengths, which is
               exact for padding at the end of the sequence (every task here pads so).
  "splash"     JAX's Pallas TPU splash attention (`kernels.softmax_attention_tpu`); interpret mode on a CPU.
  "auto"       "cudnn" on a GPU where cuDNN takes the inputs and there is more than one query; "splash" on a TPU
               where `kernels/kernel_passes.json` records it passing on this device class (a kernel that only
               lowered has not run); "xla" everywhere else.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax import lax

from kernels.blocking import (
    block_causal,
    block_scores,
    causal_block_k,
    default_block_k,
    key_blocks,
    lower_triangle_gradients,
    pad_rows,
    unblock,
    visible,
)
from kernels.checks import check_attention_inputs, check_options
from kernels.masking import zero_masked_rows
from kernels.numerics import (
    VALUES_PER_HASH,
    dropout_keep_bits,
    dropout_levels,
    dropout_seed,
    keep_scale,
    keep_threshold,
    unpack_keep_bits,
)
from kernels.platforms import auto_pallas_backend, largest_head_dim
from kernels.softmax_attention_tpu import SplashBlockSizes, softmax_attention_splash, splash_refusal

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
        block = self.xla_block_k
        if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 1):
            raise ValueError(f"{name}.xla_block_k: must be a positive whole number or None, got {block!r}")
        sizes = self.splash_block_sizes
        if sizes is not None and not isinstance(sizes, SplashBlockSizes):
            raise ValueError(f"{name}.splash_block_sizes: {type(sizes).__name__} are not SplashBlockSizes")
        if self.pallas_interpret is not None and not isinstance(self.pallas_interpret, bool):
            raise ValueError(f"{name}.pallas_interpret: must be True, False or None, got {self.pallas_interpret!r}")

    def plan(self, q: jax.Array, k: jax.Array, backend: str | None = None, *, causal: bool) -> str:
        """The impl that runs for these inputs on `backend` (default: the running one's), in causal or full
        attention."""
        if self.impl != "auto":
            return self.impl
        backend = backend or jax.default_backend()
        if backend == "gpu" and q.shape[1] > 1 and cudnn_refusal(q) is None:
            return "cudnn"
        if backend == "tpu":
            head_dim = largest_head_dim(q, k)
            if auto_pallas_backend(self.OP, k.shape[1], {}, causal=causal, dtype=q.dtype, head_dim=head_dim) == "tpu":
                return "splash"
        return "xla"

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


# ----------------------------------------------------------------------------------------------
# Reference and JAX's own
# ----------------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------------
# Dropout on the attention weights
# ----------------------------------------------------------------------------------------------


def keep_mask(seed, rate: float, heads: int, q_length: int, batch: int, rows, col_start, num_cols: int) -> jax.Array:
    """Which weights dropout keeps: bool `[batch, heads, len(rows), num_cols]` for query positions `rows` and the
    keys from `col_start`. Weight (b, h, i, j) takes quarter j % 4 of the hash of (its row's number, j // 4): the
    same wherever a block starts."""
    column = (col_start + jnp.arange(num_cols)).astype(jnp.uint32)
    row_id = _row_numbers(heads, q_length, batch, rows)
    return dropout_levels(seed, row_id, column >> 2, column & 3) >= jnp.uint32(keep_threshold(rate))


def keep_bits(seed, rate: float, heads: int, q_length: int, batch: int, rows, col_start, num_cols: int) -> jax.Array:
    """`keep_mask` of the same weights packed four to a byte, uint8 `[batch, heads, len(rows), num_cols // 4]`
    (`kernels.numerics.unpack_keep_bits` reads it back); `col_start` and `num_cols` multiples of 4."""
    group = (col_start // VALUES_PER_HASH + jnp.arange(num_cols // VALUES_PER_HASH)).astype(jnp.uint32)
    return dropout_keep_bits(seed, rate, _row_numbers(heads, q_length, batch, rows), group)


def _row_numbers(heads: int, q_length: int, batch: int, rows) -> jax.Array:
    """The hash counter of each (example, head, query row): uint32 `[batch, heads, len(rows), 1]`."""
    row_id = (jnp.arange(batch)[:, None, None] * heads + jnp.arange(heads)[None, :, None]) * q_length
    return (row_id + rows[None, None, :]).astype(jnp.uint32)[..., None]


def _reference(q, k, v, key_mask, causal, seed=None, rate=0.0):
    qf, kf = q.astype(jnp.float32), k.astype(jnp.float32)
    s = jnp.einsum("bqhd,bkhd->bhqk", qf, kf, precision=lax.Precision.HIGHEST) / jnp.sqrt(float(q.shape[-1]))
    vis = visible(key_mask, jnp.arange(q.shape[1]), jnp.arange(k.shape[1]), causal)
    s = jnp.where(vis, s, -jnp.inf)
    row_max = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.where(vis, jnp.exp(s - jnp.where(jnp.isfinite(row_max), row_max, 0.0)), 0.0)
    total = p.sum(-1, keepdims=True)
    a = p / jnp.where(total > 0, total, 1.0)
    if rate:
        b, tq, h, _ = q.shape
        keep = keep_mask(seed, rate, h, tq, b, jnp.arange(tq), 0, k.shape[1])
        a = jnp.where(keep, a * keep_scale(rate), 0.0)
    out = jnp.einsum("bhqk,bkhd->bqhd", a, v.astype(jnp.float32), precision=lax.Precision.HIGHEST)
    return out.astype(v.dtype)


def _dense(q, k, v, key_mask, causal, implementation):
    if implementation == "cudnn":  # key lengths: exact for trailing padding
        lengths = jnp.sum(key_mask, axis=-1, dtype=jnp.int32)
        out = jax.nn.dot_product_attention(
            q, k, v, key_value_seq_lengths=lengths, is_causal=causal, implementation="cudnn"
        )
    else:
        out = jax.nn.dot_product_attention(
            q, k, v, mask=key_mask[:, None, None, :], is_causal=causal, implementation="xla"
        )
    return _zero_empty_rows(out, key_mask, causal)


def _zero_empty_rows(out, key_mask, causal):
    """Rows that see no key output 0 (JAX's dense attention averages every value there)."""
    if causal:
        seen = jnp.cumsum(key_mask, axis=1)[:, : out.shape[1]] > 0
    else:
        seen = jnp.broadcast_to(jnp.any(key_mask, axis=1, keepdims=True), out.shape[:2])
    return jnp.where(seen[:, :, None, None], out, jnp.zeros((), out.dtype))


# ----------------------------------------------------------------------------------------------
# Blocked XLA: an online maximum and sum over key blocks, custom VJP from the log-sum-exp
# ----------------------------------------------------------------------------------------------

_NO_KEY = -jnp.inf  # the running maximum of a row that has seen no visible key yet


def _online_block(carry, s, vis, vj, keep=None, scale=1.0):
    """Folds one key block into a row's running (maximum, sum of exp, Σ exp·v); `keep`: the block's dropout
    mask (the sum of exp is over every weight, the values' sum over the kept ones, scaled)."""
    row_max, row_sum, acc = carry
    block_max = jnp.max(jnp.where(vis, s, _NO_KEY), axis=-1)
    new_max = jnp.maximum(row_max, block_max)
    safe_max = jnp.where(jnp.isfinite(new_max), new_max, 0.0)  # −∞ − −∞ would be NaN
    p = jnp.where(vis, jnp.exp(s - safe_max[..., None]), 0.0)
    rescale = jnp.exp(jnp.where(jnp.isfinite(row_max), row_max, safe_max) - safe_max)
    kept = p if keep is None else jnp.where(keep, p * scale, 0.0)
    pv = jnp.einsum("bhqk,bhkd->bhqd", kept.astype(vj.dtype), vj, preferred_element_type=jnp.float32)
    return new_max, row_sum * rescale + p.sum(-1), acc * rescale[..., None] + pv


def _finish(carry):
    """(output `[B, H, rows, d_v]` float32, log-sum-exp `[B, H, rows]`; +∞ for a row with no visible key)."""
    row_max, row_sum, acc = carry
    seen = row_sum != 0  # a row that saw a key has sum ≥ 1; NaN (a NaN input) stays NaN, as in the reference
    out = jnp.where(seen[..., None], acc / jnp.where(seen, row_sum, 1.0)[..., None], 0.0)
    return out, jnp.where(seen, row_max + jnp.log(jnp.where(seen, row_sum, 1.0)), jnp.inf)


def _start(shape_rows, d_v):
    b, h, rows = shape_rows
    return (
        jnp.full((b, h, rows), _NO_KEY, jnp.float32),
        jnp.zeros((b, h, rows), jnp.float32),
        jnp.zeros((b, h, rows, d_v), jnp.float32),
    )


def _block_keep(seed, rate, q, rows, col_start, bk):
    """The dropout mask of one tile, or None without dropout."""
    if not rate:
        return None
    b, tq, h, _ = q.shape
    return keep_mask(seed, rate, h, tq, b, rows, col_start, bk)


def _key_loop_bits(seed, rate, q, bk):
    """For a loop over key blocks of `bk` keys and every query row: the function giving block j's packed dropout
    decisions, or None where there is no dropout or `bk` is not a multiple of 4. Each iteration forms the next
    block's decisions and carries them (numerics.py says why)."""
    if not rate or bk % VALUES_PER_HASH:
        return None
    b, tq, h, _ = q.shape
    return lambda j: keep_bits(seed, rate, h, tq, b, jnp.arange(tq), j * bk, bk)


def _iteration_keep(block_bits, bits, seed, rate, q, j, bk):
    """Inside the key loop: (block j's dropout mask or None, what to carry to block j + 1)."""
    if block_bits is None:
        return _block_keep(seed, rate, q, jnp.arange(q.shape[1]), j * bk, bk), None
    return unpack_keep_bits(bits), block_bits(j + 1)


def _xla_forward(q, k, v, key_mask, seed, causal, block_k, rate):
    """(output `[B, T, H, d_v]` in v's dtype, log-sum-exp `[B, H, T]` float32)."""
    b, tq, h, _ = q.shape
    kb, vb, mb, bk, nb = key_blocks(k, v, key_mask, block_k)
    qh = q.transpose(0, 2, 1, 3)
    scale = keep_scale(rate)
    if block_causal(q, k, causal, block_k):  # query block i meets key blocks j ≤ i only
        qp = pad_rows(qh, nb * bk)
        outs, lses = [], []
        for i in range(nb):
            rows = qp[:, :, i * bk : (i + 1) * bk]
            carry = _start((b, h, bk), v.shape[-1])
            for j in range(i + 1):
                s, vis = block_scores(rows, kb[j], mb[j], j, bk, j == i, q_offset=i * bk)
                keep = _block_keep(seed, rate, q, i * bk + jnp.arange(bk), j * bk, bk)
                carry = _online_block(carry, s, vis, vb[j], keep, scale)
            out_i, lse_i = _finish(carry)
            outs.append(out_i)
            lses.append(lse_i)
        out, lse = jnp.concatenate(outs, axis=2)[:, :, :tq], jnp.concatenate(lses, axis=2)[:, :, :tq]
    else:
        block_bits = _key_loop_bits(seed, rate, q, bk)

        def body(carry, xs):
            state, bits = carry
            kj, vj, mj, j = xs
            s, vis = block_scores(qh, kj, mj, j, bk, causal)
            keep, next_bits = _iteration_keep(block_bits, bits, seed, rate, q, j, bk)
            return (_online_block(state, s, vis, vj, keep, scale), next_bits), None

        start = (_start((b, h, tq), v.shape[-1]), None if block_bits is None else block_bits(0))
        (carry, _), _ = lax.scan(body, start, (kb, vb, mb, jnp.arange(nb)))
        out, lse = _finish(carry)
    return out.transpose(0, 2, 1, 3).astype(v.dtype), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _xla(q, k, v, key_mask, seed, causal, block_k, rate):
    return _xla_forward(q, k, v, key_mask, seed, causal, block_k, rate)[0]


def _xla_fwd(q, k, v, key_mask, seed, causal, block_k, rate):
    out, lse = _xla_forward(q, k, v, key_mask, seed, causal, block_k, rate)
    return out, (q, k, v, key_mask, seed, out, lse)


def _xla_bwd(causal, block_k, rate, residuals, d_out):
    """Per key block: p = exp(s − lse), dV += (p ⊙ z)ᵀ dO, dP = (dO Vᵀ) ⊙ z, dS = p ⊙ (dP − Δ), dQ += dS K/√d,
    dK += dSᵀ Q/√d, with Δ_i = dO_i · O_i (z: the dropout mask, scaled; 1 without) — five matmuls a block."""
    q, k, v, key_mask, seed, out, lse = residuals
    b, tq, h, d = q.shape
    scale = 1.0 / jnp.sqrt(float(d))
    kept_scale = keep_scale(rate)
    kb, vb, mb, bk, nb = key_blocks(k, v, key_mask, block_k)
    qh, do = q.transpose(0, 2, 1, 3), d_out.transpose(0, 2, 1, 3)
    # q and dO once more with the query axis last, so that dKᵀ and dVᵀ are [d, q] @ [q, k] products, which XLA:CPU
    # hands to its matmul library rather than Eigen (kernels/relu_attention.py measured the same change).
    q_t, do_t = q.transpose(0, 2, 3, 1), d_out.transpose(0, 2, 3, 1)
    delta = jnp.einsum("bqhd,bqhd->bhq", d_out.astype(jnp.float32), out.astype(jnp.float32))

    def tile(qr, qr_t, dor, dor_t, lse_r, delta_r, kj, vj, mj, j, q_offset, causal, keep):
        s, vis = block_scores(qr, kj, mj, j, bk, causal, q_offset=q_offset)
        p = jnp.where(vis, jnp.exp(s - lse_r[..., None]), 0.0)
        kept = p if keep is None else jnp.where(keep, p * kept_scale, 0.0)
        dv_t = jnp.einsum("bhdq,bhqk->bhdk", dor_t, kept.astype(dor.dtype), preferred_element_type=jnp.float32)
        dp = jnp.einsum("bhqd,bhkd->bhqk", dor, vj, preferred_element_type=jnp.float32)
        if keep is not None:
            dp = jnp.where(keep, dp * kept_scale, 0.0)
        ds = (p * (dp - delta_r[..., None]) * scale).astype(q.dtype)
        dq_rows = jnp.einsum("bhqk,bhkd->bhqd", ds, kj, preferred_element_type=jnp.float32)
        dk_t = jnp.einsum("bhdq,bhqk->bhdk", qr_t, ds, preferred_element_type=jnp.float32)
        return dq_rows, dk_t, dv_t  # dK and dV transposed, [B, H, d, bk]

    if block_causal(q, k, causal, block_k):  # tiles (i, j) with query block i ≥ key block j only
        rows = nb * bk
        qp, dop = pad_rows(qh, rows), pad_rows(do, rows)
        qp_t, dop_t = pad_rows(q_t, rows, axis=3), pad_rows(do_t, rows, axis=3)
        lsep, deltap = pad_rows(lse, rows), pad_rows(delta, rows)  # padded rows: do = 0, so they add nothing

        def causal_tile(i, j):
            r = slice(i * bk, (i + 1) * bk)
            rows_i = (qp[:, :, r], qp_t[..., r], dop[:, :, r], dop_t[..., r], lsep[:, :, r], deltap[:, :, r])
            keep = _block_keep(seed, rate, q, i * bk + jnp.arange(bk), j * bk, bk)
            return tile(*rows_i, kb[j], vb[j], mb[j], j, i * bk, j == i, keep)

        dq, dk_b, dv_b = lower_triangle_gradients(nb, tq, causal_tile)
    else:
        block_bits = _key_loop_bits(seed, rate, q, bk)

        def body(carry, xs):
            dq, bits = carry
            kj, vj, mj, j = xs
            keep, next_bits = _iteration_keep(block_bits, bits, seed, rate, q, j, bk)
            dq_rows, dk_j, dv_j = tile(qh, q_t, do, do_t, lse, delta, kj, vj, mj, j, 0, causal, keep)
            return (dq + dq_rows, next_bits), (dk_j, dv_j)

        start = (jnp.zeros((b, h, tq, d), jnp.float32), None if block_bits is None else block_bits(0))
        (dq, _), (dk_b, dv_b) = lax.scan(body, start, (kb, vb, mb, jnp.arange(nb)))
    tk = k.shape[1]
    return (
        dq.transpose(0, 2, 1, 3).astype(q.dtype),
        unblock(jnp.swapaxes(dk_b, -1, -2), tk).astype(k.dtype),
        unblock(jnp.swapaxes(dv_b, -1, -2), tk).astype(v.dtype),
        None,
        None,
    )


_xla.defvjp(_xla_fwd, _xla_bwd)


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------


def softmax_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    causal: bool = False,
    key_mask: jax.Array | None = None,
    dropout_rate: float = 0.0,
    dropout_key: jax.Array | None = None,
    options: SoftmaxAttentionOptions | None = None,
) -> jax.Array:
    """Softmax attention. q, k, v: `[batch, length, heads, head_dim]`; returns v's shape and dtype.

    Args:
      key_mask: `[batch, key_length]` bool, True = real token; None means every key is real. Impl "cudnn" reads
        it as key lengths (exact for trailing padding); a row that sees no key outputs 0 in every impl.
      dropout_rate, dropout_key: dropout on the attention weights (module docstring), with a JAX PRNG key;
        impls "xla" (which "auto" then is) and "reference" only.
      options: which implementation runs and how it is tiled; None: the defaults (impl "auto").
    """
    options = check_options(options, SoftmaxAttentionOptions, "softmax_attention")
    check_attention_inputs(q, k, v, key_mask, causal)
    rate = _check_dropout(dropout_rate, dropout_key)
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
        return _reference(q, k, v, key_mask, causal, seed, rate)
    if impl in ("dense", "cudnn"):
        return _dense(q, k, v, key_mask, causal, "cudnn" if impl == "cudnn" else "xla")
    if impl == "splash":
        out = softmax_attention_splash(
            q, k, v, key_mask, causal=causal, block_sizes=options.splash_block_sizes, interpret=options.interpret()
        )
        return _zero_empty_rows(out, key_mask, causal)
    return _xla(q, k, v, key_mask, seed, causal, causal_block_k(q, k, causal, options.block_k(causal=causal)), rate)


def _check_dropout(rate, key) -> float:
    """The dropout rate as a float, checked: in [0, 1], with a key when positive."""
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0.0 <= rate <= 1.0:
        raise ValueError(f"dropout_rate must be a number in [0, 1], got {rate!r}")
    if rate and key is None:
        raise ValueError(f"dropout_rate={rate} needs a dropout_key (a JAX PRNG key)")
    return float(rate)
