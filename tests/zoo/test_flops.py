"""Model FLOPs (zoo/training/flops.py): the count agrees with XLA's cost analysis of a compiled train step, causal
attention counts the lower triangle, the devices' peaks, and every run's logs and results carry TFLOP/s and MFU."""

import json

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

import kernels.blocking
from tests.zoo.test_training import tiny_loop_run
from zoo import mixers, models
from zoo.models.config import mixer_config
from zoo.training import Task, flops, memory, mesh_config, train_and_evaluate, train_config
from zoo.training import mesh as mesh_lib
from zoo.training.losses import classification_loss
from zoo.training.state import abstract_state, state_builder
from zoo.training.steps import make_train_step

# What the formula leaves out (embeddings, element-wise work, the head, the loss, the optimiser) is a few
# percent of XLA's count at this size (d 256, T 256: 1.6-3.1% measured); 6% is the stated tolerance.
TOLERANCE = 0.06


def _xla_train_step_flops(cfg: ml_collections.ConfigDict, batch: int, length: int) -> float:
    config = ml_collections.ConfigDict({"seed": 0, "mesh": mesh_config(), "model": cfg, "train": train_config()})
    config.train.batch_size = batch
    task = Task(
        build_model=lambda rngs: models.SequenceClassifier(cfg, vocab_size=50, num_classes=5, rngs=rngs),
        train_batches=None,
        eval_batches=None,
        loss_fn=classification_loss(),
        batch_spec=lambda n: {
            "inputs": jax.ShapeDtypeStruct((n, length), np.int32),
            "targets": jax.ShapeDtypeStruct((n,), np.int32),
            "weights": jax.ShapeDtypeStruct((n,), np.float32),
        },
    )
    mesh = mesh_lib.make_mesh(config.mesh)
    graphdef, abstract = abstract_state(state_builder(task.build_model, config.train, 0))
    sharding = mesh_lib.state_shardings(abstract, mesh)
    step = make_train_step(graphdef, task.loss_fn, accum_steps=1, **mesh_lib.step_shardings(mesh, sharding))
    compiled = memory.compile_train_step(step, abstract, sharding, memory.abstract_batch(task, config, mesh))
    analysis = compiled.cost_analysis()
    return float((analysis[0] if isinstance(analysis, list) else analysis)["flops"])


@pytest.mark.parametrize(
    "mixer, options", [(name, {}) for name in mixers.names()] + [("linear", {"feature_map": "glu"})]
)  # every registered mixer: a new one is checked without an edit here
def test_the_count_agrees_with_xla_on_a_non_causal_train_step(mixer, options, monkeypatch):
    # One key block over the whole length: XLA's cost analysis counts a loop's body once, not per iteration.
    monkeypatch.setattr(kernels.blocking, "XLA_BLOCK_K", {jax.default_backend(): 512})
    length, batch = 256, 2
    cfg = models.model_config(
        num_layers=2, d_model=256, num_heads=4, mlp_dim=1024, max_length=length, dropout=0.0, mixer=mixer
    )
    cfg.mixer_options[mixer].update(options)
    if mixer in ("gmlp", "amlp"):
        cfg.ffn = "none"
    xla = _xla_train_step_flops(cfg, batch, length)
    ours = flops.encoder_step_flops(cfg, {"inputs": np.zeros((batch, length))}, ("inputs",))
    assert abs(ours / xla - 1) < TOLERANCE, (ours, xla)
    assert ours <= xla  # what is not counted only adds to XLA's figure


@pytest.mark.parametrize("mixer", mixers.names())
def test_every_registered_mixer_counts_its_flops_from_its_own_class(mixer):
    cfg = models.model_config(d_model=64, num_heads=4, mlp_dim=128, max_length=256, mixer=mixer)
    counted = flops.mixer_flops(cfg, 256, causal=False)
    projections = 2 * 256 * 64 * 64  # one d×d matmul over the sequence: every mixer does more than that
    assert counted > projections and counted == mixers.forward_flops(mixer_config(cfg), 256, causal=False)


def test_a_mixer_class_without_a_flop_count_is_refused_when_it_registers():
    class Uncounted(nnx.Module):
        def __init__(self, cfg, *, rngs):
            pass

    with pytest.raises(TypeError, match=r"mixer 'uncounted': Uncounted has no forward_flops\(cfg, length"):
        mixers.register("uncounted", Uncounted, lambda: {})
    assert "uncounted" not in mixers.names()


@pytest.mark.parametrize("mixer", ["softmax", "relu", "gmlp"])
def test_causal_counts_the_lower_triangle(mixer):
    cfg = models.model_config(d_model=64, num_heads=4, mlp_dim=128, max_length=1000, mixer=mixer)
    # The non-causal count is a·T + b·T² (projections per token, pairs): a and b from two lengths ...
    (t1, f1), (t2, f2) = ((t, flops.mixer_flops(cfg, t, causal=False)) for t in (100, 300))
    b = (f2 / t2 - f1 / t1) / (t2 - t1)
    a = f1 / t1 - b * t1
    assert a > 0 and b > 0
    # ... and the causal count keeps a·T but only the lower triangle's T(T+1)/2 pairs.
    for length in (1, 7, 100, 999):
        expected = a * length + b * length * (length + 1) / 2
        np.testing.assert_allclose(flops.mixer_flops(cfg, length, causal=True), expected, rtol=1e-9)


def test_the_vocabulary_projection_and_towers_are_counted():
    cfg = models.model_config(num_layers=1, d_model=32, num_heads=2, mlp_dim=64, max_length=16)
    batch = {"src": np.zeros((4, 16)), "tgt_in": np.zeros((4, 12))}
    more_vocab = flops.encoder_decoder_step_flops(cfg, batch, 1100) - flops.encoder_decoder_step_flops(cfg, batch, 100)
    assert more_vocab == 3 * 4 * 2 * 12 * 32 * 1000
    pair = {"inputs1": np.zeros((4, 16)), "inputs2": np.zeros((4, 16))}
    one = flops.encoder_step_flops(cfg, pair, ("inputs1",))
    assert flops.encoder_step_flops(cfg, pair, ("inputs1", "inputs2")) == 2 * one
    lm = {"inputs": np.zeros((4, 16))}
    masked = flops.language_model_step_flops(cfg, lm, 100, causal=False, predicted=3)
    causal = flops.language_model_step_flops(cfg, lm, 100, causal=True)
    assert causal - flops.train_step_flops(4 * flops.encoder_flops(cfg, 16, causal=True)) == 3 * 4 * 2 * 16 * 32 * 100
    assert masked - flops.train_step_flops(4 * flops.encoder_flops(cfg, 16)) == 3 * 4 * 2 * 3 * 32 * (32 + 100)


@pytest.mark.parametrize(
    "kind, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-40GB", 312.0),
        ("TPU v4", 275.0),
        ("TPU v5 lite", 197.0),
        ("TPU v5p", 459.0),
        ("TPU v6 lite", 918.0),
    ],
)
def test_the_peak_table_names_each_accelerator(kind, peak, monkeypatch):
    fake = type("Device", (), {"platform": "gpu", "device_kind": kind})()
    monkeypatch.setattr(jax, "local_devices", lambda: [fake])
    assert flops.peak_tflops_per_device(train_config()) == (peak, f"{kind} dense bf16 peak")
    assert flops.peak_tflops_per_device(train_config(peak_tflops_per_device=12.5)) == (
        12.5,
        "train.peak_tflops_per_device",
    )


def test_a_cpu_measures_its_matmul_rate_once_unless_asked_again(monkeypatch):
    monkeypatch.delenv(flops.CPU_PEAK_ENV, raising=False)  # the suite sets it (tests/conftest.py)
    rate = flops.measured_cpu_tflops()
    assert 1e-4 < rate < 100  # TFLOP/s of a CPU
    assert flops.measured_cpu_tflops() == rate  # kept: measured again only by remeasure_cpu_tflops
    peak, source = flops.peak_tflops_per_device(train_config())
    assert peak == rate / jax.local_device_count() and "measured" in source


def test_a_rate_measured_again_keeps_the_better_for_this_process_s_later_runs(monkeypatch):
    rates = iter([0.05, 0.2, 0.1])  # start-up in a slow phase, then a faster one, then a slower one again
    monkeypatch.setattr(flops, "cpu_matmul_tflops", lambda seconds: next(rates))
    monkeypatch.setattr(flops, "_MEASURED_CPU_TFLOPS", [])  # this process's measurement, not made yet
    assert flops.measured_cpu_tflops() == 0.05
    assert flops.remeasure_cpu_tflops() == 0.2 and flops.measured_cpu_tflops() == 0.2
    assert flops.remeasure_cpu_tflops() == 0.2 and flops.measured_cpu_tflops() == 0.2  # 0.1 is not kept


def test_an_mfu_above_1_measures_the_peak_again_at_most_once_a_minute_and_outside_the_run_s_time(capsys):
    import time

    from zoo.training.metrics import Stopwatch

    calls, rates = [], iter([4.0e12, 4.0e12, 1.0e3])

    def remeasure():
        calls.append(time.perf_counter())
        time.sleep(0.3)
        return next(rates)

    watch = Stopwatch(1.0e9, 1, remeasure)  # 1 GFLOP/s: far below what 1 GFLOP in no time is
    watch.tick(tokens=8, flops=1.0e9)
    row = watch.rates()
    assert len(calls) == 1 and watch.peak_flops_per_s == 4.0e12
    assert row["mfu"] == pytest.approx(row["tflops_per_s_per_device"] * 1e12 / 4.0e12)
    assert watch.elapsed() < 0.3  # the measurement's half second is not training time
    watch.peak_flops_per_s = 1.0e9  # above 1 again within the minute: not measured again
    watch.tick(tokens=8, flops=1.0e9)
    assert watch.rates()["mfu"] > 1 and len(calls) == 1
    watch.remeasured_at -= Stopwatch.REMEASURE_EVERY_S
    watch.tick(tokens=8, flops=1.0e9)
    watch.rates()
    assert len(calls) == 2 and watch.peak_flops_per_s == 4.0e12
    watch.peak_flops_per_s = 1.0e9  # a measurement that does not raise the peak ends the measuring
    watch.remeasured_at -= Stopwatch.REMEASURE_EVERY_S
    watch.tick(tokens=8, flops=1.0e9)
    assert watch.rates()["mfu"] > 1 and len(calls) == 3 and watch.remeasure is None
    fixed = Stopwatch(1.0e9, 1, peak_source="train.peak_tflops_per_device")  # a peak not measured here is kept
    for _ in range(2):
        fixed.tick(tokens=8, flops=1.0e9)
        assert fixed.rates()["mfu"] > 1 and fixed.peak_flops_per_s == 1.0e9
    said = [line for line in capsys.readouterr().out.splitlines() if "not meaningful" in line]
    assert len(said) == 1 and "0.001 TFLOP/s per device (train.peak_tflops_per_device)" in said[0], said  # once


def test_a_run_started_beside_other_work_reports_mfu_against_the_rate_measured_again(tmp_path, monkeypatch, capsys):
    rates = iter([1e-9, 1e3])  # at start-up a rate no step can stay under, then a fast one
    monkeypatch.delenv(flops.CPU_PEAK_ENV, raising=False)
    monkeypatch.setattr(flops, "cpu_matmul_tflops", lambda seconds: next(rates))
    monkeypatch.setattr(flops, "_MEASURED_CPU_TFLOPS", [])
    config, task = tiny_loop_run(4, model_flops=lambda batch: 1.0e9)
    results = train_and_evaluate(config, tmp_path / "run", task)
    peak = 1e3 / jax.local_device_count()
    assert results["peak_tflops_per_device"] == peak
    assert results["mfu"] == pytest.approx(results["tflops_per_s_per_device"] / peak) and results["mfu"] < 1
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    train = [row for row in rows if row["split"] == "train"]
    assert len(train) == 2 and all(row["mfu"] < 1 for row in train)  # the first row measured the peak again
    assert f"the matmul rate measured again is {peak:.3g} TFLOP/s per device (was 1e-09" in capsys.readouterr().out


def test_a_run_whose_stated_peak_it_exceeds_says_so_once(tmp_path, capsys):
    config, task = tiny_loop_run(4, model_flops=lambda batch: 1.0e9)
    config.train.peak_tflops_per_device = 1e-9  # 1 kFLOP/s: MFU in the millions
    results = train_and_evaluate(config, tmp_path / "run", task)
    assert results["mfu"] > 1
    said = [line for line in capsys.readouterr().out.splitlines() if "MFU came out at" in line]
    assert len(said) == 1 and "(train.peak_tflops_per_device) is below what this run does" in said[0], said


def test_a_cpu_rate_from_the_environment_is_not_measured_and_a_bad_one_is_refused_by_name(monkeypatch):
    from zoo.training.validate import config_problems

    def measure(*args, **kwargs):
        raise AssertionError("measured although the environment gives the rate")

    monkeypatch.setattr(flops, "cpu_matmul_tflops", measure)
    monkeypatch.setattr(flops, "measured_cpu_tflops", measure)
    monkeypatch.setenv(flops.CPU_PEAK_ENV, "0.25")
    peak, source = flops.peak_tflops_per_device(train_config())
    assert peak == 0.25 / jax.local_device_count() and flops.CPU_PEAK_ENV in source
    assert flops.peak_tflops_per_device(train_config(peak_tflops_per_device=3.0))[0] == 3.0  # the field wins
    config = ml_collections.ConfigDict({"train": train_config()})
    assert config_problems(config) == []
    for bad in ("fast", "0", "-1", "nan", "inf"):
        monkeypatch.setenv(flops.CPU_PEAK_ENV, bad)
        assert config_problems(config) == [
            f"{flops.CPU_PEAK_ENV}={bad!r} must be a positive number of TFLOP/s (or unset, to measure)"
        ]
        with pytest.raises(ValueError, match=flops.CPU_PEAK_ENV):
            flops.peak_tflops_per_device(train_config())


def test_a_throughput_measurement_on_cpu_takes_its_peak_beside_the_timed_steps(monkeypatch):
    from zoo.training import throughput

    rates = iter([0.1, 0.3])  # before and after the timed steps
    monkeypatch.setattr(flops, "cpu_matmul_tflops", lambda: next(rates))
    config, task = tiny_loop_run(2, model_flops=lambda batch: 1e9)
    result = throughput.measure(config, task, vocab_size=12, num_classes=5, steps=2, warmup=0)
    peak = 0.3 / jax.local_device_count()  # the better of the two
    assert result["peak_tflops_per_device"] == peak and "before and just after" in result["peak_source"]
    np.testing.assert_allclose(result["mfu"], result["tflops_per_s_per_device"] / peak)
    np.testing.assert_allclose(
        result["tflops_per_s_per_device"], 1e9 * result["steps_per_s"] / jax.device_count() / 1e12
    )
    with pytest.raises(StopIteration):
        next(rates)  # measured exactly twice
    config.train.peak_tflops_per_device = 2.0  # an override is not measured
    result = throughput.measure(config, task, vocab_size=12, num_classes=5, steps=1, warmup=0)
    assert result["peak_tflops_per_device"] == 2.0 and result["peak_source"] == "train.peak_tflops_per_device"


def test_every_log_line_and_the_results_carry_model_flops_and_mfu(tmp_path, capsys):
    seen = []

    def count(batch):
        seen.append(batch["inputs"].shape)
        return 1.0e9

    config, task = tiny_loop_run(4, model_flops=count)
    config.train.peak_tflops_per_device = 0.5
    results = train_and_evaluate(config, tmp_path / "run", task)
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    assert train and all(r["model_flops_per_step"] == 1.0e9 for r in train)
    for r in train:
        assert r["tflops_per_s_per_device"] == pytest.approx(1.0e9 * r["steps_per_sec"] / 1e12, rel=1e-6)
        assert r["mfu"] == pytest.approx(r["tflops_per_s_per_device"] / 0.5, rel=1e-9)
    assert results["model_flops_per_step"] == 1.0e9 and results["peak_tflops_per_device"] == 0.5
    assert results["mfu"] == pytest.approx(results["tflops_per_s_per_device"] / 0.5)
    assert seen == [(8, 10)]  # counted once per batch shape, not per step
    assert json.loads((tmp_path / "run/results.json").read_text())["mfu"] == results["mfu"]
    assert "MFU is measured against 0.5 TFLOP/s per device (train.peak_tflops_per_device)" in capsys.readouterr().out


def _matmul_ceiling_module():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).parents[2] / "benchmarks" / "matmul_ceiling.py"
    spec = importlib.util.spec_from_file_location("matmul_ceiling", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # where its dataclass looks itself up
    spec.loader.exec_module(module)
    return module


def test_the_matmul_ceiling_times_the_counted_flops_plus_the_recomputed_scores():
    """benchmarks/matmul_ceiling.py enumerates a train step's matmuls: their FLOPs are the model FLOPs this module
    counts, plus the blocked op's recomputed scores in the backward (T a multiple of the key block: no padding)."""
    ceiling = _matmul_ceiling_module()
    cfg = models.model_config()
    cfg.update(d_model=32, num_heads=4, mlp_dim=48, num_layers=2, mixer="relu", max_length=64)
    batch, length, block_k = 2, 64, 16
    products = ceiling.step_products(
        batch=batch, length=length, d_model=32, num_heads=4, mlp_dim=48, num_layers=2, block_k=block_k
    )
    model_flops = flops.train_step_flops(batch * flops.encoder_flops(cfg, length))
    recomputed = cfg.num_layers * (length // block_k) * 2.0 * batch * length * block_k * cfg.d_model
    assert sum(p.count * p.flops() for p in products) == pytest.approx(model_flops + recomputed, rel=1e-12)

    result = ceiling.ceiling(products, model_flops, peak_flops=1e9, repeats=1)
    assert len(result["products"]) == len(products) and all(r["seconds"] > 0 for r in result["products"])
    total = sum(r["count"] * r["seconds"] for r in result["products"])
    assert result["matmul_seconds_per_step"] == pytest.approx(total)
    assert result["mfu_ceiling"] == pytest.approx(model_flops / total / 1e9)
