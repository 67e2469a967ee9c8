"""kernels.bench runs end to end and writes its JSON and plot (tiny shapes; timings are not asserted)."""

import json

import jax
import jax.numpy as jnp
import pytest

from kernels import bench
from tests import commands
from tests.kernels.lowering import exported_text
from tests.kernels.tolerances import fp32


def _lengths_every_impl_takes(args: list[str], count: int = 2) -> list[int]:
    """The `count` shortest lengths (multiples of 64) at which no default case of this backend is refused by its
    kernels' declared limits (`bench.refusal`): on a CPU 64 and 128; on an H100 the Mosaic GPU tiles decide."""
    taken = []
    for t in range(64, 4097, 64):
        namespace = bench.parse_args([*args, f"--lengths={t}"])
        cases = bench.default_cases(bench.jax.default_backend(), namespace, bench.gpu_compute_capability())
        if all(bench.refusal(c) is None for c in cases):
            taken.append(t)
        if len(taken) == count:
            return taken
    raise AssertionError(f"no length up to 4096 that every default impl takes: {args}")


def test_bench_writes_results_with_the_device_named(tmp_path):
    dtype = "float32" if bench.jax.default_backend() == "cpu" else "bfloat16"  # every impl of this backend
    args = ["--repeats=1", "--heads=2", "--head_dims=64", f"--dtypes={dtype}", "--causal=true", "--check=false"]
    lengths = _lengths_every_impl_takes(args)
    path = bench.main(
        [*args, f"--lengths={','.join(map(str, lengths))}", f"--tokens={lengths[-1]}", f"--out={tmp_path}"]
    )
    payload = json.loads(path.read_text())
    assert payload["device"]["platform"] == bench.jax.default_backend()
    assert path.name == f"kernels-{bench.device_name()}.json"
    results = payload["results"]
    expected = bench.default_cases(
        bench.jax.default_backend(), bench.parse_args([*args, f"--lengths={lengths[0]},{lengths[1]}"]),
        bench.gpu_compute_capability(),
    )  # fmt: skip
    assert [(r["op"], r["impl"], r["length"]) for r in results] == [(c.op, c.impl, c.length) for c in expected]
    assert {r["op"] for r in results} == {"relu", "linear", "softmax"}
    for r in results:  # every case timed: none skipped, none failed
        assert r["forward_ms"] > 0 and r["forward_backward_ms"] > 0 and r["forward_tflops"] > 0, r
        assert r["forward_temp_mib"] is not None
    assert (tmp_path / f"kernels-{bench.device_name()}.svg").read_text().startswith("<svg")


def test_a_case_outside_a_kernels_declared_limits_is_skipped_with_the_reason():
    mosaic = bench.Case("relu", "mosaic", 1, 2, 100, 64, "bfloat16", True)  # not whole tiles
    assert "whole tiles" in bench.refusal(mosaic)
    assert "whole tiles" in bench.run_case(mosaic, repeats=1)["skipped"]
    assert "half precision" in bench.refusal(bench.Case("softmax", "cudnn", 1, 2, 128, 64, "float32", True))
    assert bench.refusal(bench.Case("relu", "xla", 1, 2, 100, 64, "float32", True)) is None


def test_flop_convention():
    causal = bench.Case("relu", "xla", 2, 3, 1024, 64, "bfloat16", True)
    full = bench.Case("relu", "xla", 2, 3, 1024, 64, "bfloat16", False)
    assert bench.flops(causal) == 2 * 2 * 3 * 1024**2 * 64
    assert bench.flops(full) == 2 * bench.flops(causal)


def test_accuracy_check_compares_each_impl_with_the_fp32_xla_impl(tmp_path):
    args = ["--lengths=64", "--repeats=1", "--tokens=64", "--heads=2", "--ops=relu,linear", f"--out={tmp_path}"]
    args += ["--dtypes=float32", "--head_dims=64", "--causal=true"]  # one case an op on every backend
    path = bench.main([*args, "--relu_impls=pallas", "--linear_impls=pallas", "--check=true"])
    results = json.loads(path.read_text())["results"]
    assert len(results) == 2
    for r in results:  # interpret-mode kernels in fp32: agreement to rounding
        assert r["forward_rel_err"] < fp32(1e-5) and r["grad_rel_err"] < fp32(1e-5), r
    assert not bench._rel_err([bench.jnp.full(3, bench.jnp.nan)], [bench.jnp.ones(3)]) < 1  # NaN never passes a bound


def test_block_size_variants_are_separate_cases_and_reach_the_kernels(tmp_path):
    args = ["--lengths=64", "--repeats=1", "--tokens=64", "--heads=2", "--ops=relu,linear", f"--out={tmp_path}"]
    args += ["--dtypes=float32", "--head_dims=64", "--causal=true"]  # one case an op on every backend
    blocks = ["--relu_blocks=16,16,16,16;32,16,16,32,4,3", "--linear_blocks=16;32,4"]
    path = bench.main([*args, "--relu_impls=pallas", "--linear_impls=pallas", "--check=true", *blocks])
    results = json.loads(path.read_text())["results"]
    assert [(r["op"], r["blocks"]) for r in results] == [
        ("relu", "16,16,16,16"),
        ("relu", "32,16,16,32,4,3"),
        ("linear", "16"),
        ("linear", "32,4"),
    ]
    for r in results:  # every variant computes the same function
        assert r["forward_rel_err"] < fp32(1e-5) and r["grad_rel_err"] < fp32(1e-5), r
    relu = bench.block_sizes(bench.Case("relu", "pallas", 1, 1, 64, 64, "float32", True, "32,16,16,32,4,3"))
    assert (relu.block_q, relu.block_k, relu.block_q_bwd, relu.block_k_bwd, relu.num_warps, relu.num_stages) == (
        32,
        16,
        16,
        32,
        4,
        3,
    )
    assert bench.block_sizes(bench.Case("linear", "pallas", 1, 1, 64, 64, "float32", True, "32,4")).chunk == 32


@pytest.mark.lowering
@pytest.mark.parametrize("op", ["relu", "linear"])
def test_on_hopper_pallas_times_triton_and_mosaic_times_the_mosaic_kernels(op, monkeypatch):
    """`pallas_backend="gpu"` picks Mosaic GPU on an H100 once it passed there; the bench keeps "pallas" = Triton
    so that the two builds are timed side by side. Checked by lowering each case's function for CUDA as an H100
    would."""
    import kernels.platforms

    monkeypatch.setattr(kernels.platforms.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(kernels.platforms, "gpu_compute_capability", lambda: (9, 0))
    x = jax.ShapeDtypeStruct((1, 1024, 2, 128), jnp.bfloat16)
    calls = {}
    for impl in ("pallas", "mosaic"):
        case = bench.Case(op, impl, 1, 2, 1024, 128, "bfloat16", True)
        text = exported_text(bench._fn(case), "cuda", x, x, x)
        calls[impl] = (text.count("__gpu$xla.gpu.triton") > 0, text.count("mosaic_gpu_v2") > 0)
    assert calls == {"pallas": (True, False), "mosaic": (False, True)}


def test_default_cases_add_the_mosaic_kernels_on_hopper_in_half_precision_only():
    import argparse

    args = argparse.Namespace(
        ops=["relu", "linear", "softmax"], lengths=[1024], head_dims=[128], dtypes=["bfloat16", "float32"],
        causal=[True], heads=2, tokens=1024, relu_impls=None, linear_impls=None, softmax_impls=None,
        relu_blocks=None, linear_blocks=None,
    )  # fmt: skip

    def impls(capability):
        return {(c.op, c.impl, c.dtype) for c in bench.default_cases("gpu", args, capability)}

    hopper, ampere = impls((9, 0)), impls((8, 0))
    assert hopper - ampere == {("relu", "mosaic", "bfloat16"), ("linear", "mosaic", "bfloat16")}
    assert ("linear", "pallas", "float32") in ampere and ("softmax", "cudnn", "bfloat16") in ampere
    # the softmax baseline: cuDNN (half precision) beside the blocked and the dense XLA softmax
    assert {("softmax", impl, "float32") for impl in ("xla", "dense")} <= ampere
    assert not any(impl == "mosaic" for _, impl, _ in impls(None) | impls((10, 0)))


@pytest.mark.slow  # starts a command
def test_xla_block_sweep_writes_every_op_mode_and_block(tmp_path):
    import sys

    out = tmp_path / "sweep.json"
    cmd = [
        sys.executable,
        "benchmarks/xla_block_sweep.py",
        "--length=64",
        "--blocks=16,32",
        "--repeats=1",
        f"--out={out}",
    ]
    run = commands.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["length"] == 64 and result["matmul_gflops"] > 0
    seen = {(r["op"], r["causal"], r["block"]) for r in result["rows"]}
    assert seen == {(op, c, b) for op in ("relu", "softmax") for c in (True, False) for b in (16, 32)}
    assert all(r["ms"] > 0 and r["pct_of_matmul"] > 0 for r in result["rows"])


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--ops=relu,nosuch", "argument --ops: unknown nosuch; valid: relu, linear, softmax"),
        ("--check=yes", "argument --check: 'yes': give true or false"),
        ("--causal=true,yes", "argument --causal: 'yes': give true or false"),
    ],
)
def test_a_bad_flag_is_refused_naming_it(flag, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args([flag])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_cases_compare_every_impl_at_one_shape_before_the_next_shape():
    """A sweep cut off at a time limit keeps whole comparisons: each shape's impls run together, the shapes in the
    order given (head dims, then lengths)."""
    args = bench.parse_args(["--lengths=4096,1024", "--head_dims=128,64", "--dtypes=bfloat16", "--causal=true,false"])
    cases = bench.default_cases("gpu", args, (9, 0))
    shapes = [(c.head_dim, c.length, c.causal) for c in cases]
    runs = [shape for i, shape in enumerate(shapes) if i == 0 or shapes[i - 1] != shape]
    assert runs == [(d, t, causal) for d in (128, 64) for t in (4096, 1024) for causal in (True, False)]
    per_shape = len(cases) // len(runs)
    assert [(c.op, c.impl) for c in cases[:per_shape]] == [
        (op, impl) for op in ("relu", "linear") for impl in ("xla", "pallas", "mosaic")
    ] + [("softmax", impl) for impl in ("cudnn", "xla", "dense")]
