"""Softmax attention blocked over keys with an online maximum and sum (impl "xla"; Rabe & Staats 2021, the forward
of FlashAttention): memory O(T · xla_block_k); a custom VJP recomputes each block's scores from the saved
log-sum-exp, five matmuls a block. Causal self-attention is tiled over queries too (`kernels.blocking`). Dropout
on the weights is formed block by block (kernels/numerics.py says how).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from kernels.blocking import block_causal, block_scores, key_blocks, lower_triangle_gradients, pad_rows, unblock
from kernels.numerics import VALUES_PER_HASH, keep_scale, unpack_keep_bits
from kernels.softmax_attention.reference import keep_bits, keep_mask

# Blocked XLA: an online maximum and sum over key blocks, custom VJP from the log-sum-exp

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
        finished = []  # (output, log-sum-exp) of each query block
        for i in range(nb):
            rows = qp[:, :, i * bk : (i + 1) * bk]
            carry = _start((b, h, bk), v.shape[-1])
            for j in range(i + 1):
                s, vis = block_scores(rows, kb[j], mb[j], j, bk, j == i, q_offset=i * bk)
                keep = _block_keep(seed, rate, q, i * bk + jnp.arange(bk), j * bk, bk)
                carry = _online_block(carry, s, vis, vb[j], keep, scale)
            finished.append(_finish(carry))
        out, lse = (jnp.concatenate(parts, axis=2)[:, :, :tq] for parts in zip(*finished, strict=True))
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
def softmax_attention_xla(q, k, v, key_mask, seed, causal, block_k, rate):
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

        def causal_tile(i, j, *rows_i):
            keep = _block_keep(seed, rate, q, i * bk + jnp.arange(bk), j * bk, bk)
            return tile(*rows_i, kb[j], vb[j], mb[j], j, i * bk, j == i, keep)

        rows = ((qh, 2), (q_t, 3), (do, 2), (do_t, 3), (lse, 2), (delta, 2))
        dq, dk_b, dv_b = lower_triangle_gradients(nb, bk, tq, causal_tile, *rows)
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


softmax_attention_xla.defvjp(_xla_fwd, _xla_bwd)
