"""The Mosaic GPU (Hopper) linear-attention kernels: the chunk algorithm (with XLA in place of the two kernels)
equals the reference forward and backward on any machine; the kernels lower for CUDA on this CPU; they refuse
what they cannot take; and — on a GPU — the kernels equal their XLA stand-ins and the reference."""

import chex
import jax
import jax.numpy as jnp
import pytest

import kernels
from kernels import LinearAttentionOptions
from kernels.linear_attention.mosaic_gpu import MgpuChunkSizes, chunked_product, linear_attention_mosaic_gpu, supported
from tests.kernels.lowering import exported_text, layout_copies
from tests.kernels.tolerances import bound, fp32, relative_errors

REFERENCE = LinearAttentionOptions(impl="reference")


def _features(shape, dv, dtype, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    phi_q = jax.nn.softplus(jax.random.normal(kq, shape)).astype(dtype)
    phi_k = jax.nn.softplus(jax.random.normal(kk, shape)).astype(dtype)
    v = jax.random.normal(kv, (*shape[:3], dv)).astype(dtype)
    return phi_q, phi_k, v


def _loss(attend):
    def loss(q, k, v):
        out = attend(q, k, v)
        weights = jnp.cos(jnp.arange(out.shape[-1], dtype=jnp.float32))  # a cotangent that is not all ones
        return jnp.sum(out.astype(jnp.float32) * weights), out

    return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)


@pytest.mark.parametrize("eps_mode", ["add", "guard"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("m, dv, chunk", [(64, 128, 64), (32, 48, 128)])
def test_chunk_algorithm_matches_reference_fp32(m, dv, chunk, causal, eps_mode):
    """fp32 through the XLA stand-ins: prefixes over chunks, the within-chunk masks and the custom VJP (three
    chunked products over the reversed visibility) are exact to fp32 rounding."""
    phi_q, phi_k, v = _features((2, 256, 3, m), dv, jnp.float32)
    opts = dict(causal=causal, eps=1e-6, eps_mode=eps_mode)
    sizes = MgpuChunkSizes(chunk)
    grad = _loss(lambda q, k, v: linear_attention_mosaic_gpu(q, k, v, block_sizes=sizes, kernels="xla", **opts))
    (_, out), grads = jax.jit(grad)(phi_q, phi_k, v)
    (_, ref), ref_grads = _loss(lambda q, k, v: kernels.linear_attention(q, k, v, options=REFERENCE, **opts))(
        phi_q, phi_k, v
    )
    chex.assert_trees_all_close(out, ref, atol=fp32(1e-5), rtol=fp32(1e-5))
    assert max(relative_errors(grads, ref_grads)) < fp32(1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_chunk_algorithm_in_bf16_stays_within_bf16_error(causal):
    """bf16 inputs: the within-chunk scores and the state go in as bf16, as in the kernels; outputs and gradients
    stay within the Triton kernels' bf16 bound of the fp32 reference."""
    phi_q, phi_k, v = _features((2, 512, 2, 64), 64, jnp.bfloat16, seed=1)
    (_, out), grads = _loss(
        lambda q, k, v: linear_attention_mosaic_gpu(q, k, v, causal=causal, eps=1e-6, kernels="xla")
    )(phi_q, phi_k, v)
    f32 = [x.astype(jnp.float32) for x in (phi_q, phi_k, v)]
    (_, ref), ref_grads = _loss(lambda q, k, v: kernels.linear_attention(q, k, v, causal=causal, options=REFERENCE))(
        *f32
    )
    assert out.dtype == jnp.bfloat16
    assert max(relative_errors([out, *grads], [ref, *ref_grads])) < bound(jnp.bfloat16, "grad")


@pytest.mark.parametrize("causal", [False, True])
def test_the_bf16_state_is_as_accurate_as_the_triton_kernels(causal):
    """The state enters wgmma in bf16, stored so per chunk: forward error within 5% of the Triton kernels', which
    round the state's products the same way for bf16 inputs (both about 0.3% of the largest output here)."""
    phi_q, phi_k, v = _features((2, 2048, 2, 64), 64, jnp.bfloat16, seed=1)
    ref = kernels.linear_attention(
        *(x.astype(jnp.float32) for x in (phi_q, phi_k, v)), causal=causal, options=REFERENCE
    )
    chunked = linear_attention_mosaic_gpu(phi_q, phi_k, v, causal=causal, eps=1e-6, kernels="xla")
    triton = kernels.linear_attention(phi_q, phi_k, v, causal=causal, impl="triton")  # interpreted on a CPU
    (chunked_err,), (triton_err,) = relative_errors([chunked], [ref]), relative_errors([triton], [ref])
    assert chunked_err <= 1.05 * triton_err and triton_err < 1e-2, (chunked_err, triton_err)


@pytest.mark.parametrize("mode", ["causal", "anticausal", "full"])
def test_chunked_product_is_the_masked_bilinear_sum(mode):
    """r_i Σ_{j vis i} (a_i·b_j) c_j with the row scale r, for each visibility, against the dense sum."""
    a, b, c = _features((1, 256, 2, 32), 16, jnp.float32, seed=2)
    r = jax.random.uniform(jax.random.key(3), (1, 2, 256), minval=0.5, maxval=2.0)
    got = chunked_product(a, b, c, r, mode, 64, "xla")
    highest = jax.lax.Precision.HIGHEST  # exact fp32 products on every backend (a GPU's default is TF32)
    scores = jnp.einsum("bihx,bjhx->bhij", a, b, precision=highest)
    i, j = jnp.arange(256)[:, None], jnp.arange(256)[None, :]
    visible = {"causal": i >= j, "anticausal": i <= j, "full": jnp.ones((256, 256), bool)}[mode]
    want = jnp.einsum("bhij,bjhy->bihy", jnp.where(visible, scores, 0.0) * r[..., None], c, precision=highest)
    (err,) = relative_errors([got], [want])
    assert err < fp32(1e-6), err  # sums of 256 terms: fp32 rounding on the CPU, TF32 on a GPU


@pytest.mark.lowering
@pytest.mark.parametrize("t, d", [(1024, 64), (16384, 128)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_lowers_for_cuda_to_the_mosaic_kernels(grad, causal, t, d):
    """Forward: the chunk-prefix and chunk-output kernels. Gradient: those of the forward (its output is a
    residual) and of the three backward products. No T×T, chunk or state product left to XLA, no fp32 state
    passed between the kernels, no layout copies."""

    def attend(q, k, v):
        options = LinearAttentionOptions(impl="pallas", pallas_backend="mosaic_gpu")
        return kernels.linear_attention(jax.nn.elu(q) + 1, jax.nn.elu(k) + 1, v, causal=causal, options=options)

    fn = attend
    if grad:
        fn = jax.grad(lambda a, b, c: jnp.sum(attend(a, b, c).astype(jnp.float32)), argnums=(0, 1, 2))
    x = jax.ShapeDtypeStruct((2, t, 4, d), jnp.bfloat16)
    text = exported_text(fn, "cuda", x, x, x)
    assert text.count("mosaic_gpu_v2") == (8 if grad else 2)
    assert "stablehlo.dot_general" not in text
    states = [line for line in text.splitlines() if "mosaic_gpu_v2" in line and f"x{d}x{d}xf32>" in line]
    assert not states, states[:1]
    assert not layout_copies(text), layout_copies(text)


def test_refuses_inputs_it_cannot_take_with_the_reason():
    ok = jnp.ones((1, 128, 2, 64), jnp.bfloat16)
    opts = dict(causal=True, eps=1e-6)
    with pytest.raises(ValueError, match="takes bf16 inputs, got float32"):
        linear_attention_mosaic_gpu(ok.astype(jnp.float32), ok, ok, **opts)
    half = ok.astype(jnp.float16)  # the rounded prefix state would pass fp16's range at long lengths
    with pytest.raises(ValueError, match="takes bf16 inputs, got float16"):
        linear_attention_mosaic_gpu(half, half, half, **opts)
    with pytest.raises(ValueError, match="of one dtype"):
        linear_attention_mosaic_gpu(ok, ok, half, **opts)
    with pytest.raises(ValueError, match="of one dtype, got φ\\(k\\) float16"):
        linear_attention_mosaic_gpu(ok, half, ok, **opts)
    with pytest.raises(ValueError, match="multiples of 64, got 64, 48"):
        linear_attention_mosaic_gpu(ok, ok, ok[..., :48], **opts)
    wide = jnp.ones((1, 128, 2, 256), jnp.bfloat16)
    with pytest.raises(ValueError, match="state in shared memory: 256 × 256 is over 16384 entries"):
        linear_attention_mosaic_gpu(wide, wide, wide, **opts)
    assert supported(wide, ok, MgpuChunkSizes()) is None  # FAVOR+'s m 256 with d_v 64: 256 × 64
    with pytest.raises(ValueError, match="chunk 128 with dims 64, 64 is over 25600 entries"):
        linear_attention_mosaic_gpu(ok, ok, ok, block_sizes=MgpuChunkSizes(128), **opts)
    assert supported(wide, wide[..., :64], MgpuChunkSizes(64)) is None  # chunk 64 at dims 256: 22,528 entries
    with pytest.raises(ValueError, match="whole chunks: 100"):
        linear_attention_mosaic_gpu(ok[:, :100], ok[:, :100], ok[:, :100], **opts)
    with pytest.raises(ValueError, match="multiple of 64, got 32"):
        MgpuChunkSizes(chunk=32)
    with pytest.raises(ValueError, match="unknown kernels 'cuda'"):
        linear_attention_mosaic_gpu(ok, ok, ok, kernels="cuda", **opts)
    assert supported(ok.astype(jnp.float32), ok, MgpuChunkSizes(), kernels="xla") is None


@pytest.mark.parametrize("causal", [False, True])
def test_kernels_match_their_stand_ins_and_the_reference_where_they_run(causal):
    """On a GPU: the Mosaic kernels' outputs and gradients against the XLA stand-ins (same algorithm) and the
    fp32 reference. Anywhere else they cannot run (JAX's GPU interpret mode cannot execute their wgmma), and
    saying so is what is checked."""
    phi_q, phi_k, v = _features((2, 1024, 4, 128), 128, jnp.bfloat16, seed=4)
    mosaic = jax.jit(_loss(lambda q, k, v: linear_attention_mosaic_gpu(q, k, v, causal=causal, eps=1e-6)))
    if jax.default_backend() != "gpu":
        with pytest.raises(ValueError, match="interpret mode"):
            mosaic(phi_q, phi_k, v)
        return
    (_, out), grads = mosaic(phi_q, phi_k, v)
    stand_in = _loss(lambda q, k, v: linear_attention_mosaic_gpu(q, k, v, causal=causal, eps=1e-6, kernels="xla"))
    (_, want), want_grads = jax.jit(stand_in)(phi_q, phi_k, v)
    # Same algorithm and the same bf16 roundings: closer to each other than either is to the fp32 reference.
    assert max(relative_errors([out, *grads], [want.astype(jnp.float32), *want_grads])) < 1e-2
    f32 = [x.astype(jnp.float32) for x in (phi_q, phi_k, v)]
    (_, ref), ref_grads = _loss(lambda q, k, v: kernels.linear_attention(q, k, v, causal=causal, options=REFERENCE))(
        *f32
    )
    assert max(relative_errors([out, *grads], [ref, *ref_grads])) < bound(jnp.bfloat16, "grad")


@pytest.mark.parametrize("causal", [False, True])
def test_causal_masks_are_refused_with_the_cuda_versions_whose_ptxas_miscompiles_them(causal, monkeypatch):
    import kernels.mosaic_gpu_tiles

    ok = jnp.ones((1, 128, 2, 64), jnp.bfloat16)
    monkeypatch.setattr(kernels.mosaic_gpu_tiles, "cuda_runtime_version", lambda: 12085)
    reason = supported(ok, ok, MgpuChunkSizes(), causal=causal)
    assert (reason is not None and "ptxas miscompiles causal masks" in reason) == causal, reason
