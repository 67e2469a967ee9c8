"""impl="pallas" linear attention (interpret mode on CPU) equals "reference": outputs and every gradient."""

import chex
import jax
import jax.numpy as jnp
import pytest

import kernels
from kernels import LinearAttentionOptions, LinearBlockSizes
from tests.kernels.tolerances import assert_matches_reference, fp32, pallas_against_reference

F32_TOL = fp32(2e-5)  # tests/kernels/tolerances.py: exact fp32 on the CPU, TF32 / bf16 passes elsewhere


def _inputs(t=45, m=12, d=6, dtype=jnp.float32):
    k0, k1, k2 = jax.random.split(jax.random.key(0), 3)
    phi_q = jax.nn.softplus(jax.random.normal(k0, (2, t, 2, m))).astype(dtype)
    phi_k = jax.nn.softplus(jax.random.normal(k1, (2, t, 2, m))).astype(dtype)
    v = jax.random.normal(k2, (2, t, 2, d)).astype(dtype)
    mask = jnp.arange(t)[None] < jnp.array([[t], [t // 2]])
    return phi_q, phi_k, v, mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype, t, chunk", [(jnp.float32, 45, 16), (jnp.bfloat16, 37, 16), (jnp.float32, 20, 32)])
def test_pallas_matches_reference(causal, dtype, t, chunk):
    phi_q, phi_k, v, mask = _inputs(t=t, dtype=dtype)
    w = jax.random.normal(jax.random.key(5), v.shape)
    f32 = lambda x: x.astype(jnp.float32)

    def loss(a, b, c, impl):
        options = LinearAttentionOptions(impl=impl, chunk_size=chunk)
        out = kernels.linear_attention(a, b, c, causal=causal, key_mask=mask, options=options)
        return jnp.sum(f32(out) * w), out

    out, ref, errors = pallas_against_reference(loss, (phi_q, phi_k, v), ("dphi_q", "dphi_k", "dv"))
    assert_matches_reference(out, ref, errors, dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_dk_through_the_normaliser(causal):
    # v = 1: the output is 1 − ε/(den+ε), so φ(k) reaches the loss only through z (the r term).
    phi_q, phi_k, v, mask = _inputs()
    ones = jnp.ones_like(v)

    def f(phi_k, impl):
        options = LinearAttentionOptions(impl=impl)
        return jnp.sum(
            kernels.linear_attention(phi_q, phi_k, ones, causal=causal, key_mask=mask, eps=1.0, options=options)
        )

    ref = jax.grad(f)(phi_k, "reference")
    got = jax.grad(f)(phi_k, "pallas")
    assert float(jnp.abs(ref).max()) > 1e-4
    chex.assert_trees_all_close(got, ref, atol=fp32(1e-6), rtol=fp32(1e-4))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d, block_dv", [(48, 16), (40, 32), (20, 64)])
def test_value_columns_split_over_programs_give_the_same_output_and_gradients(causal, d, block_dv):
    """block_dv: d_v padded to a power of two, split into blocks (4, 2 and 1 of them here); dφq and dφk are
    sums over the blocks, with the normaliser's term counted once."""
    phi_q, phi_k, v, mask = _inputs(t=40, d=d)
    w = jax.random.normal(jax.random.key(6), v.shape)
    sizes = LinearBlockSizes(chunk=16, block_dv=block_dv)

    def loss(a, b, c, impl):
        options = LinearAttentionOptions(impl=impl, pallas_block_sizes=sizes)
        out = kernels.linear_attention(a, b, c, causal=causal, key_mask=mask, eps=0.5, options=options)
        return jnp.sum(out * w), out

    out, ref, errors = pallas_against_reference(loss, (phi_q, phi_k, v), ("dphi_q", "dphi_k", "dv"))
    chex.assert_trees_all_close(out, ref, atol=F32_TOL, rtol=F32_TOL)
    for name, err in errors.items():
        assert err < F32_TOL, f"{name}: relative error {err:.2e}"


def test_block_dv_must_be_a_power_of_two():
    with pytest.raises(ValueError, match=r"LinearBlockSizes.block_dv=24 must be a power of two ≥ 16"):
        LinearBlockSizes(block_dv=24)


def _kernel_product_dtypes(dtype) -> dict[str, set[tuple[str, str]]]:
    """The operand dtypes of every product inside each Triton kernel of the op's gradient, read from its jaxpr."""
    x = jnp.ones((1, 128, 2, 32), dtype)

    def loss(a, b, c):
        return kernels.linear_attention(a, b, c, causal=True, impl="triton").astype(jnp.float32).sum()

    found: dict[str, set[tuple[str, str]]] = {}

    def walk(jaxpr, kernel=None):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                name = eqn.params.get("name_and_src_info") or eqn.params.get("name")  # jax 0.11 or 0.10
                walk(eqn.params["jaxpr"], str(name).split()[0])
            elif eqn.primitive.name == "dot_general" and kernel:
                found.setdefault(kernel, set()).add(tuple(v.aval.dtype.name for v in eqn.invars))
            for param in eqn.params.values():
                inner = getattr(param, "jaxpr", param)
                if hasattr(inner, "eqns"):
                    walk(inner, kernel)

    walk(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(x, x, x).jaxpr)
    return found


def test_half_precision_products_take_bf16_operands_and_float16_takes_fp32():
    """bf16 inputs: every product of the forward and backward kernels takes bf16 operands (fp32 ones run at half
    the tensor-core rate, or as TF32); float16 ones take fp32, as g = dO/den may pass float16's range."""
    kernels_seen = {"linear_attention_fwd", "linear_attention_bwd_dq", "linear_attention_bwd_dkdv"}
    bf16 = _kernel_product_dtypes(jnp.bfloat16)
    assert set(bf16) == kernels_seen and all(d == {("bfloat16", "bfloat16")} for d in bf16.values()), bf16
    fp16 = _kernel_product_dtypes(jnp.float16)
    assert all(
        ("float32", "float32") in fp16[name] for name in ("linear_attention_bwd_dq", "linear_attention_bwd_dkdv")
    )
