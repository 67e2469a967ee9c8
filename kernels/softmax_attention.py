"""Softmax attention, the baseline the other ops are measured against, at its best on each platform.

    s_ij = q_i·k_j / √d,   m_ij = key j visible to query i (key mask, and j ≤ i when causal)
    h_i  = Σ_j softmax_j(s_ij | m_ij) v_j        (a row with no visible key: h_i = 0)

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
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax import lax

from kernels.blocking import block_causal, block_scores, key_blocks, pad_rows, unblock, visible
from kernels.checks import check_causal, check_floating, check_key_mask, check_lengths
from kernels.masking import zero_masked_rows
from kernels.platforms import auto_pallas_backend
from kernels.softmax_attention_tpu import SplashBlockSizes, softmax_attention_splash, splash_refusal

SOFTMAX_IMPLS = ("auto", "reference", "xla", "dense", "cudnn", "splash")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SoftmaxAttentionOptions:
    """`softmax_attention`'s options (module docstring for the impls).

    xla_block_k: the key-block length of impl "xla".
    splash_block_sizes: the splash kernels' tiles (`SplashBlockSizes`); None: its defaults.
    pallas_interpret: run the splash kernels in Pallas interpret mode; None: on a CPU backend only.
    """

    OP: ClassVar[str] = "softmax_attention"

    impl: str = "auto"
    xla_block_k: int = 512
    splash_block_sizes: SplashBlockSizes | None = None
    pallas_interpret: bool | None = None

    def __post_init__(self):
        name = type(self).__name__
        if self.impl not in SOFTMAX_IMPLS:
            raise ValueError(f"{name}.impl: unknown softmax impl {self.impl!r}; valid: {', '.join(SOFTMAX_IMPLS)}")
        block = self.xla_block_k
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ValueError(f"{name}.xla_block_k: must be a positive whole number, got {block!r}")
        sizes = self.splash_block_sizes
        if sizes is not None and not isinstance(sizes, SplashBlockSizes):
            raise ValueError(f"{name}.splash_block_sizes: {type(sizes).__name__} are not SplashBlockSizes")
        if self.pallas_interpret is not None and not isinstance(self.pallas_interpret, bool):
            raise ValueError(f"{name}.pallas_interpret: must be True, False or None, got {self.pallas_interpret!r}")

    def plan(self, q: jax.Array, k: jax.Array, backend: str | None = None) -> str:
        """The impl that runs for these inputs on `backend` (default: the running one's)."""
        if self.impl != "auto":
            return self.impl
        backend = backend or jax.default_backend()
        if backend == "gpu" and q.shape[1] > 1 and cudnn_refusal(q) is None:
            return "cudnn"
        if backend == "tpu" and auto_pallas_backend(self.OP, k.shape[1], {}) == "tpu":
            return "splash"
        return "xla"

    def interpret(self) -> bool:
        return jax.default_backend() == "cpu" if self.pallas_interpret is None else self.pallas_interpret


def cudnn_refusal(q: jax.Array) -> str | None:
    """Why cuDNN flash attention cannot take queries like `q` (None: it can)."""
    if jnp.dtype(q.dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"cuDNN flash attention is bfloat16/float16 only, not {jnp.dtype(q.dtype).name}"
    if q.shape[-1] > 128 or q.shape[-1] % 8:
        return f"cuDNN flash attention needs a head dim ≤ 128 and a multiple of 8, not {q.shape[-1]}"
    return None


def _check_inputs(q, k, v, key_mask, causal):
    check_causal(causal)
    check_key_mask(key_mask)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"q, k, v must be [batch, length, heads, head_dim]; got shapes {q.shape}, {k.shape}, {v.shape}"
        )
    check_floating(q=q, k=k, v=v)
    check_lengths(query_length=q.shape[1], key_length=k.shape[1], head_dim=q.shape[3])
    if k.shape[0] != q.shape[0] or k.shape[2:] != q.shape[2:]:
        raise ValueError(f"k shape {k.shape} does not match q shape {q.shape} (batch, heads, head_dim)")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v shape {v.shape} does not match k shape {k.shape} (batch, length, heads)")
    if key_mask is not None and key_mask.shape != k.shape[:2]:
        raise ValueError(f"key_mask shape {key_mask.shape} must be [batch, key_length] = {k.shape[:2]}")
    if causal and q.shape[1] != k.shape[1]:
        raise ValueError(f"causal attention needs equal query and key lengths, got {q.shape[1]} and {k.shape[1]}")


# ----------------------------------------------------------------------------------------------
# Reference and JAX's own
# ----------------------------------------------------------------------------------------------


def _reference(q, k, v, key_mask, causal):
    qf, kf = q.astype(jnp.float32), k.astype(jnp.float32)
    s = jnp.einsum("bqhd,bkhd->bhqk", qf, kf, precision=lax.Precision.HIGHEST) / jnp.sqrt(float(q.shape[-1]))
    vis = visible(key_mask, jnp.arange(q.shape[1]), jnp.arange(k.shape[1]), causal)
    s = jnp.where(vis, s, -jnp.inf)
    row_max = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.where(vis, jnp.exp(s - jnp.where(jnp.isfinite(row_max), row_max, 0.0)), 0.0)
    total = p.sum(-1, keepdims=True)
    a = p / jnp.where(total > 0, total, 1.0)
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


def _online_block(carry, s, vis, vj):
    """Folds one key block into a row's running (maximum, sum of exp, Σ exp·v)."""
    row_max, row_sum, acc = carry
    block_max = jnp.max(jnp.where(vis, s, _NO_KEY), axis=-1)
    new_max = jnp.maximum(row_max, block_max)
    safe_max = jnp.where(jnp.isfinite(new_max), new_max, 0.0)  # −∞ − −∞ would be NaN
    p = jnp.where(vis, jnp.exp(s - safe_max[..., None]), 0.0)
    rescale = jnp.exp(jnp.where(jnp.isfinite(row_max), row_max, safe_max) - safe_max)
    pv = jnp.einsum("bhqk,bhkd->bhqd", p.astype(vj.dtype), vj, preferred_element_type=jnp.float32)
    return new_max, row_sum * rescale + p.sum(-1), acc * rescale[..., None] + pv


def _finish(carry):
    """(output `[B, H, rows, d_v]` float32, log-sum-exp `[B, H, rows]`; +∞ for a row with no visible key)."""
    row_max, row_sum, acc = carry
    seen = row_sum > 0
    out = jnp.where(seen[..., None], acc / jnp.where(seen, row_sum, 1.0)[..., None], 0.0)
    return out, jnp.where(seen, row_max + jnp.log(jnp.where(seen, row_sum, 1.0)), jnp.inf)


def _start(shape_rows, d_v):
    b, h, rows = shape_rows
    return (
        jnp.full((b, h, rows), _NO_KEY, jnp.float32),
        jnp.zeros((b, h, rows), jnp.float32),
        jnp.zeros((b, h, rows, d_v), jnp.float32),
    )


def _xla_forward(q, k, v, key_mask, causal, block_k):
    """(output `[B, T, H, d_v]` in v's dtype, log-sum-exp `[B, H, T]` float32)."""
    b, tq, h, _ = q.shape
    kb, vb, mb, bk, nb = key_blocks(k, v, key_mask, block_k)
    qh = q.transpose(0, 2, 1, 3)
    if block_causal(q, k, causal, block_k):  # query block i meets key blocks j ≤ i only
        qp = pad_rows(qh, nb * bk)
        outs, lses = [], []
        for i in range(nb):
            rows = qp[:, :, i * bk : (i + 1) * bk]
            carry = _start((b, h, bk), v.shape[-1])
            for j in range(i + 1):
                s, vis = block_scores(rows, kb[j], mb[j], j, bk, j == i, q_offset=i * bk)
                carry = _online_block(carry, s, vis, vb[j])
            out_i, lse_i = _finish(carry)
            outs.append(out_i)
            lses.append(lse_i)
        out, lse = jnp.concatenate(outs, axis=2)[:, :, :tq], jnp.concatenate(lses, axis=2)[:, :, :tq]
    else:

        def body(carry, xs):
            kj, vj, mj, j = xs
            s, vis = block_scores(qh, kj, mj, j, bk, causal)
            return _online_block(carry, s, vis, vj), None

        carry, _ = lax.scan(body, _start((b, h, tq), v.shape[-1]), (kb, vb, mb, jnp.arange(nb)))
        out, lse = _finish(carry)
    return out.transpose(0, 2, 1, 3).astype(v.dtype), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _xla(q, k, v, key_mask, causal, block_k):
    return _xla_forward(q, k, v, key_mask, causal, block_k)[0]


def _xla_fwd(q, k, v, key_mask, causal, block_k):
    out, lse = _xla_forward(q, k, v, key_mask, causal, block_k)
    return out, (q, k, v, key_mask, out, lse)


def _xla_bwd(causal, block_k, residuals, d_out):
    """Per key block: p = exp(s − lse), dV += pᵀ dO, dP = dO Vᵀ, dS = p ⊙ (dP − Δ), dQ += dS K/√d, dK += dSᵀ Q/√d,
    with Δ_i = dO_i · O_i — five matmuls a block."""
    q, k, v, key_mask, out, lse = residuals
    b, tq, h, d = q.shape
    scale = 1.0 / jnp.sqrt(float(d))
    kb, vb, mb, bk, nb = key_blocks(k, v, key_mask, block_k)
    qh, do = q.transpose(0, 2, 1, 3), d_out.transpose(0, 2, 1, 3)
    delta = jnp.einsum("bqhd,bqhd->bhq", d_out.astype(jnp.float32), out.astype(jnp.float32))

    def tile(qr, dor, lse_r, delta_r, kj, vj, mj, j, q_offset, causal):
        s, vis = block_scores(qr, kj, mj, j, bk, causal, q_offset=q_offset)
        p = jnp.where(vis, jnp.exp(s - lse_r[..., None]), 0.0)
        dv_j = jnp.einsum("bhqk,bhqd->bhkd", p.astype(dor.dtype), dor, preferred_element_type=jnp.float32)
        dp = jnp.einsum("bhqd,bhkd->bhqk", dor, vj, preferred_element_type=jnp.float32)
        ds = (p * (dp - delta_r[..., None]) * scale).astype(q.dtype)
        dq_rows = jnp.einsum("bhqk,bhkd->bhqd", ds, kj, preferred_element_type=jnp.float32)
        dk_j = jnp.einsum("bhqk,bhqd->bhkd", ds, qr, preferred_element_type=jnp.float32)
        return dq_rows, dk_j, dv_j

    if block_causal(q, k, causal, block_k):  # tiles (i, j) with query block i ≥ key block j only
        rows = nb * bk
        qp, dop = pad_rows(qh, rows), pad_rows(do, rows)
        lsep, deltap = pad_rows(lse, rows), pad_rows(delta, rows)  # padded rows: do = 0, so they add nothing
        dq_blocks, dk_acc, dv_acc = [], [None] * nb, [None] * nb
        for i in range(nb):
            r = slice(i * bk, (i + 1) * bk)
            dq_i = None
            for j in range(i + 1):
                dq_t, dk_t, dv_t = tile(
                    qp[:, :, r], dop[:, :, r], lsep[:, :, r], deltap[:, :, r], kb[j], vb[j], mb[j], j, i * bk, j == i
                )
                dq_i = dq_t if dq_i is None else dq_i + dq_t
                dk_acc[j] = dk_t if dk_acc[j] is None else dk_acc[j] + dk_t
                dv_acc[j] = dv_t if dv_acc[j] is None else dv_acc[j] + dv_t
            dq_blocks.append(dq_i)
        dq = jnp.concatenate(dq_blocks, axis=2)[:, :, :tq]
        dk_b, dv_b = jnp.stack(dk_acc), jnp.stack(dv_acc)
    else:

        def body(dq, xs):
            kj, vj, mj, j = xs
            dq_rows, dk_j, dv_j = tile(qh, do, lse, delta, kj, vj, mj, j, 0, causal)
            return dq + dq_rows, (dk_j, dv_j)

        dq, (dk_b, dv_b) = lax.scan(body, jnp.zeros((b, h, tq, d), jnp.float32), (kb, vb, mb, jnp.arange(nb)))
    tk = k.shape[1]
    return (
        dq.transpose(0, 2, 1, 3).astype(q.dtype),
        unblock(dk_b, tk).astype(k.dtype),
        unblock(dv_b, tk).astype(v.dtype),
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
    options: SoftmaxAttentionOptions | None = None,
) -> jax.Array:
    """Softmax attention. q, k, v: `[batch, length, heads, head_dim]`; returns v's shape and dtype.

    Args:
      key_mask: `[batch, key_length]` bool, True = real token; None means every key is real. Impl "cudnn" reads
        it as key lengths (exact for trailing padding); a row that sees no key outputs 0 in every impl.
      options: which implementation runs and how it is tiled; None: the defaults (impl "auto").
    """
    options = options or SoftmaxAttentionOptions()
    _check_inputs(q, k, v, key_mask, causal)
    impl = options.plan(q, k)
    if impl == "cudnn" and (refusal := cudnn_refusal(q)) is not None:
        raise ValueError(f"softmax impl 'cudnn': {refusal}")
    if impl == "splash" and (refusal := splash_refusal(q, k, v)) is not None:
        raise ValueError(f"softmax impl 'splash': {refusal}")
    k, v = zero_masked_rows(k, key_mask), zero_masked_rows(v, key_mask)
    key_mask = jnp.ones(k.shape[:2], bool) if key_mask is None else key_mask
    if impl == "reference":
        return _reference(q, k, v, key_mask, causal)
    if impl in ("dense", "cudnn"):
        return _dense(q, k, v, key_mask, causal, "cudnn" if impl == "cudnn" else "xla")
    if impl == "splash":
        out = softmax_attention_splash(
            q, k, v, key_mask, causal=causal, block_sizes=options.splash_block_sizes, interpret=options.interpret()
        )
        return _zero_empty_rows(out, key_mask, causal)
    return _xla(q, k, v, key_mask, causal, options.xla_block_k)
