"""impl="pallas" (interpret mode on CPU) equals "reference" for outputs and every gradient, γ included."""

import re

import chex
import jax
import jax.numpy as jnp
import pytest

import kernels
from kernels import PallasBlockSizes, ReluAttentionOptions
from kernels.relu_attention.triton import causal_key_blocks, causal_query_blocks
from tests.kernels.tolerances import bound, fp32, pallas_against_reference

F32_TOL = fp32(2e-5)  # tests/kernels/tolerances.py: exact fp32 on the CPU, TF32 / bf16 passes elsewhere

SMALL = PallasBlockSizes(block_q=16, block_k=16, block_q_bwd=16, block_k_bwd=16)
# Causal grids pad to a common multiple of every tile: at T 32, 64 rows, so the last two 16-row query tiles
# lie wholly past the end (and 32 is a whole number of them): their loads and stores must still be masked.
MIXED = PallasBlockSizes(block_q=16, block_k=64, block_q_bwd=16, block_k_bwd=32)
# Each kernel its own tiles: the dq kernel walks 16-key blocks for 32-row query tiles, the dk/dv kernel 16-row
# query blocks for 48-key tiles (a diagonal that crosses tiles at other places in each kernel).
SPLIT = PallasBlockSizes(block_q=32, block_k=16, block_q_dq=32, block_k_dq=16, block_q_dkv=16, block_k_dkv=48)


def _inputs(b, t, h, d, dtype, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    q, k, v = (jax.random.normal(key, (b, t, h, d)).astype(dtype) for key in (kq, kk, kv))
    mask = jnp.arange(t)[None] < jnp.array([t, t // 2 + 1])[:b, None]
    return q, k, v, mask


CASES = [
    # (causal, dtype, length, head_dim, row_scale, tiles): lengths not a multiple of the block, odd head dims,
    # whole tiles past the end.
    (False, jnp.float32, 45, 24, "sqrt_half", SMALL),
    (True, jnp.float32, 45, 24, "sqrt_half", SMALL),
    (True, jnp.bfloat16, 37, 32, "sqrt_half", SMALL),
    (False, jnp.bfloat16, 37, 32, "count", SMALL),
    (True, jnp.float32, 20, 128, "none", SMALL),
    (True, jnp.float32, 32, 16, "sqrt_half", MIXED),
    (True, jnp.float32, 70, 32, "sqrt_half", SPLIT),
    (False, jnp.float32, 70, 32, "count", SPLIT),
]


def test_split_tiles_reach_their_kernels_and_bad_sizes_are_refused():
    assert (SPLIT.dq, SPLIT.dkv) == ((32, 16), (16, 48))
    assert (SMALL.dq, SMALL.dkv) == ((16, 16), (16, 16))  # both from block_{q,k}_bwd
    with pytest.raises(ValueError, match=r"PallasBlockSizes.block_k_dkv=0 must be a positive whole number"):
        PallasBlockSizes(block_k_dkv=0)


@pytest.mark.parametrize("causal, dtype, t, d, row_scale, sizes", CASES)
def test_pallas_matches_reference_outputs_and_gradients(causal, dtype, t, d, row_scale, sizes):
    q, k, v, mask = _inputs(2, t, 2, d, dtype)
    gamma = jnp.array([1.0, 0.6])
    w = jax.random.normal(jax.random.key(4), (2, t, 2, d))

    def loss(q, k, v, gamma, impl):
        options = ReluAttentionOptions(impl=impl, pallas_block_sizes=sizes)
        out = kernels.relu_attention(
            q, k, v, causal=causal, key_mask=mask, gamma=gamma, row_scale=row_scale, options=options
        )
        return jnp.sum(out.astype(jnp.float32) * w), out

    out, ref_out, errors = pallas_against_reference(loss, (q, k, v, gamma), ("dq", "dk", "dv", "dgamma"))
    chex.assert_type(out, dtype)
    tol = bound(dtype)
    real = mask[:, :, None, None]
    got = jnp.where(real, out.astype(jnp.float32), 0)
    chex.assert_trees_all_close(got, jnp.where(real, ref_out, 0), atol=tol, rtol=tol)
    for name, err in errors.items():
        assert err < bound(dtype, "grad"), f"{name}: relative error {err:.2e}"


def test_padded_keys_do_not_matter_and_causal_cannot_see_the_future():
    q, k, v, mask = _inputs(2, 30, 2, 16, jnp.float32)
    small = ReluAttentionOptions(impl="pallas", pallas_block_sizes=SMALL)
    out = kernels.relu_attention(q, k, v, key_mask=mask, options=small)
    pad = ~mask[:, :, None, None]
    out2 = kernels.relu_attention(q, jnp.where(pad, 9.0, k), jnp.where(pad, -9.0, v), key_mask=mask, options=small)
    chex.assert_trees_all_close(jnp.where(pad, 0, out), jnp.where(pad, 0, out2), atol=fp32(1e-6))
    c1 = kernels.relu_attention(q, k, v, causal=True, options=small)
    c2 = kernels.relu_attention(q, k.at[:, 17:].add(3.0), v.at[:, 17:].add(3.0), causal=True, options=small)
    chex.assert_trees_all_close(c1[:, :17], c2[:, :17], atol=fp32(1e-6))


@pytest.mark.parametrize("block_q, block_k", [(64, 32), (32, 64), (16, 16), (16, 48), (48, 16)])
def test_causal_loops_skip_the_tiles_above_the_diagonal_and_mask_only_those_across_it(block_q, block_k):
    """Each tile of a causal grid, classified by brute force over its (query, key) pairs: none visible → no loop
    reaches it, all visible → an unmasked loop, some → a masked one; from the query side (forward, dq) and the
    key side (dk, dv) alike."""
    t = 192
    num_q, num_k = t // block_q, t // block_k
    for i in range(num_q):
        for j in range(num_k):
            queries, keys = range(i * block_q, (i + 1) * block_q), range(j * block_k, (j + 1) * block_k)
            seen = {q >= k for q in queries for k in keys}
            expected = "skipped" if seen == {False} else "whole" if seen == {True} else "masked"
            whole, end = (int(x) for x in causal_key_blocks(i, block_q, block_k, num_k))
            by_query = "whole" if j < whole else "masked" if j < end else "skipped"
            first, whole_from = (int(x) for x in causal_query_blocks(j, block_q, block_k, num_q))
            by_key = "skipped" if i < first else "masked" if i < whole_from else "whole"
            assert by_query == by_key == expected, (i, j, by_query, by_key, expected)


def test_default_block_sizes_per_backend():
    gpu = PallasBlockSizes.for_backend("gpu", 128)  # the H100-tuned tiles for D 128
    assert (gpu.block_q, gpu.block_k, gpu.num_warps, gpu.num_stages) == (64, 64, 4, 3)
    assert PallasBlockSizes.for_backend("cpu", 128).block_q == 32  # interpret mode: small tiles are fast


@pytest.mark.parametrize("causal, t, d, sizes", [(False, 45, 24, SMALL), (True, 37, 32, SMALL), (True, 32, 16, MIXED)])
def test_row_stats_from_the_forward_kernel_match_reference_with_gradients(causal, t, d, sizes):
    """relu_attention_and_row_stats on the kernels (the statistics accumulated in the forward pass, their
    cotangents taken by the backward kernels) equals the reference output and row statistics, and a loss
    that uses all three has the reference's gradients for q, k, v and γ."""
    q, k, v, mask = _inputs(2, t, 2, d, jnp.float32)
    gamma = jnp.array([1.0, 0.6])
    w = jax.random.normal(jax.random.key(4), (2, t, 2, d))
    w_sum, w_xlogx = jax.random.normal(jax.random.key(5), (2, 2, t, 2))

    def loss(q, k, v, gamma, impl):
        opts = dict(causal=causal, key_mask=mask, gamma=gamma, options=ReluAttentionOptions(impl=impl))
        if impl == "reference":  # the output and the statistics from the two reference functions
            out = kernels.relu_attention(q, k, v, **opts)
            stats = kernels.relu_attention_row_stats(q, k, **opts)
        else:
            opts["options"] = ReluAttentionOptions(impl=impl, pallas_block_sizes=sizes)
            out, *stats = kernels.relu_attention_and_row_stats(q, k, v, **opts)
        row_sum, row_xlogx = stats
        value = jnp.sum(out * w) + jnp.sum(row_sum * w_sum) + jnp.sum(row_xlogx * w_xlogx)
        return value, (out, row_sum, row_xlogx)

    got, ref, errors = pallas_against_reference(loss, (q, k, v, gamma), ("dq", "dk", "dv", "dgamma"))
    real = mask[:, :, None]
    for name, g, r in zip(("output", "row sum", "row Σ a log a"), got, ref, strict=True):
        if g.ndim == 4:
            g, r = jnp.where(real[..., None], g, 0), jnp.where(real[..., None], r, 0)
        else:
            g, r = jnp.where(real, g, 0), jnp.where(real, r, 0)
        chex.assert_trees_all_close(g, r, atol=F32_TOL, rtol=F32_TOL, custom_message=name)
    for name, err in errors.items():
        assert err < F32_TOL, f"{name}: relative error {err:.2e}"


def test_row_stats_kernel_is_used_only_when_asked():
    """Without row statistics the forward kernel is the plain one; with them, one kernel call gives all three."""
    q, k, v, mask = _inputs(1, 40, 2, 16, jnp.float32)

    def kernel_names(fn):
        return set(re.findall(r"relu_attention_fwd\w*", str(jax.make_jaxpr(fn)(q, k, v))))

    pallas = ReluAttentionOptions(impl="pallas")
    plain = kernel_names(lambda a, b, c: kernels.relu_attention(a, b, c, key_mask=mask, options=pallas))
    fused = kernel_names(lambda a, b, c: kernels.relu_attention_and_row_stats(a, b, c, key_mask=mask, options=pallas))
    assert plain == {"relu_attention_fwd"}, plain
    assert fused == {"relu_attention_fwd_row_stats"}, fused
