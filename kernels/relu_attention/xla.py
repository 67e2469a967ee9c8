"""ReLU attention blocked over keys in plain jnp (impl "xla"): the T×T matrix is never built, forward or backward.

A custom VJP recomputes the scores per key block, five matmuls a block. Causal self-attention is blocked over
queries too (`kernels.blocking`; long sequences get longer blocks, at most MAX_CAUSAL_BLOCKS of them): key block j
meets only the query rows from its own start, so the work is the lower triangle plus the diagonal blocks. Unlike
softmax there is no running max or log-sum-exp: the per-row factor depends only on i and the mask, so it is applied
once after the sum over key blocks.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from kernels.blocking import block_causal, block_scores, key_blocks, lower_triangle_gradients, pad_rows, unblock
from kernels.numerics import xlogx
from kernels.relu_attention.reference import mask_factor


def tile_weights(s, vis, causal: bool):
    """ReLU(s) of one tile of scores. Padded keys need no mask here: the public functions zero their rows of k
    (zero_masked_rows) and key_blocks pads with zero rows, so their scores are 0 and ReLU(0) = 0 exactly. Only a
    tile that crosses the causal diagonal selects (the select cost 0-6% of the op's time at T 2,001)."""
    return jnp.where(vis, jax.nn.relu(s), 0.0) if causal else jax.nn.relu(s)


def _xla_forward(q, k, v, key_mask, gamma_h, causal, row_scale, block_k):
    """The output `[B, T, H, d_v]` in float32 (cast by the caller)."""
    b, tq, h, _ = q.shape
    factor = mask_factor(key_mask, gamma_h, causal, row_scale, tq)
    kb, vb, mb, bk, nb = key_blocks(k, v, key_mask, block_k)
    qh = q.transpose(0, 2, 1, 3)
    if block_causal(q, k, causal, block_k):  # query block i against key blocks j ≤ i, tile by tile
        qp = pad_rows(qh, nb * bk)
        out_blocks = []
        for i in range(nb):
            rows = qp[:, :, i * bk : (i + 1) * bk]
            acc = None
            for j in range(i + 1):
                s, vis = block_scores(rows, kb[j], mb[j], j, bk, j == i, q_offset=i * bk)
                p = tile_weights(s, vis, j == i)  # below the diagonal: all causal-visible
                pv = jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), vb[j], preferred_element_type=jnp.float32)
                acc = pv if acc is None else acc + pv
            out_blocks.append(acc)
        acc = jnp.concatenate(out_blocks, axis=2) * pad_rows(factor, nb * bk)[..., None]
        return acc[:, :, :tq].transpose(0, 2, 1, 3)

    def body(acc, xs):
        kj, vj, mj, j = xs
        s, vis = block_scores(qh, kj, mj, j, bk, causal)
        p = tile_weights(s, vis, causal)
        acc = acc + jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), vj, preferred_element_type=jnp.float32)
        return acc, None

    acc0 = jnp.zeros((b, h, tq, v.shape[-1]), jnp.float32)
    acc, _ = lax.scan(body, acc0, (kb, vb, mb, jnp.arange(nb)))
    return (acc * factor[..., None]).transpose(0, 2, 1, 3)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def relu_attention_xla(q, k, v, key_mask, gamma_h, causal, row_scale, block_k):
    return _xla_forward(q, k, v, key_mask, gamma_h, causal, row_scale, block_k).astype(v.dtype)


def _xla_fwd(q, k, v, key_mask, gamma_h, causal, row_scale, block_k):
    out = _xla_forward(q, k, v, key_mask, gamma_h, causal, row_scale, block_k)
    # out_i ∝ 1/γ_h, so dγ_h = −Σ_i do_i·out_i / γ_h: one sum over the saved output instead of a pass over every tile.
    return out.astype(v.dtype), (q, k, v, key_mask, gamma_h, out)


def _xla_bwd(causal, row_scale, block_k, residuals, d_out):
    """Recomputes scores per key block, five matmuls a block. The row factor f_i and 1/√d scale whole rows, so
    they are applied to dO (dO_i f_i) and to dQ, dK once instead of to every tile: with p = ReLU(s) ⊙ m,
    dV = Σ_i p_ijᵀ (f_i dO_i), and dS' = 1[s>0] ⊙ m ⊙ ((f_i dO_i) · v_j) gives dQ = dS' K / √d, dK = dS'ᵀ Q / √d."""
    q, k, v, key_mask, gamma_h, out = residuals
    b, tq, h, d = q.shape
    tk = k.shape[1]
    factor = mask_factor(key_mask, gamma_h, causal, row_scale, tq)
    kb, vb, mb, bk, nb = key_blocks(k, v, key_mask, block_k)
    qh = q.transpose(0, 2, 1, 3)
    do_f = (d_out.transpose(0, 2, 1, 3) * factor[..., None]).astype(d_out.dtype)
    # q and f·dO once more with the query axis last: dK and dV contract the query axis, and as [d, q] @ [q, k]
    # XLA:CPU hands those products to its matmul library instead of Eigen (op fwd+bwd at B4 T2001 H8: 5-7% faster).
    q_t, do_f_t = q.transpose(0, 2, 3, 1), do_f.transpose(0, 1, 3, 2)

    def block(qr, qr_t, dor, dor_t, kj, vj, mj, j, q_offset, causal=causal):
        """One key block against query rows `qr` (from position `q_offset`; `qr_t`, `dor_t`: q and f·dO with the
        query axis last): the block's five matmuls. dQ, dK unscaled by 1/√d; dK and dV transposed, `[B, H, d, bk]`."""
        s, vis = block_scores(qr, kj, mj, j, bk, causal, q_offset=q_offset)
        p = tile_weights(s, vis, causal)
        dv_t = jnp.einsum("bhdq,bhqk->bhdk", dor_t, p.astype(dor.dtype), preferred_element_type=jnp.float32)
        dp = jnp.einsum("bhqd,bhkd->bhqk", dor, vj, preferred_element_type=jnp.float32)
        ds = jnp.where((vis & (s > 0)) if causal else s > 0, dp, 0.0).astype(q.dtype)
        dq_rows = jnp.einsum("bhqk,bhkd->bhqd", ds, kj, preferred_element_type=jnp.float32)
        dk_t = jnp.einsum("bhdq,bhqk->bhdk", qr_t, ds, preferred_element_type=jnp.float32)
        return dq_rows, dk_t, dv_t

    if block_causal(q, k, causal, block_k):  # tiles (i, j) with query block i ≥ key block j only

        def tile(i, j, *rows_i):  # only diagonal tiles mask
            return block(*rows_i, kb[j], vb[j], mb[j], j, i * bk, causal=j == i)

        rows = ((qh, 2), (q_t, 3), (do_f, 2), (do_f_t, 3))
        dq, dk_b, dv_b = lower_triangle_gradients(nb, bk, tq, tile, *rows)
    else:

        def body(dq, xs):
            kj, vj, mj, j = xs
            dq_rows, dk_j, dv_j = block(qh, q_t, do_f, do_f_t, kj, vj, mj, j, 0)
            return dq + dq_rows, (dk_j, dv_j)

        dq, (dk_b, dv_b) = lax.scan(body, jnp.zeros((b, h, tq, d), jnp.float32), (kb, vb, mb, jnp.arange(nb)))

    scale = 1.0 / math.sqrt(d)
    d_gamma = -jnp.einsum("bthd,bthd->h", d_out.astype(jnp.float32), out) / gamma_h
    return (
        (dq.transpose(0, 2, 1, 3) * scale).astype(q.dtype),
        (unblock(jnp.swapaxes(dk_b, -1, -2), tk) * scale).astype(k.dtype),
        unblock(jnp.swapaxes(dv_b, -1, -2), tk).astype(v.dtype),
        None,
        d_gamma.astype(gamma_h.dtype),
    )


relu_attention_xla.defvjp(_xla_fwd, _xla_bwd)


def row_stats(q, k, key_mask, gamma_h, causal, row_scale, block_k):
    """(S_i, E_i) `[batch, q_length, heads]` on prepared inputs, key block by key block (each recomputed under
    `jax.checkpoint`, so neither forward nor backward holds the T×T matrix)."""
    b, tq, h, _ = q.shape
    factor = mask_factor(key_mask, gamma_h, causal, row_scale, tq)
    kb, _, mb, bk, nb = key_blocks(k, k, key_mask, block_k)
    qh = q.transpose(0, 2, 1, 3)

    @jax.checkpoint
    def body(carry, xs):
        row_sum, row_xlogx = carry
        kj, mj, j = xs
        s, vis = block_scores(qh, kj, mj, j, bk, causal)
        a = tile_weights(s, vis, causal) * factor[..., None]
        return (row_sum + a.sum(-1), row_xlogx + xlogx(a).sum(-1)), None

    zeros = jnp.zeros((b, h, tq), jnp.float32)
    (row_sum, row_xlogx), _ = lax.scan(body, (zeros, zeros), (kb, mb, jnp.arange(nb)))
    return row_sum.transpose(0, 2, 1), row_xlogx.transpose(0, 2, 1)
