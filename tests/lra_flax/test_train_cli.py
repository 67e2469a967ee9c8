"""`lra-train` end to end on CPU: resume after a kill equals an uninterrupted run; the demo learns; bad input."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from tests import fault_injection
from tests.xla_flags import optimised_env
from zoo.training.metrics import TIMING_METRICS

CONFIG = "lra_flax/configs/listops.py:demo"
TIMING = TIMING_METRICS


def _tiny(data_dir, **extra):
    flags = {
        "data.dir": data_dir,
        "data.generator.num_train": 200,
        "data.generator.num_valid": 40,
        "data.generator.num_test": 40,
        "model.num_layers": 1,
        "model.d_model": 32,
        "model.num_heads": 2,
        "model.mlp_dim": 32,
        "model.dropout": 0.1,
        "train.batch_size": 16,
        "train.steps": 12,
        "train.warmup_steps": 2,
        "train.log_every": 3,
        "train.eval_every": 6,
        "train.checkpoint_every": 4,
        "train.eval_batch_size": 16,
    }
    flags.update(extra)
    return [f"--config.{k}={v}" for k, v in flags.items()]


def accuracy_counts_whole_examples(results: dict) -> bool:
    """Test accuracy is correct / examples: a whole number of the examples scored, within [0, 1]."""
    correct = results["test_accuracy"] * results["test_examples"]
    return (
        results["test_examples"] > 0
        and 0 <= correct <= results["test_examples"]
        and abs(correct - round(correct)) < 1e-3
    )


def _train(workdir, flags, env=None, config=CONFIG):
    cmd = [sys.executable, "-m", "lra_flax", f"--config={config}", f"--workdir={workdir}", *flags]
    return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=600)


def _metrics(workdir):
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in m.items() if k not in TIMING} for m in lines]


def _results(workdir):
    r = json.loads((workdir / "results.json").read_text())
    return {k: v for k, v in r.items() if k.startswith(("test_", "valid_"))}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """(flags, workdir) of one uninterrupted tiny run that the resume tests compare with."""
    root = tmp_path_factory.mktemp("uninterrupted")
    flags = _tiny(root / "data")
    full = _train(root / "full", flags)
    assert full.returncode == 0, full.stderr[-3000:]
    assert "compiled in" in full.stdout and "first train step done in" in full.stdout
    assert "caching" in full.stderr and "examples/s" in full.stderr  # progress of data caching
    return flags, root / "full"


@pytest.mark.slow
def test_resume_after_kill_equals_uninterrupted_run(tmp_path, uninterrupted):
    flags, full_dir = uninterrupted

    # Killed (SIGKILL) after step 6: checkpoint 4 exists, steps 5-6 and their log lines are redone.
    killed = _train(tmp_path / "resumed", flags, env=fault_injection.env(kill_after_step=6))
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert not (tmp_path / "resumed" / "results.json").exists()
    assert (tmp_path / "resumed" / "checkpoints" / "4").exists()

    resumed = _train(tmp_path / "resumed", flags)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    results = json.loads((tmp_path / "resumed" / "results.json").read_text())
    assert results["train_steps_run"] == 8 and results["resumed_at_step"] == 4
    assert results["train_wall_time_s"] > results["train_wall_time_this_run_s"] > 0  # earlier run's time kept
    assert _metrics(tmp_path / "resumed") == _metrics(full_dir)
    assert _results(tmp_path / "resumed") == _results(full_dir)
    assert len([m for m in _metrics(full_dir) if m["split"] == "train"]) == 4


@pytest.mark.slow
def test_kill_during_final_evaluation_then_rerun_equals_uninterrupted_and_a_finished_rerun_changes_nothing(
    tmp_path, uninterrupted
):
    flags, full_dir = uninterrupted
    workdir = tmp_path / "run"
    # Killed after the final validation line was written, before the test split: the re-run redoes the
    # final evaluation without a second validation line.
    killed = _train(workdir, flags, env=fault_injection.env(kill_after_final_eval="valid"))
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert [m["split"] for m in _metrics(workdir) if m["step"] == 12] == ["train", "valid"]
    assert not (workdir / "results.json").exists()
    rerun = _train(workdir, flags)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert _metrics(workdir) == _metrics(full_dir)
    assert _results(workdir) == _results(full_dir)

    before = _snapshot(workdir)
    again = _train(workdir, flags)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already finished 12 steps; results.json is unchanged" in again.stdout
    assert _snapshot(workdir) == before  # every file, to the byte


@pytest.mark.slow
def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, uninterrupted):
    flags, full_dir = uninterrupted
    workdir = tmp_path / "run"
    killed = _train(workdir, flags, env=fault_injection.env(kill_after_step=10))  # checkpoints 4 and 8
    assert killed.returncode == -9, killed.stderr[-3000:]
    state_file = next(p for p in (workdir / "checkpoints" / "8" / "state" / "d").iterdir())
    state_file.write_bytes(state_file.read_bytes()[:40])  # truncated

    resumed = _train(workdir, flags)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    lines = [line for line in resumed.stdout.splitlines() if "does not restore" in line]
    assert len(lines) == 1 and lines[0].startswith("checkpoint step 8 does not restore"), resumed.stdout[-2000:]
    assert (workdir / "checkpoints_broken" / "8" / "state" / "d" / state_file.name).exists()  # kept aside
    assert "resumed from" in resumed.stdout and "at step 4" in resumed.stdout
    assert _metrics(workdir) == _metrics(full_dir)
    assert _results(workdir) == _results(full_dir)


@pytest.mark.slow
def test_demo_preset_learns_above_majority_class(tmp_path):
    from lra_flax.input_pipeline import majority_rate

    workdir = tmp_path / "demo"
    # The demo preset, shortened: fewer examples, steps and rows per batch; same model and data distribution.
    flags = [
        f"--config.data.dir={tmp_path / 'data'}",
        "--config.data.generator.num_train=3000",
        "--config.data.generator.num_test=500",
        "--config.data.generator.num_valid=100",
        "--config.train.steps=160",  # test accuracy 22.4% against a majority class of 12.6% (2 cores, jax 0.10)
        "--config.train.batch_size=32",  # half the preset's: the test is about learning, not its final accuracy
        "--config.train.warmup_steps=16",
        "--config.train.eval_every=0",
        "--config.train.checkpoint_every=160",
    ]
    run = _train(workdir, flags, env=optimised_env())  # 160 steps: their run time, not compilation, dominates
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((workdir / "results.json").read_text())
    cache = next((tmp_path / "data" / "cache").glob("basic_test-*.array_record"))
    majority = majority_rate(cache)
    assert results["test_accuracy"] > majority + 0.05, (results, majority)
    for name in ("config.json", "metrics.jsonl", "results.json"):
        assert (workdir / name).exists()
    assert list((workdir / "tensorboard").iterdir())
    line = json.loads((workdir / "metrics.jsonl").read_text().splitlines()[0])
    assert {"step", "split", "loss", "accuracy", "learning_rate", "steps_per_sec", "tokens_per_sec"} <= set(line)
    assert 0 <= line["input_wait_fraction"] <= 1


def _snapshot(workdir):
    return {
        str(p.relative_to(workdir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(workdir.rglob("*"))
        if p.is_file()
    }


@pytest.mark.slow
def test_resume_with_changed_model_config_is_refused(tmp_path):
    flags = _tiny(tmp_path / "data", **{"train.steps": 4})
    assert _train(tmp_path / "run", flags).returncode == 0
    before = _snapshot(tmp_path / "run")
    changed = _train(tmp_path / "run", [*flags, "--config.model.d_model=64"])
    assert changed.returncode == 2
    assert "model.d_model: 32 -> 64" in changed.stderr
    assert "Traceback" not in changed.stderr
    assert _snapshot(tmp_path / "run") == before


def test_unknown_mixer_lists_valid_names_and_writes_nothing(tmp_path):
    run = _train(tmp_path / "run", [*_tiny(tmp_path / "data"), "--config.model.mixer=relux"])
    assert run.returncode == 2
    from zoo import mixers

    assert f"unknown mixer 'relux'; valid mixers: {', '.join(mixers.names())}" in run.stderr
    assert not (tmp_path / "run" / "config.json").exists()


def test_lra_data_cli_writes_release_format(tmp_path):
    cmd = [sys.executable, "-m", "lra_flax.data_cli", "listops", f"--output_dir={tmp_path}"]
    cmd += ["--num_train=20", "--num_valid=5", "--num_test=5", "--min_length=10", "--max_length=50", "--seed=2"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    names = ("basic_train.tsv", "basic_val.tsv", "basic_test.tsv")
    for name in names:
        assert (tmp_path / name).read_text().startswith("Source\tTarget\n")
    written = {name: (tmp_path / name).read_bytes() for name in names}
    # The files there are not replaced unless asked: a release folder pointed at by mistake survives.
    again = subprocess.run([*cmd, "--seed=3"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already holds" in again.stderr and "--overwrite" in again.stderr, again.stderr
    assert {name: (tmp_path / name).read_bytes() for name in names} == written
    replaced = subprocess.run([*cmd, "--seed=3", "--overwrite"], capture_output=True, text=True, timeout=120)
    assert replaced.returncode == 0, replaced.stderr
    assert (tmp_path / "basic_train.tsv").read_bytes() != written["basic_train.tsv"]
    bad = subprocess.run(
        [*cmd[:5], "--overwrite", "--min_length=60", "--max_length=50"], capture_output=True, text=True
    )
    assert bad.returncode != 0 and "min_length + 1 < max_length" in bad.stderr


def test_eval_batch_not_divisible_over_devices_is_refused_before_the_workdir(tmp_path):
    flags = _tiny(tmp_path / "data", **{"train.eval_batch_size": 3})
    run = _train(tmp_path / "run", [*flags, "--fake_cpu_devices=2"])
    assert run.returncode == 2, run.stderr[-2000:]
    assert "train.eval_batch_size=3 is not divisible by the 2 data × fsdp shards" in run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_profile_steps_write_a_trace(tmp_path):
    flags = _tiny(tmp_path / "data", **{"train.steps": 4, "train.eval_every": 0, "train.checkpoint_every": 4})
    run = _train(tmp_path / "run", [*flags, "--profile_steps=2,3"])
    assert run.returncode == 0, run.stderr[-3000:]
    assert "profile of steps 2-3 written to" in run.stdout
    assert list((tmp_path / "run" / "profile").rglob("*.xplane.pb"))
    # A reversed range is refused at start-up: tests/test_bad_inputs.py ("bad --profile_steps").
