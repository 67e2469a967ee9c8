"""kernels.bench runs end to end and writes its JSON and plot (tiny shapes; timings are not asserted), with each
case's time beside its shape's softmax baseline and fla's published figures beside the linear rows; its dry run
builds a GPU's whole sweep and runs it at toy sizes here."""

import dataclasses
import json
import subprocess

import jax
import jax.numpy as jnp
import pytest

from kernels import bench
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
    mosaic = bench.Case("relu", "mosaic_gpu", 1, 2, 100, 64, "bfloat16", True)
    expected = "whole tiles" if jax.default_backend() == "gpu" else "need a Hopper GPU"
    assert expected in bench.refusal(mosaic)
    assert expected in bench.run_case(mosaic, repeats=1)["skipped"]
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
    path = bench.main([*args, "--relu_impls=triton", "--linear_impls=triton", "--check=true"])
    results = json.loads(path.read_text())["results"]
    assert len(results) == 2
    for r in results:  # interpret-mode kernels in fp32: agreement to rounding
        assert r["forward_rel_err"] < fp32(1e-5) and r["grad_rel_err"] < fp32(1e-5), r
    assert not bench._rel_err([bench.jnp.full(3, bench.jnp.nan)], [bench.jnp.ones(3)]) < 1  # NaN never passes a bound


def test_block_size_variants_are_separate_cases_and_reach_the_kernels(tmp_path):
    args = ["--lengths=64", "--repeats=1", "--tokens=64", "--heads=2", "--ops=relu,linear", f"--out={tmp_path}"]
    args += ["--dtypes=float32", "--head_dims=64", "--causal=true"]  # one case an op on every backend
    blocks = ["--relu_blocks=16,16,16,16;32,16,16,32,4,3", "--linear_blocks=16;32,4"]
    path = bench.main([*args, "--relu_impls=triton", "--linear_impls=triton", "--check=true", *blocks])
    results = json.loads(path.read_text())["results"]
    assert [(r["op"], r["blocks"]) for r in results] == [
        ("relu", "16,16,16,16"),
        ("relu", "32,16,16,32,4,3"),
        ("linear", "16"),
        ("linear", "32,4"),
    ]
    for r in results:  # every variant computes the same function
        assert r["forward_rel_err"] < fp32(1e-5) and r["grad_rel_err"] < fp32(1e-5), r
    relu = bench.block_sizes(bench.Case("relu", "triton", 1, 1, 64, 64, "float32", True, "32,16,16,32,4,3"))
    assert (relu.block_q, relu.block_k, relu.block_q_bwd, relu.block_k_bwd, relu.num_warps, relu.num_stages) == (
        32,
        16,
        16,
        32,
        4,
        3,
    )
    assert bench.block_sizes(bench.Case("linear", "triton", 1, 1, 64, 64, "float32", True, "32,4")).chunk == 32
    named = "block_k_dkv=32,block_q=16"
    by_field = bench.block_sizes(bench.Case("relu", "triton", 1, 1, 64, 64, "float32", True, named))
    assert (by_field.block_q, by_field.dkv) == (16, (64, 32))
    mgpu = bench.block_sizes(bench.Case("relu", "mosaic_gpu", 1, 1, 64, 64, "bfloat16", True, "128,128,3"))
    assert (mgpu.block_q, mgpu.block_k, mgpu.stages) == (128, 128, 3)


@pytest.mark.lowering
@pytest.mark.parametrize("op", ["relu", "linear"])
def test_on_hopper_each_build_times_its_own_kernels(op, monkeypatch):
    """ "triton" and "mosaic_gpu" are timed side by side on an H100: checked by lowering each case's function for
    CUDA as an H100 would."""
    from kernels import platforms

    monkeypatch.setattr(platforms.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(platforms, "gpu_compute_capability", lambda: (9, 0))
    x = jax.ShapeDtypeStruct((1, 1024, 2, 128), jnp.bfloat16)
    calls = {}
    for impl in ("triton", "mosaic_gpu"):
        case = bench.Case(op, impl, 1, 2, 1024, 128, "bfloat16", True)
        text = exported_text(bench._fn(case), "cuda", x, x, x)
        calls[impl] = (text.count("__gpu$xla.gpu.triton") > 0, text.count("mosaic_gpu_v2") > 0)
    assert calls == {"triton": (True, False), "mosaic_gpu": (False, True)}


def test_default_cases_add_the_mosaic_kernels_on_hopper_in_half_precision_only():
    import argparse

    args = argparse.Namespace(
        ops=["relu", "linear", "softmax"], lengths=[1024], head_dims=[128], dtypes=["bfloat16", "float32"],
        causal=[True], heads=2, tokens=1024, relu_impls=None, linear_impls=None, softmax_impls=None,
        relu_blocks=None, linear_blocks=None, mgpu_blocks=None, xla=True,
    )  # fmt: skip

    def impls(capability):
        return {(c.op, c.impl, c.dtype) for c in bench.default_cases("gpu", args, capability)}

    hopper, ampere = impls((9, 0)), impls((8, 0))
    assert hopper - ampere == {("relu", "mosaic_gpu", "bfloat16"), ("linear", "mosaic_gpu", "bfloat16")}
    assert ("linear", "triton", "float32") in ampere and ("softmax", "cudnn", "bfloat16") in ampere
    # the softmax baseline: cuDNN (half precision) beside the blocked XLA softmax
    assert ("softmax", "xla", "float32") in ampere
    assert not any(impl == "mosaic_gpu" for _, impl, _ in impls(None) | impls((10, 0)))
    assert {c.impl for c in bench.default_cases("tpu", args)} == {"xla", "mosaic_tpu", "splash"}
    args.xla = False  # the accelerators' default: the kernel builds and the baseline only
    assert {c.impl for c in bench.default_cases("gpu", args, (9, 0))} == {"triton", "mosaic_gpu", "cudnn"}


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
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
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
        ("--dtypes=float8", "argument --dtypes: unknown float8; valid: bfloat16, float16, float32"),
        ("--lengths=0", "argument --lengths: '0': give a positive integer"),
        ("--lengths=,", "argument --lengths: ',': give at least one value"),
        ("--heads=-2", "argument --heads: '-2': give a positive integer"),
        ("--repeats=0", "argument --repeats: '0': give a positive integer"),
        ("--head_dims=0", "argument --head_dims: '0': give a positive integer"),
        ("--relu_impls=tritn", "argument --relu_impls: unknown tritn; valid: auto, reference, xla, triton"),
        ("--softmax_impls=cudn", "argument --softmax_impls: unknown cudn; valid: auto"),
        ("--relu_blocks=abc", "argument --relu_blocks: 'abc': not relu/triton block sizes"),
        ("--relu_blocks=64,64,64,64;block_q=1,nosuch=2", "'block_q=1,nosuch=2': not relu/triton block sizes"),
        ("--linear_blocks=64,x", "argument --linear_blocks: '64,x': not linear/triton block sizes"),
        ("--out=README.md", "argument --out: README.md is a file, not a folder"),
        ("--out=README.md/sub", "argument --out: README.md is a file, not a folder"),
    ],
)
def test_a_bad_flag_is_refused_naming_it(flag, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(bench.Path(bench.__file__).parents[1])  # README.md: a file where --out names a folder
    with pytest.raises(SystemExit) as exit_info:
        bench.main([flag, f"--out={tmp_path / 'out'}"] if "--out" not in flag else [flag])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err.strip().splitlines()[-1]  # after the usage: one line
    assert not (tmp_path / "out").exists()  # refused before the output folder is made


def test_a_sweep_that_timed_no_case_exits_non_zero(tmp_path, monkeypatch, capsys):
    def failed(case, *args, **kwargs):
        return {**dataclasses.asdict(case), "forward_error": "E", "forward_backward_error": "E"}

    monkeypatch.setattr(bench, "run_case", failed)
    flags = ["--lengths=64", "--head_dims=64", "--ops=relu", "--relu_impls=xla", f"--out={tmp_path}"]
    with pytest.raises(SystemExit, match="no case of 1 was timed .*kernels-") as exit_info:
        bench.main(flags)
    assert exit_info.value.code != 0  # the results written still say each case's error
    assert json.loads(next(tmp_path.glob("kernels-*.json")).read_text())["results"][0]["forward_error"] == "E"


def test_cases_compare_every_impl_at_one_shape_before_the_next_shape():
    """A sweep cut off at a time limit keeps whole comparisons: each shape's impls run together, the lengths in the
    order given, and every head dim at the first length before the second."""
    args = bench.parse_args(["--lengths=4096,1024", "--head_dims=128,64", "--dtypes=bfloat16", "--causal=true,false"])
    args.xla = True
    cases = bench.default_cases("gpu", args, (9, 0))
    shapes = [(c.length, c.causal, c.head_dim) for c in cases]
    runs = [shape for i, shape in enumerate(shapes) if i == 0 or shapes[i - 1] != shape]
    assert runs == [(t, causal, d) for t in (4096, 1024) for causal in (True, False) for d in (128, 64)]
    per_shape = len(cases) // len(runs)
    assert [(c.op, c.impl) for c in cases[:per_shape]] == [
        (op, impl) for op in ("relu", "linear") for impl in ("triton", "mosaic_gpu", "xla")
    ] + [("softmax", impl) for impl in ("cudnn", "xla")]


def test_the_accelerator_default_is_the_targets_sweep():
    args = bench.parse_args([], accelerator=True)
    assert (args.lengths, args.head_dims, args.dtypes, args.causal) == (
        [4096, 16384],
        [128, 64],
        ["bfloat16"],
        [True, False],
    )
    assert (args.heads, args.tokens) == (16, 65536)  # B 16 at 4K: the shapes of docs/kernels.md's targets


def _result(op, impl, fwd, both, **shape):
    row = {"op": op, "impl": impl, "blocks": "", "batch": 16, "heads": 16, "length": 4096, "head_dim": 128,
           "dtype": "bfloat16", "causal": True, **shape}  # fmt: skip
    return {**row, "forward_ms": fwd, "forward_backward_ms": both}


def test_times_are_set_beside_the_shapes_softmax_baseline():
    results = [
        _result("relu", "triton", 2.0, 9.0),
        _result("softmax", "xla", 8.0, 30.0),
        _result("softmax", "cudnn", 2.5, 8.0),
        _result("relu", "triton", 1.0, 1.0, causal=False),  # no softmax at this shape: no ratio
    ]
    bench.add_baseline_ratios(results)
    assert results[0]["baseline"] == "softmax/cudnn"  # preferred to the blocked XLA softmax that ran first
    assert (results[0]["forward_x_baseline"], results[0]["forward_backward_x_baseline"]) == (0.8, 9.0 / 8.0)
    assert results[1]["forward_x_baseline"] == 8.0 / 2.5
    assert "baseline" not in results[3]
    table = bench.summary_table(results)
    assert "| relu/triton | 4096 | 128 | True | 2.00 | 9.00 |" in table and "0.80; 1.12" in table


def test_linear_rows_carry_flas_h100_figures_scaled_to_their_work(monkeypatch):
    monkeypatch.setattr(bench, "median_seconds", lambda fn, args, repeats: 1e-3)
    case = bench.Case("linear", "xla", 4, 2, 2048, 128, "float32", True)  # B·H = 8 = 256 / 32
    row = bench.run_case(case, repeats=1)
    assert row["fla_h100_forward_ms"] == pytest.approx(0.45 / 32)
    assert row["fla_h100_forward_backward_ms"] == pytest.approx(2.28 / 32)
    assert "fla_h100_forward_ms" not in bench.run_case(dataclasses.replace(case, causal=False), repeats=1)


def test_the_dry_run_runs_a_gpus_sweep_at_toy_sizes(tmp_path):
    flags = ["--dry_run", "--lengths=4096", "--head_dims=64", "--causal=true", "--xla=true", f"--out={tmp_path}"]
    path = bench.main(flags)
    assert path.name == "kernels-dry-run.json"
    payload = json.loads(path.read_text())
    assert payload["dry_run"]
    rows = {(r["op"], r["impl"]): r for r in payload["results"]}
    assert set(rows) == {(op, impl) for op in ("relu", "linear") for impl in ("xla", "triton", "mosaic_gpu")} | {
        ("softmax", impl) for impl in ("cudnn", "xla")
    }
    for (_, impl), r in rows.items():
        assert (r["length"], r["batch"]) == (128, 1)
        if impl in ("mosaic_gpu", "cudnn") and jax.default_backend() != "gpu":
            assert "skipped" in r
        else:
            assert r["forward_ms"] > 0 and r["forward_x_baseline"] > 0, r
