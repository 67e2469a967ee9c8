"""Which kernels `pallas_backend` picks: Mosaic GPU on Hopper for inputs those kernels take once they have a
passing record there, Triton before and after Hopper and where they do not, and what the ops then run (checked
by lowering for CUDA); which kernels `impl="auto"` may pick (only those the committed record says passed on the
device class, from their measured crossover length); the record's format and how a GPU run writes it."""

import dataclasses
import json
import re
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import kernels
import kernels.platforms as platforms
from kernels import LinearAttentionOptions, MgpuChunkSizes, PallasBlockSizes, ReluAttentionOptions
from kernels.platforms import KernelRun, gpu_compute_capability, resolve_pallas_backend
from tests.kernels.lowering import exported_text

HERE = jax.__version__
REPO = Path(__file__).resolve().parents[2]


def _run(
    op="relu_attention",
    backend="mosaic_gpu",
    device_class="cuda-sm90",
    passed=True,
    auto_from_length=None,
    jax_version=HERE,
    date="2026-11-25",
):
    """A record; one with a crossover measured, as the H200's, in bf16 at head dims up to 128."""
    measured = {"auto_dtypes": ["bfloat16"], "auto_max_head_dim": 128} if auto_from_length is not None else {}
    return KernelRun(
        op, backend, device_class, "a device", jax_version, "abc1234", date, passed, "t", auto_from_length, **measured
    )


MOSAIC_PASSED = (_run("relu_attention"), _run("linear_attention"))


def _takes():
    return None


def _refuses():
    return "lengths that are not whole tiles"


@pytest.mark.every_case
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
    assert resolve_pallas_backend(requested, refusal, capability, records=MOSAIC_PASSED) == expected


@pytest.mark.parametrize("op", platforms.OPS)
def test_hopper_runs_triton_until_mosaic_gpu_has_passed_there(op):
    """No passing Mosaic GPU record for the op on sm_90 (none, a failed one, another op's, an A100's, or one
    from another jax minor): "gpu" on an H100 means Triton. A passing one: Mosaic GPU."""
    other_op = next(o for o in platforms.OPS if o != op)
    for records in (
        (),
        (_run(op, passed=False),),
        (_run(other_op),),
        (_run(op, device_class="cuda-sm80"),),
        (_run(op, jax_version="0.9.0"),),
        (_run(op, backend="triton"),),
    ):
        assert resolve_pallas_backend("gpu", _takes, (9, 0), op=op, records=records) == "gpu", records
    assert resolve_pallas_backend("gpu", _takes, (9, 0), op=op, records=(_run(op),)) == "mosaic_gpu"
    assert resolve_pallas_backend("mosaic_gpu", _takes, (9, 0), op=op, records=()) == "mosaic_gpu"  # by name


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
    text = exported_text(attend, "cuda", x, x, x)
    return text.count("mosaic_gpu_v2"), text.count("__gpu$xla.gpu.triton")


@pytest.fixture
def hopper(monkeypatch):
    """This process as an H100 would see it: a "gpu" backend of compute capability 9.0."""
    import kernels.platforms

    monkeypatch.setattr(kernels.platforms.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(kernels.platforms, "gpu_compute_capability", lambda: (9, 0))


def _relu(**options):
    options = ReluAttentionOptions(pallas_interpret=False, **options)
    return lambda q, k, v: kernels.relu_attention(q, k, v, causal=True, options=options)


def _linear(**options):
    options = LinearAttentionOptions(pallas_interpret=False, **options)
    return lambda q, k, v: kernels.linear_attention(jax.nn.relu(q), jax.nn.relu(k), v, causal=True, options=options)


@pytest.mark.lowering
def test_on_hopper_the_ops_run_triton_while_mosaic_gpu_has_no_passing_record(hopper, monkeypatch):
    monkeypatch.setattr(platforms, "_committed_passes", lambda: ())
    assert _lowered(_relu(impl="pallas")) == (0, 1)
    assert _lowered(_linear(impl="pallas")) == (0, 1)
    assert _lowered(_relu(impl="pallas", pallas_backend="mosaic_gpu")) == (1, 0)  # by name: runs what is asked
    assert _lowered(_relu()) == (0, 0)  # auto: "xla", no kernel
    assert _lowered(_linear()) == (0, 0)


@pytest.mark.lowering
def test_on_hopper_auto_runs_the_kernels_that_passed_from_their_crossover_length(hopper, monkeypatch):
    records = (_run("relu_attention", "triton", auto_from_length=1024), _run("linear_attention", auto_from_length=2048))
    monkeypatch.setattr(platforms, "device_class", lambda device=None: "cuda-sm90")
    monkeypatch.setattr(platforms, "_committed_passes", lambda: records)
    assert _lowered(_relu()) == (0, 1)  # Triton passed, 1,024 ≥ its crossover
    assert _lowered(_relu(), t=512) == (0, 0)  # below it: xla
    assert _lowered(_linear(), t=2048) == (2, 0)  # Mosaic GPU passed and takes the inputs
    assert _lowered(_linear()) == (0, 0)  # 1,024 < 2,048: xla


@pytest.mark.lowering
def test_auto_takes_the_triton_linear_kernels_only_at_the_measured_shapes(hopper, monkeypatch):
    """A crossover measured in bf16 at D 128 (as the committed one): wider features or float32 stay on xla under
    auto."""
    records = (_run("linear_attention", "triton", auto_from_length={"causal": 1024, "full": None}),)
    monkeypatch.setattr(platforms, "device_class", lambda device=None: "cuda-sm90")
    monkeypatch.setattr(platforms, "_committed_passes", lambda: records)
    assert _lowered(_linear()) == (0, 1)  # causal, 1,024, bf16, D 128: the Triton kernels
    assert _lowered(_linear(), d=256) == (0, 0)
    assert _lowered(_linear(), dtype=jnp.float32) == (0, 0)
    assert _lowered(_linear(impl="pallas"), d=256) == (0, 1)  # asked for by name: runs what is asked


@pytest.mark.lowering
def test_on_hopper_the_ops_run_the_mosaic_kernels_where_they_can(hopper, monkeypatch):
    monkeypatch.setattr(platforms, "_committed_passes", lambda: MOSAIC_PASSED)

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
# The record and `impl="auto"`
# ------------------------------------------------------------------------------------------------------------

DEVICE_CLASSES = ["cpu", "cuda-sm80", "cuda-sm89", "cuda-sm90", "cuda-sm100", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"]


@pytest.fixture
def pretend(monkeypatch):
    """`pretend(device_cls, records)`: this process as a machine of that class, with that committed table."""

    def set_up(device_cls, records):
        platform = "gpu" if device_cls.startswith("cuda") else device_cls.split("-")[0]
        monkeypatch.setattr(platforms.jax, "default_backend", lambda: platform)
        monkeypatch.setattr(platforms, "device_class", lambda device=None: device_cls)
        monkeypatch.setattr(platforms, "_committed_passes", lambda: tuple(records))

    return set_up


def _auto(op, length, refusals=None, *, causal=True, dtype=jnp.bfloat16, head_dim=128):
    """`auto_pallas_backend` for inputs like the H200 benchmark's (bf16, head dim 128) unless told otherwise."""
    return platforms.auto_pallas_backend(op, length, refusals or {}, causal=causal, dtype=dtype, head_dim=head_dim)


def test_the_committed_record_reads_and_names_known_ops_backends_and_classes():
    records = platforms.read_passes()
    assert records, "kernels/kernel_passes.json is empty"
    for r in records:
        assert r.device_class in DEVICE_CLASSES or r.device_class.startswith(("cuda-sm", "tpu-v")), r
        assert r.tests and r.commit and r.device, r


def _expected_pick(raw_records: list[dict], device_cls: str, op: str, length: int, causal: bool) -> str | None:
    """What auto should pick for bf16 inputs of head dim 128, read from the JSON by hand: a passing record of
    this class and op whose crossover for this mode is measured, at that length or beyond."""
    picks = [
        r["backend"]
        for r in raw_records
        if r["passed"] and r["device_class"] == device_cls and r["op"] == op
        and (r["auto_from_length"] or {}).get("causal" if causal else "full") is not None
        and length >= r["auto_from_length"]["causal" if causal else "full"]
        and "bfloat16" in r["auto_dtypes"] and r["auto_max_head_dim"] >= 128
    ]  # fmt: skip
    assert len(picks) <= 1, picks  # one build an op and class today; a second would need an order here
    return picks[0] if picks else None


@pytest.mark.every_case
@pytest.mark.parametrize("device_cls", DEVICE_CLASSES)
def test_auto_picks_what_the_committed_record_says_and_nothing_else(device_cls, pretend):
    """The committed table, as if recorded under the running jax: auto picks a build only where a record of this
    class passed and measured a crossover at or below the length; every other case gets "xla" (None)."""
    raw = json.loads((REPO / "kernels" / "kernel_passes.json").read_text())
    records = [dataclasses.replace(r, jax_version=HERE) for r in platforms.read_passes()]
    pretend(device_cls, records)
    picked = 0
    for op in platforms.OPS:
        for length in (1, 1024, 4095, 4096, 1 << 20):
            for causal in (True, False):
                expected = _expected_pick(raw, device_cls, op, length, causal)
                assert _auto(op, length, {"mosaic_gpu": _takes}, causal=causal) == expected, (op, length, causal)
                picked += expected is not None
    # The table's one measured crossover (H200 Triton linear, causal, from 4,096) is reached at two lengths.
    assert picked == (2 if device_cls == "cuda-sm90" else 0)


def test_auto_follows_a_passing_record_from_its_crossover_length(pretend):
    triton = _run("linear_attention", "triton", auto_from_length=1024)
    pretend("cuda-sm90", [triton])
    assert _auto("linear_attention", 2048, causal=True) == "triton"
    assert _auto("linear_attention", 1024, causal=True) == "triton"
    assert _auto("linear_attention", 1023, causal=True) is None  # below the crossover
    assert _auto("relu_attention", 2048, causal=True) is None  # another op
    pretend("cuda-sm80", [triton])
    assert _auto("linear_attention", 2048, causal=True) is None  # another device class
    pretend("cuda-sm90", [dataclasses.replace(triton, jax_version="0.9.1")])
    assert _auto("linear_attention", 2048, causal=True) is None  # another jax minor
    pretend("cuda-sm90", [dataclasses.replace(triton, auto_from_length=None, auto_dtypes=None, auto_max_head_dim=None)])
    # passed, never measured faster
    assert _auto("linear_attention", 2048, causal=True) is None
    pretend("cpu", [dataclasses.replace(triton, device_class="cpu")])
    assert _auto("linear_attention", 2048, causal=True) is None  # interpret: never auto
    # Hopper prefers Mosaic GPU when both passed, unless it refuses the inputs.
    mosaic = _run("linear_attention", "mosaic_gpu", auto_from_length=1024)
    pretend("cuda-sm90", [triton, mosaic])
    assert _auto("linear_attention", 2048, {"mosaic_gpu": _takes}, causal=True) == "mosaic_gpu"
    assert _auto("linear_attention", 2048, {"mosaic_gpu": _refuses}, causal=True) == "triton"
    pretend("tpu-v5e", [_run("relu_attention", "tpu", "tpu-v5e", auto_from_length=2048)])
    assert _auto("relu_attention", 4096, causal=True) == "tpu"
    assert _auto("relu_attention", 4096, causal=False) == "tpu"  # one length: both


def test_a_crossover_by_mode_applies_to_its_own_mode_only(pretend):
    """Causal and full attention can cross over apart (on an H200 the Triton linear kernels beat XLA causal at 4K
    and 16K, and lose at 16K without the mask): each mode follows its own length."""
    pretend("cuda-sm90", [_run("linear_attention", "triton", auto_from_length={"causal": 4096, "full": None})])
    assert _auto("linear_attention", 4096, causal=True) == "triton"
    assert _auto("linear_attention", 4095, causal=True) is None
    assert _auto("linear_attention", 1 << 20, causal=False) is None


def test_a_crossover_speaks_only_for_the_inputs_it_was_measured_at(pretend):
    """The H200's record of the Triton linear kernels: crossover measured in bf16 at head dim 128, so auto leaves
    float32, float16 and wider heads (whose larger state may not fit in shared memory) to "xla"."""
    (committed,) = [r for r in platforms.read_passes() if r.passed and r.op == "linear_attention"]
    assert (committed.auto_dtypes, committed.auto_max_head_dim) == (["bfloat16"], 128)
    pretend("cuda-sm90", [dataclasses.replace(committed, jax_version=HERE)])

    def plan(dtype, head_dim, length=4096):
        return LinearAttentionOptions().plan(length, _takes, causal=True, dtype=dtype, head_dim=head_dim)

    assert plan(jnp.bfloat16, 128) == plan(jnp.bfloat16, 32) == ("pallas", "gpu")
    assert plan(jnp.bfloat16, 128, length=2048) == ("xla", None)  # below the crossover
    assert plan(jnp.float32, 128) == plan(jnp.float16, 64) == plan(jnp.bfloat16, 129) == ("xla", None)
    assert committed.input_refusal(jnp.float32, 64) == "its crossover was measured in bfloat16, not float32"
    assert committed.input_refusal(jnp.bfloat16, 256) == "its crossover was measured at head dims ≤ 128, not 256"
    wider = dataclasses.replace(committed, auto_dtypes=["float32", "bfloat16"], auto_max_head_dim=256)
    assert wider.input_refusal(jnp.float32, 256) is None
    never = dataclasses.replace(committed, auto_from_length=None, auto_dtypes=None, auto_max_head_dim=None)
    with pytest.raises(ValueError, match="has no crossover"):
        never.input_refusal(jnp.bfloat16, 64)


def test_the_newest_passing_run_counts():
    old = _run(date="2026-01-01", auto_from_length=4096)
    new = _run(date="2026-11-25", auto_from_length=1024)
    assert platforms.passing_run("relu_attention", "mosaic_gpu", "cuda-sm90", records=[new, old]) == new
    assert platforms.passing_run("relu_attention", "mosaic_gpu", "cuda-sm90", records=[old, new]) == new


def test_the_ops_with_auto_run_xla_here_and_on_a_device_class_with_no_pass(pretend):
    """`impl="auto"` gives exactly the "xla" impl (same numbers), for both ops: on this CPU, and on a GPU and a
    TPU class that no kernel has passed on (this process pretending to be one; the ops still run here)."""
    q, k, v = (jax.random.normal(jax.random.key(i), (1, 96, 2, 16)) for i in range(3))
    phi = jax.nn.elu(q) + 1, jax.nn.elu(k) + 1
    for device_cls in ("here", "cuda-sm80", "tpu-v5e"):
        if device_cls != "here":
            pretend(device_cls, [])
        for causal in (False, True):
            auto = kernels.relu_attention(q, k, v, causal=causal)
            xla = ReluAttentionOptions(impl="xla")
            assert jnp.array_equal(auto, kernels.relu_attention(q, k, v, causal=causal, options=xla)), device_cls
            auto = kernels.linear_attention(*phi, v, causal=causal)
            xla = LinearAttentionOptions(impl="xla")
            assert jnp.array_equal(auto, kernels.linear_attention(*phi, v, causal=causal, options=xla)), device_cls


@pytest.mark.every_case
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


@pytest.mark.every_case
@pytest.mark.parametrize(
    "row, message",
    [
        ({"op": "softmax"}, "unknown op 'softmax'"),
        ({"backend": "cuda"}, "unknown backend 'cuda'"),
        ({"passed": "yes"}, "passed must be true or false"),
        ({"passed": False, "auto_from_length": 1024}, "auto_from_length is set on a run that did not pass"),
        ({"auto_from_length": 1.5}, "auto_from_length must be a whole number"),
        ({"auto_from_length": {"causal": 1024}}, "needs exactly the keys causal and full, got \\['causal'\\]"),
        ({"auto_from_length": {"causal": "4K", "full": None}}, "auto_from_length must be a whole number"),
        ({"auto_from_length": {"causal": 0, "full": None}}, "auto_from_length must be a whole number ≥ 1"),
        ({"passed": False, "auto_from_length": {"causal": 1024, "full": None}}, "set on a run that did not pass"),
        ({"auto_dtypes": ["bfloat16"]}, "auto_dtypes and auto_max_head_dim describe a crossover; auto_from_length"),
        ({"auto_from_length": 1024}, r"auto_dtypes \(the dtypes the crossover was measured in\) must be a non-empty"),
        ({"auto_from_length": 1024, "auto_dtypes": "bfloat16"}, "must be a non-empty list of floating-point dtype"),
        ({"auto_from_length": 1024, "auto_dtypes": []}, "must be a non-empty list of floating-point dtype names"),
        *(
            ({"auto_from_length": 1024, "auto_dtypes": [name]}, f"auto_dtypes: '{re.escape(name)}' is not a floating")
            for name in ("bf16", "int8", "bool", "f4,(", "(-1,)f4")
        ),
        ({"auto_from_length": 1024, "auto_dtypes": ["float16"]}, r"auto_max_head_dim \(the largest head dim"),
        ({"auto_from_length": 1024, "auto_dtypes": ["float16"], "auto_max_head_dim": 0}, "be a whole number ≥ 1"),
        ({"date": "25/11/2026"}, "not YYYY-MM-DD"),
        ({"jax_version": "latest"}, "not a version like 0.11.2"),
        ({"colour": "red"}, "record 0 must be an object with the fields"),
    ],
)
def test_a_malformed_record_is_an_error_naming_the_file_the_record_and_the_field(tmp_path, row, message):
    path = tmp_path / "kernel_passes.json"
    path.write_text(json.dumps([{**dataclasses.asdict(_run()), **row}]))
    with pytest.raises(ValueError, match=message) as info:
        platforms.read_passes(path)
    assert str(path) in str(info.value)
    path.write_text("[{")
    with pytest.raises(ValueError, match="not valid JSON"):
        platforms.read_passes(path)


def _junit(path, tests, failures=0, errors=0, skipped=0):
    path.write_text(
        f'<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="{tests}" failures="{failures}" '
        f'errors="{errors}" skipped="{skipped}"></testsuite></testsuites>'
    )


def test_records_from_a_gpu_run_pass_only_whole_files_with_no_failure(tmp_path):
    _junit(tmp_path / "test_relu_attention_triton.xml", tests=40, skipped=8)
    _junit(tmp_path / "test_linear_attention_triton.xml", tests=30, failures=1)
    _junit(tmp_path / "test_relu_attention_mosaic_gpu.xml", tests=12, skipped=12)  # nothing ran: not a pass
    (tmp_path / "test_linear_attention_mosaic_gpu.timeout").write_text("killed after 300 s")
    records = platforms.records_from_junit(
        tmp_path, device_cls="cuda-sm90", device="NVIDIA H100 80GB HBM3", commit="abc1234", date="2026-11-25"
    )
    got = {(r.op, r.backend): (r.passed, r.tests) for r in records}
    assert got == {
        ("relu_attention", "triton"): (True, "tests/kernels/test_relu_attention_triton.py: 32 passed, 0 failed, "
                                             "0 errors, 8 skipped"),
        ("linear_attention", "triton"): (False, "tests/kernels/test_linear_attention_triton.py: 29 passed, "
                                                "1 failed, 0 errors, 0 skipped"),
        ("relu_attention", "mosaic_gpu"): (False, "tests/kernels/test_relu_attention_mosaic_gpu.py: 0 passed, 0 failed, "
                                                  "0 errors, 12 skipped"),
        ("linear_attention", "mosaic_gpu"): (False, "tests/kernels/test_linear_attention_mosaic_gpu.py: stopped at its "
                                                    "time limit (killed after 300 s)"),
    }  # fmt: skip
    assert all(r.auto_from_length is None for r in records)  # auto needs a measured crossover, set by hand


def test_record_command_merges_the_run_into_the_committed_table(tmp_path):
    junit = tmp_path / "junit"
    junit.mkdir()
    _junit(junit / "test_relu_attention_triton.xml", tests=3)
    out = tmp_path / "kernel_passes.json"
    args = ["record", f"--junit={junit}", "--commit=abc1234", f"--out={out}", "--device_class=cuda-sm90"]
    assert platforms.main([*args, "--device=NVIDIA H100 80GB HBM3"]) == 0
    merged = platforms.read_passes(out)
    assert merged[: len(platforms.read_passes())] == platforms.read_passes()
    assert merged[-1].passed and merged[-1].device_class == "cuda-sm90" and merged[-1].commit == "abc1234"
    assert platforms.main([*args, "--device=NVIDIA H100 80GB HBM3"]) == 0  # the same run again replaces itself
    assert len(platforms.read_passes(out)) == len(merged)
