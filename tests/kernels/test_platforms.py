"""Which kernels `pallas_backend` picks: Mosaic GPU on Hopper for inputs those kernels take, Triton before
and after Hopper and where they do not, and what the ops then run (checked by lowering for CUDA)."""

import jax
import jax.numpy as jnp
import pytest
from jax import export

import kernels
from kernels.linear_attention_mgpu import MgpuChunkSizes
from kernels.platforms import gpu_compute_capability, resolve_pallas_backend
from kernels.relu_attention_pallas import PallasBlockSizes


def _takes():
    return None


def _refuses():
    return "lengths that are not whole tiles"


@pytest.mark.parametrize(
    "requested, capability, refusal, expected",
    [
        ("gpu", (9, 0), _takes, "mosaic_gpu"),  # H100 / H200
        ("gpu", (9, 0), _refuses, "gpu"),  # Hopper, inputs the Mosaic kernels do not take: Triton
        ("gpu", (8, 0), _takes, "gpu"),  # A100: no wgmma
        ("gpu", (8, 9), _takes, "gpu"),  # L4 / Ada
        ("gpu", (10, 0), _takes, "gpu"),  # Blackwell: wgmma is Hopper-only
        ("gpu", None, _takes, "gpu"),  # lowering for CUDA on a machine without a GPU
        ("triton", (9, 0), _takes, "gpu"),  # asked for by name
        ("mosaic_gpu", None, _refuses, "mosaic_gpu"),  # by name: the kernel itself says why not
        ("tpu", None, _takes, "tpu"),
    ],
)
def test_backend_follows_compute_capability_and_the_inputs(requested, capability, refusal, expected):
    assert resolve_pallas_backend(requested, refusal, capability) == expected


def test_default_is_the_running_platform_and_unknown_names_are_refused():
    assert resolve_pallas_backend(None, _takes, None) == jax.default_backend()
    with pytest.raises(ValueError, match="unknown pallas_backend 'cuda'; valid: tpu, gpu, triton, mosaic_gpu"):
        resolve_pallas_backend("cuda", _takes, None)


def test_this_machine_reports_its_capability_or_none():
    capability = gpu_compute_capability()
    if jax.default_backend() != "gpu":
        assert capability is None
    else:
        assert isinstance(capability, tuple) and capability[0] >= 5


def _lowered(attend, t=1024, d=128, dtype=jnp.bfloat16):
    x = jax.ShapeDtypeStruct((1, t, 2, d), dtype)
    unchecked = [export.DisabledSafetyCheck.custom_call(n) for n in ("mosaic_gpu_v2", "__gpu$xla.gpu.triton")]
    text = export.export(jax.jit(attend), platforms=["cuda"], disabled_checks=unchecked)(x, x, x).mlir_module()
    return text.count("mosaic_gpu_v2"), text.count("__gpu$xla.gpu.triton")


@pytest.fixture
def hopper(monkeypatch):
    """This process as an H100 would see it: a "gpu" backend of compute capability 9.0."""
    import kernels.platforms

    monkeypatch.setattr(kernels.platforms.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(kernels.platforms, "gpu_compute_capability", lambda: (9, 0))


def test_on_hopper_the_ops_run_the_mosaic_kernels_where_they_can(hopper):
    def relu(**kw):
        return lambda q, k, v: kernels.relu_attention(q, k, v, causal=True, impl="pallas", pallas_interpret=False, **kw)

    def linear(**kw):
        return lambda q, k, v: kernels.linear_attention(
            jax.nn.relu(q), jax.nn.relu(k), v, causal=True, impl="pallas", pallas_interpret=False, **kw
        )

    assert _lowered(relu()) == (1, 0)
    assert _lowered(linear()) == (2, 0)
    assert _lowered(relu(), t=1000) == (0, 1)  # not whole tiles: Triton masks the tail
    assert _lowered(linear(), dtype=jnp.float32) == (0, 1)  # fp32: Triton
    assert _lowered(relu(pallas_block_sizes=PallasBlockSizes())) == (0, 1)  # Triton's tiles asked for
    assert _lowered(linear(pallas_block_sizes=MgpuChunkSizes(64))) == (2, 0)  # its own sizes type
    assert _lowered(linear(chunk_size=32)) == (0, 1)  # a chunk the Mosaic kernels do not take
    assert _lowered(relu(pallas_backend="triton")) == (0, 1)

    def row_stats(q, k, v):  # the fused statistics are the Triton forward kernel's
        out, s, e = kernels.relu_attention_and_row_stats(q, k, v, causal=True, impl="pallas", pallas_interpret=False)
        return out + (s + e)[..., None].astype(out.dtype)

    assert _lowered(row_stats) == (0, 1)
