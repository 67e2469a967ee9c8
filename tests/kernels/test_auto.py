"""What `impl="auto"` runs (`kernels.auto`): the table's entries and what they speak for, "xla" everywhere else;
which Pallas build `pallas_backend` means (Mosaic GPU on Hopper once it has an entry there, Triton otherwise);
the backend-named impls; what the ops then run on a Hopper GPU (checked by lowering for CUDA)."""

import re
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import kernels
from kernels import LinearAttentionOptions, MgpuChunkSizes, PallasBlockSizes, ReluAttentionOptions, auto, platforms
from kernels.auto import Entry, resolve_pallas_backend
from kernels.platforms import gpu_compute_capability
from tests.kernels.lowering import exported_text

MINOR = ".".join(jax.__version__.split(".")[:2])
REPO = Path(__file__).resolve().parents[2]


def _entry(op="relu_attention", impl="mosaic_gpu", device="cuda-sm90", **fields):
    """An entry under the running jax, as the H200's: bf16 at head dims up to 128, both modes, from length 1."""
    row = dict(op=op, impl=impl, device=device, jax_minor=MINOR, mode="both", min_length=1, dtypes=("bfloat16",),
               max_head_dim=128, tests="benchmarks/gpu/x.txt", benchmark="benchmarks/x.json")  # fmt: skip
    return Entry(**{**row, **fields})


MOSAIC_PASSED = (_entry("relu_attention"), _entry("linear_attention"))


def _takes():
    return None


def _refuses():
    return "lengths that are not whole tiles"


@pytest.mark.parametrize(
    "requested, capability, refusal, expected",
    [
        ("gpu", (9, 0), _takes, "mosaic_gpu"),  # H100 / H200, once Mosaic GPU passed there
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
    assert resolve_pallas_backend(requested, refusal, capability, table=MOSAIC_PASSED) == expected


@pytest.mark.parametrize("op", ["relu_attention", "linear_attention"])
def test_hopper_runs_triton_until_mosaic_gpu_has_passed_there(op):
    """No Mosaic GPU entry for the op on sm_90 (none, another op's, an A100's, one from another jax minor, Triton's):
    "gpu" on an H100 means Triton. An entry: Mosaic GPU."""
    other_op = next(o for o in ("relu_attention", "linear_attention") if o != op)
    for table in (
        (),
        (_entry(other_op),),
        (_entry(op, device="cuda-sm80"),),
        (_entry(op, jax_minor="0.9"),),
        (_entry(op, impl="triton"),),
    ):
        assert resolve_pallas_backend("gpu", _takes, (9, 0), op=op, table=table) == "gpu", table
    assert resolve_pallas_backend("gpu", _takes, (9, 0), op=op, table=(_entry(op),)) == "mosaic_gpu"
    assert resolve_pallas_backend("mosaic_gpu", _takes, (9, 0), op=op, table=()) == "mosaic_gpu"  # by name


def test_default_is_the_running_platform():
    assert resolve_pallas_backend(None, _takes, None) == jax.default_backend()


def test_this_machine_reports_its_capability_or_none():
    capability = gpu_compute_capability()
    if jax.default_backend() != "gpu":
        assert capability is None
    else:
        assert isinstance(capability, tuple) and capability[0] >= 5


def _lowered(attend, t=1024, d=128, dtype=jnp.bfloat16):
    x = jax.ShapeDtypeStruct((1, t, 2, d), dtype)
    text = exported_text(attend, "cuda", x, x, x)
    return text.count("mosaic_gpu_v2"), text.count("__gpu$xla.gpu.triton")


@pytest.fixture
def hopper(monkeypatch):
    """This process as an H100 would see it: a "gpu" backend of compute capability 9.0, device "cuda-sm90"."""
    monkeypatch.setattr(platforms.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(platforms, "gpu_compute_capability", lambda: (9, 0))
    monkeypatch.setattr(platforms, "device_class", lambda device=None: "cuda-sm90")


@pytest.fixture
def table(monkeypatch):
    """`table(*entries)`: the ops' `auto` and `pallas_backend` read these entries instead of the committed ones."""

    return lambda *entries: monkeypatch.setattr(auto, "TABLE", tuple(entries))


def _relu(**options):
    options = ReluAttentionOptions(pallas_interpret=False, **options)
    return lambda q, k, v: kernels.relu_attention(q, k, v, causal=True, options=options)


def _linear(**options):
    options = LinearAttentionOptions(pallas_interpret=False, **options)
    return lambda q, k, v: kernels.linear_attention(jax.nn.relu(q), jax.nn.relu(k), v, causal=True, options=options)


@pytest.mark.lowering
def test_on_hopper_the_ops_run_triton_while_mosaic_gpu_has_no_entry(hopper, table):
    table()
    assert _lowered(_relu(impl="pallas")) == (0, 1)
    assert _lowered(_linear(impl="pallas")) == (0, 1)
    assert _lowered(_relu(impl="pallas", pallas_backend="mosaic_gpu")) == (1, 0)  # by name: runs what is asked
    assert _lowered(_relu(impl="mosaic_gpu")) == (1, 0)
    assert _lowered(_linear(impl="triton")) == (0, 1)
    assert _lowered(_relu()) == (0, 0)  # auto: "xla", no kernel
    assert _lowered(_linear()) == (0, 0)


@pytest.mark.lowering
def test_on_hopper_auto_runs_the_entries_from_their_length(hopper, table):
    table(_entry("relu_attention", "triton", min_length=1024), _entry("linear_attention", min_length=2048))
    assert _lowered(_relu()) == (0, 1)  # Triton's entry, 1,024 ≥ its length
    assert _lowered(_relu(), t=512) == (0, 0)  # below it: xla
    assert _lowered(_linear(), t=2048) == (2, 0)  # Mosaic GPU's entry, and it takes the inputs
    assert _lowered(_linear()) == (0, 0)  # 1,024 < 2,048: xla


@pytest.mark.lowering
def test_auto_takes_the_triton_linear_kernels_only_at_the_measured_shapes(hopper, table):
    """An entry measured in bf16 at D 128, causal (as the committed one): wider features or float32 stay on xla
    under auto; asked for by name, the kernels run."""
    table(_entry("linear_attention", "triton", mode="causal", min_length=1024))
    assert _lowered(_linear()) == (0, 1)  # causal, 1,024, bf16, D 128: the Triton kernels
    assert _lowered(_linear(), d=256) == (0, 0)
    assert _lowered(_linear(), dtype=jnp.float32) == (0, 0)
    assert _lowered(_linear(impl="triton"), d=256) == (0, 1)


@pytest.mark.lowering
def test_on_hopper_the_ops_run_the_mosaic_kernels_where_they_can(hopper, table):
    table(*MOSAIC_PASSED)

    def relu(**kw):
        return _relu(impl="pallas", **kw)

    def linear(**kw):
        return _linear(impl="pallas", **kw)

    assert _lowered(relu()) == (1, 0)
    assert _lowered(linear()) == (2, 0)
    assert _lowered(relu(), t=1000) == (0, 1)  # not whole tiles: Triton masks the tail
    assert _lowered(linear(), dtype=jnp.float32) == (0, 1)  # fp32: Triton
    assert _lowered(relu(pallas_block_sizes=PallasBlockSizes())) == (0, 1)  # Triton's tiles asked for
    assert _lowered(linear(pallas_block_sizes=MgpuChunkSizes(64))) == (2, 0)  # its own sizes type
    assert _lowered(linear(chunk_size=32)) == (0, 1)  # a chunk the Mosaic kernels do not take
    assert _lowered(relu(pallas_backend="triton")) == (0, 1)

    def row_stats(q, k, v):  # the fused statistics are the Triton forward kernel's
        options = ReluAttentionOptions(impl="pallas", pallas_interpret=False)
        out, s, e = kernels.relu_attention_and_row_stats(q, k, v, causal=True, options=options)
        return out + (s + e)[..., None].astype(out.dtype)

    assert _lowered(row_stats) == (0, 1)


# ------------------------------------------------------------------------------------------------------------
# The table
# ------------------------------------------------------------------------------------------------------------


def _pick(op, length, refusals=None, *, device="cuda-sm90", causal=True, dtype=jnp.bfloat16, head_dim=128):
    """`auto.pick` for inputs like the H200 benchmark's (bf16, head dim 128) unless told otherwise."""
    return auto.pick(op, causal=causal, length=length, dtype=dtype, head_dim=head_dim, refusals=refusals, device=device)


def test_every_committed_entry_cites_files_that_are_committed():
    assert auto.TABLE
    for entry in auto.TABLE:
        assert (REPO / entry.tests).is_file() and (REPO / entry.benchmark).is_file(), entry
        assert re.fullmatch(r"cuda-sm\d+|tpu-v\w+", entry.device), entry


def test_the_committed_table_picks_the_h200_runs_and_nothing_else():
    """Read by hand from the table's two entries (both rest on the H200 runs of 2026-11-28, jax 0.11): Triton
    linear attention from causal 4K in bf16 at D ≤ 128, cuDNN softmax in half precision at D ≤ 128."""
    cases = {
        ("linear_attention", "cuda-sm90", 4096, True, jnp.bfloat16, 128): "triton",
        ("linear_attention", "cuda-sm90", 4095, True, jnp.bfloat16, 128): "xla",
        ("linear_attention", "cuda-sm90", 1 << 20, False, jnp.bfloat16, 128): "xla",
        ("linear_attention", "cuda-sm90", 4096, True, jnp.float16, 128): "xla",
        ("linear_attention", "cuda-sm90", 4096, True, jnp.bfloat16, 129): "xla",
        ("linear_attention", "cuda-sm80", 4096, True, jnp.bfloat16, 128): "xla",
        ("softmax_attention", "cuda-sm90", 1, False, jnp.float16, 64): "cudnn",
        ("softmax_attention", "cuda-sm90", 4096, True, jnp.float32, 64): "xla",
        ("softmax_attention", "cuda-sm100", 4096, True, jnp.bfloat16, 64): "xla",
        ("relu_attention", "cuda-sm90", 1 << 20, True, jnp.bfloat16, 128): "xla",
    }
    for (op, device, length, causal, dtype, head_dim), expected in cases.items():
        got = auto.pick(op, causal=causal, length=length, dtype=dtype, head_dim=head_dim, device=device,
                        jax_version="0.11.2")  # fmt: skip
        assert got == expected, (op, device, length, causal, dtype, head_dim)
    for device in auto.GENERATIONS:  # no entry under another jax minor, nor anywhere on a CPU or TPU
        for op in auto.OPS:
            assert _pick(op, 1 << 20, device=device) in ("xla", "triton", "cudnn")
            assert auto.pick(op, causal=True, length=4096, dtype=jnp.bfloat16, head_dim=128, device=device,
                             jax_version="0.10.2") == "xla"  # fmt: skip
            if not device.startswith("cuda"):
                assert _pick(op, 1 << 20, device=device) == "xla"


def test_an_entry_speaks_for_its_device_jax_mode_length_dtypes_and_head_dims(table):
    triton = _entry("linear_attention", "triton", mode="causal", min_length=1024)
    table(triton)
    assert _pick("linear_attention", 2048) == _pick("linear_attention", 1024) == "triton"
    assert _pick("linear_attention", 1023) == "xla"  # below its length
    assert _pick("linear_attention", 2048, causal=False) == "xla"  # another mode
    assert _pick("relu_attention", 2048) == "xla"  # another op
    assert _pick("linear_attention", 2048, device="cuda-sm80") == "xla"  # another generation
    assert _pick("linear_attention", 2048, dtype=jnp.float32) == "xla"
    assert _pick("linear_attention", 2048, head_dim=256) == "xla"
    assert auto.pick("linear_attention", causal=True, length=2048, dtype=jnp.bfloat16, head_dim=64,
                     device="cuda-sm90", jax_version="0.9.1") == "xla"  # another jax minor  # fmt: skip
    assert (
        triton.refusal(causal=True, length=2048, dtype=jnp.float32, head_dim=64) == "measured in bfloat16, not float32"
    )
    assert (
        triton.refusal(causal=True, length=2048, dtype=jnp.bfloat16, head_dim=256)
        == "measured at head dims ≤ 128, not 256"
    )
    assert (
        triton.refusal(causal=False, length=2048, dtype=jnp.bfloat16, head_dim=64)
        == "measured for causal attention only"
    )
    # The first entry that speaks and whose implementation takes the inputs wins.
    mosaic = _entry("linear_attention", "mosaic_gpu", min_length=1024)
    table(mosaic, triton)
    assert _pick("linear_attention", 2048, {"mosaic_gpu": _takes}) == "mosaic_gpu"
    assert _pick("linear_attention", 2048, {"mosaic_gpu": _refuses}) == "triton"
    table(_entry("relu_attention", "mosaic_tpu", "tpu-v5e", min_length=2048))
    assert (
        _pick("relu_attention", 4096, device="tpu-v5e")
        == _pick("relu_attention", 4096, device="tpu-v5e", causal=False)
        == "mosaic_tpu"
    )


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"op": "softmax"}, "unknown op or implementation"),
        ({"impl": "cudnn"}, "unknown op or implementation"),  # not a ReLU implementation
        ({"mode": "causal_only"}, "mode must be causal, full or both"),
        ({"tests": "runs/x.txt"}, "tests must cite a file under benchmarks/gpu/"),
    ],
)
def test_a_malformed_entry_is_an_error_naming_it(fields, message):
    with pytest.raises(ValueError, match=message):
        _entry(**fields)


def test_the_ops_with_auto_run_xla_here_and_on_a_device_with_no_entry(monkeypatch):
    """`impl="auto"` gives exactly the "xla" impl (same numbers), for both ops: on this CPU, and on a GPU and a
    TPU generation with no entry (this process pretending to be one; the ops still run here)."""
    q, k, v = (jax.random.normal(jax.random.key(i), (1, 96, 2, 16)) for i in range(3))
    phi = jax.nn.elu(q) + 1, jax.nn.elu(k) + 1
    for device_cls in ("here", "cuda-sm80", "tpu-v5e"):
        if device_cls != "here":
            monkeypatch.setattr(platforms, "device_class", lambda device=None, name=device_cls: name)
        for causal in (False, True):
            auto_out = kernels.relu_attention(q, k, v, causal=causal)
            assert jnp.array_equal(auto_out, kernels.relu_attention(q, k, v, causal=causal, impl="xla")), device_cls
            auto_out = kernels.linear_attention(*phi, v, causal=causal)
            assert jnp.array_equal(auto_out, kernels.linear_attention(*phi, v, causal=causal, impl="xla")), device_cls


def test_the_impl_keyword_takes_the_place_of_the_options_impl():
    q, k, v = (jax.random.normal(jax.random.key(i), (1, 64, 2, 16)) for i in range(3))
    reference = kernels.relu_attention(q, k, v, impl="reference")
    by_options = kernels.relu_attention(q, k, v, options=ReluAttentionOptions(impl="reference"))
    assert jnp.array_equal(reference, by_options)
    xla_options = ReluAttentionOptions(impl="xla", xla_block_k=16)
    assert jnp.array_equal(kernels.relu_attention(q, k, v, impl="reference", options=xla_options), reference)
    with pytest.raises(ValueError, match="ReluAttentionOptions.impl: unknown relu_attention impl 'cuda'"):
        kernels.relu_attention(q, k, v, impl="cuda")


def test_the_docs_table_is_the_code_table():
    """docs/kernels.md shows `python -m kernels.auto --markdown` verbatim (regenerate it with that command)."""
    assert auto.markdown() in (REPO / "docs" / "kernels.md").read_text()


@pytest.mark.parametrize(
    "platform, kind, capability, expected",
    [
        ("gpu", "NVIDIA H100 80GB HBM3", "9.0", "cuda-sm90"),
        ("gpu", "NVIDIA A100-SXM4-40GB", "8.0", "cuda-sm80"),
        ("gpu", "NVIDIA B200", "10.0", "cuda-sm100"),
        ("gpu", "AMD Instinct MI300X", "gfx942", "gpu-amd-instinct-mi300x"),
        ("tpu", "TPU v4", None, "tpu-v4"),
        ("tpu", "TPU v5 lite", None, "tpu-v5e"),
        ("tpu", "TPU v5e", None, "tpu-v5e"),
        ("tpu", "TPU v5p", None, "tpu-v5p"),
        ("tpu", "TPU v6 lite", None, "tpu-v6e"),
        ("cpu", "cpu", None, "cpu"),
    ],
)
def test_device_class(platform, kind, capability, expected):
    device = types.SimpleNamespace(platform=platform, device_kind=kind, compute_capability=capability)
    assert platforms.device_class(device) == expected


def test_this_machine_has_a_device_class():
    expected = {"cpu": r"cpu", "gpu": r"cuda-sm\d+|gpu-[a-z0-9-]+", "tpu": r"tpu-v\w+"}[jax.default_backend()]
    assert re.fullmatch(expected, platforms.device_class()), platforms.device_class()
