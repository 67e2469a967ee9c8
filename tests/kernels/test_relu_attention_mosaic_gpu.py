"""The experimental Mosaic GPU (Hopper) ReLU kernels — the forward, and the fused, split and Triton backwards:
lower for CUDA on this CPU, refuse what they cannot take, and — on a GPU — equal the reference. JAX 0.10's GPU
interpret mode has no rule for their layout casts and accumulator state, so on a CPU the numbers cannot be
checked; the GPU sessions run this file."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

import kernels
from kernels import ReluAttentionOptions
from kernels.relu_attention.mosaic_gpu import MgpuBlockSizes, relu_attention_mosaic_gpu, supported
from tests.kernels.lowering import exported_text, layout_copies
from tests.kernels.tolerances import assert_bf16_matches_reference


def _attend(causal, t, backward="fused", warp_specialized=True):
    mask = jnp.arange(t)[None] < jnp.array([[t], [t // 2]])
    sizes = MgpuBlockSizes(backward=backward, warp_specialized=warp_specialized)
    options = ReluAttentionOptions(impl="pallas", pallas_backend="mosaic_gpu", pallas_block_sizes=sizes)

    def attend(q, k, v):
        return kernels.relu_attention(q, k, v, causal=causal, key_mask=mask, options=options)

    return attend


@pytest.mark.lowering
@pytest.mark.parametrize("t, d", [(1024, 64), (16384, 128)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "grad, backward, warp_specialized",
    [
        (False, "fused", True), (False, "fused", False), (True, "fused", True), (True, "mosaic", True),
        (True, "triton", True),
    ],
)  # fmt: skip
def test_lowers_for_cuda_to_the_mosaic_kernels(grad, backward, warp_specialized, causal, t, d):
    """Forward: one Mosaic GPU kernel (warp-specialised or one warpgroup). Gradient: the fused kernel (dQ by TMA
    reductions), the Mosaic dq and dk/dv kernels, or (backward="triton") the Triton ones; the forward is dead code
    there. Nothing of the attention left to XLA, no layout copies."""
    fn = _attend(causal, t, backward, warp_specialized)
    if grad:
        attend = fn
        fn = jax.grad(lambda a, b, c: jnp.sum(attend(a, b, c).astype(jnp.float32)), argnums=(0, 1, 2))
    x = jax.ShapeDtypeStruct((2, t, 4, d), jnp.bfloat16)
    text = exported_text(fn, "cuda", x, x, x)
    calls = {(True, "fused"): (1, 0), (True, "mosaic"): (2, 0), (True, "triton"): (0, 2)}
    mosaic, triton = calls.get((grad, backward), (1, 0))
    assert (text.count("mosaic_gpu_v2"), text.count("__gpu$xla.gpu.triton")) == (mosaic, triton)
    assert "stablehlo.dot_general" not in text
    assert not layout_copies(text), layout_copies(text)
    if grad and backward == "fused":  # the four outputs it writes are aliased, not q, k, v, dO and f
        (call,) = [line for line in text.splitlines() if "mosaic_gpu_v2" in line]
        assert call.count("output_operand_alias<") == 4


def test_refuses_inputs_it_cannot_take_with_the_reason():
    ok = jnp.zeros((1, 128, 2, 64), jnp.bfloat16)
    mask, factor = jnp.ones((1, 128), bool), jnp.ones((1, 2, 128), jnp.float32)
    with pytest.raises(ValueError, match="bf16/fp16"):
        relu_attention_mosaic_gpu(ok.astype(jnp.float32), ok, ok, mask, factor, causal=False)
    with pytest.raises(ValueError, match="multiples of 64, got 48"):
        odd = jnp.zeros((1, 128, 2, 48), jnp.bfloat16)
        relu_attention_mosaic_gpu(odd, odd, odd, mask, factor, causal=False)
    with pytest.raises(ValueError, match="whole tiles: 100"):
        short = ok[:, :100]
        relu_attention_mosaic_gpu(short, short, short, mask[:, :100], factor[..., :100], causal=False)
    wide = jnp.zeros((1, 128, 2, 320), jnp.bfloat16)
    assert "head dims up to 256, got 320" in supported(wide, wide, wide, MgpuBlockSizes())
    d256 = jnp.zeros((1, 128, 2, 256), jnp.bfloat16)
    assert "over 128 (they would spill)" in supported(d256, d256, d256, MgpuBlockSizes())  # the dk/dv registers
    triton_backward = MgpuBlockSizes(backward="triton")
    assert supported(d256, d256, d256, triton_backward) is None  # the forward: 192 KiB of tiles
    assert "over the 232448 a Hopper block has" in supported(
        d256, d256, d256, MgpuBlockSizes(stages=3, backward="triton")
    )
    assert "of one dtype" in supported(ok, ok.astype(jnp.float16), ok, MgpuBlockSizes())
    odd_pairs = jnp.zeros((1, 192, 2, 64), jnp.bfloat16)  # 3 query tiles: the warp-specialised forward takes pairs
    split = MgpuBlockSizes(backward="mosaic")
    assert "whole tiles: 192 and 192 for 128×64" in supported(odd_pairs, odd_pairs, odd_pairs, split)
    assert supported(odd_pairs, odd_pairs, odd_pairs, dataclasses.replace(split, warp_specialized=False)) is None
    # the fused backward holds two key tiles a block
    fused = MgpuBlockSizes(warp_specialized=False)
    assert "whole tiles: 192 and 192 for 64×128" in supported(odd_pairs, odd_pairs, odd_pairs, fused)
    with pytest.raises(ValueError, match="multiples of 64"):
        MgpuBlockSizes(block_q=32)
    with pytest.raises(ValueError, match="must be one of fused, mosaic, triton, got 'xla'"):
        MgpuBlockSizes(backward="xla")
    with pytest.raises(ValueError, match=r"multiples of 64, got \(64, 64, 64, 96\)"):
        MgpuBlockSizes(block_k_bwd=96)
    with pytest.raises(ValueError, match="stages must be from 2 to 32, got 1"):
        MgpuBlockSizes(stages=1)
    with pytest.raises(ValueError, match="block_k must be at most 256"):
        MgpuBlockSizes(block_k=320)


@pytest.mark.parametrize("version, refused", [(12080, True), (12090, True), (12091, False), (12060, False)])
def test_causal_masks_are_refused_with_the_cuda_versions_whose_ptxas_miscompiles_them(version, refused, monkeypatch):
    """CUDA 12.8.0 up to 12.9.1: as JAX's own attention_mgpu, causal inputs go to Triton (by "gpu"), non-causal
    ones still run; without a CUDA plugin (lowering on a CPU) nothing is refused."""
    import kernels.mosaic_gpu_tiles

    ok = jnp.zeros((1, 128, 2, 64), jnp.bfloat16)
    assert kernels.mosaic_gpu_tiles.cuda_runtime_version() is None or jax.default_backend() == "gpu"
    monkeypatch.setattr(kernels.mosaic_gpu_tiles, "cuda_runtime_version", lambda: version)
    reason = supported(ok, ok, ok, MgpuBlockSizes(), causal=True)
    assert (reason is not None and "ptxas miscompiles causal masks" in reason) == refused, reason
    assert supported(ok, ok, ok, MgpuBlockSizes(), causal=False) is None


@pytest.mark.parametrize(
    "backward, warp_specialized", [("fused", True), ("mosaic", True), ("mosaic", False), ("triton", True)]
)
@pytest.mark.parametrize("causal", [False, True])
def test_matches_reference_outputs_and_gradients_where_it_runs(causal, backward, warp_specialized):
    """On a GPU: outputs and every gradient (γ included) against the fp32 reference. Anywhere else the kernel
    cannot run (JAX's GPU interpret mode cannot execute its wgmma), and saying so is what is checked."""
    t, d = 512, 128
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, (2, t, 4, d), jnp.bfloat16) for key in (kq, kk, kv))
    mask = jnp.arange(t)[None] < jnp.array([[t], [t // 2 + 7]])
    gamma = jnp.array([1.0, 0.5, 2.0, 1.5])

    def loss(q, k, v, gamma, options):
        out = kernels.relu_attention(q, k, v, causal=causal, key_mask=mask, gamma=gamma, options=options)
        return jnp.sum(out.astype(jnp.float32) ** 2), out

    grad = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)
    sizes = MgpuBlockSizes(backward=backward, warp_specialized=warp_specialized)
    options = ReluAttentionOptions(impl="pallas", pallas_backend="mosaic_gpu", pallas_block_sizes=sizes)
    mosaic = jax.jit(lambda *a: grad(*a, options))
    if jax.default_backend() != "gpu":
        with pytest.raises(ValueError, match="interpret mode"):
            mosaic(q, k, v, gamma)
        return
    (_, out), grads = mosaic(q, k, v, gamma)
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    (_, ref), ref_grads = grad(*f32, gamma, ReluAttentionOptions(impl="reference"))
    assert_bf16_matches_reference(out, ref, grads, ref_grads, mask[:, :, None, None])
