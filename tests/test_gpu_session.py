"""benchmarks/gpu/session.sh, the script a lent GPU runs: a dry run of every step on this CPU, resuming a
training across two calls, and bringing back every failure's reason whatever happens to the test processes."""

import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks/gpu/session.sh"


def _session(*args, out: Path, state: Path, timeout=600, **env):
    run = subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OUT": str(out), "GPU_STATE": str(state), "PY": sys.executable, "COMMIT": "c0ffee", **env},
    )
    return run, run.stdout + run.stderr


def test_usage_errors_exit_2_and_name_the_step():
    run = subprocess.run(["bash", str(SCRIPT), "--dry-run", "info", "tune"], capture_output=True, text=True)
    assert run.returncode == 2 and "unknown step 'tune'" in run.stderr
    run = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True)
    assert run.returncode == 2 and "kernel-tests" in run.stdout  # the usage text


@pytest.mark.slow
def test_dry_run_of_every_step_then_a_second_call_resumes_the_training(tmp_path):
    out, state = tmp_path / "out1", tmp_path / "state"
    steps = ["info", "data", "kernel-tests", "probe", "train", "bench", "studies"]
    run, log = _session("--dry-run", *steps, out=out, state=state, MIXERS="relu", TRAIN_FAULT="sigterm_after_step=3")
    assert run.returncode == 0, log
    assert "dry run 1" in (out / "info.txt").read_text()
    # kernel tests: one process and one JUnit report per file, the record of this run, no failures
    reports = sorted(p.name for p in (out / "junit").glob("*.xml"))
    names = [
        "relu_attention_triton",
        "linear_attention_triton",
        "relu_attention_mosaic_gpu",
        "linear_attention_mosaic_gpu",
        "auto",
    ]
    assert reports == sorted(f"test_{name}.xml" for name in names)
    summary = json.loads((out / "kernel_tests.json").read_text())
    assert {row["file"]: row["passed"] for row in summary["files"]} == {
        f"tests/kernels/test_{name}.py": True for name in names
    }
    assert (out / "failures.txt").read_text() == ""
    assert json.loads((out / "probe-relu.json").read_text())["steps_per_s"] > 0
    assert list((out / "bench").glob("kernels-*.json"))
    # the studies: each one's result, README and figure (here the variance study at its tiny preset)
    verdict = json.loads((out / "studies/variance/result.json").read_text())["verdict"]
    assert f"variance: {verdict} — {out / 'studies/variance'}" in log
    # the training was stopped after step 3 with a checkpoint, as at a call's time limit
    assert "train relu: stopped at the limit with a checkpoint" in log
    assert not (out / "train/listops-relu/results.json").exists()
    steps_done = [
        json.loads(line)["step"] for line in (out / "train/listops-relu/metrics.jsonl").read_text().splitlines()
    ]
    stopped_at = max(steps_done)
    assert 3 <= stopped_at < 6  # the SIGTERM came after step 3; the loop saves at the next step and stops
    # the next call (the same machine: the same state folder) finishes it from there
    # and packs what comes back into the 8 files the device tool returns
    out2 = tmp_path / "out2"
    run, log = _session("--dry-run", "train", "pack", out=out2, state=state, MIXERS="relu")
    assert run.returncode == 0, log
    assert "train relu: finished" in log
    assert len([p for p in out2.rglob("*") if p.is_file()]) <= 8
    with tarfile.open(out2 / "session.tar.gz") as packed:
        results = json.load(packed.extractfile("./train/listops-relu/results.json"))
    assert results["resumed_at_step"] == stopped_at and results["steps"] == 6 and 0 <= results["test_accuracy"] <= 1
    assert (state / "jax-cache").is_dir() and any((state / "jax-cache").iterdir())  # compiles kept for next calls


@pytest.mark.slow
def test_failures_hangs_and_killed_files_all_come_back_with_their_reasons(tmp_path):
    tests = tmp_path / "cases"
    tests.mkdir()
    (tests / "test_mixed.py").write_text(
        textwrap.dedent(
            """
            import time

            def test_passes():
                assert True

            def test_fails_with_a_reason():
                assert 1 + 1 == 3, "the reason a GPU run must bring back"

            def test_hangs():
                time.sleep(60)
            """
        )
    )
    (tests / "test_stuck_at_import.py").write_text("import time\ntime.sleep(120)\n\ndef test_never():\n    pass\n")
    # Every worker dies as it collects, as they did on a GPU whose XLA aborted on flags it did not know: no test
    # runs, and the abort's own message is only seen when the file runs again in one process.
    (tests / "test_crash_at_start.py").write_text(
        "import os, sys\n\nsys.stderr.write('Unknown flags in XLA_FLAGS: --xla_cpu_nonsense\\n')\nsys.stderr.flush()\n"
        "os.abort()\n\ndef test_never_runs():\n    pass\n"
    )
    files = f"{tests / 'test_mixed.py'} {tests / 'test_stuck_at_import.py'} {tests / 'test_crash_at_start.py'}"
    run, log = _session(
        "--dry-run", "kernel-tests", out=tmp_path / "out", state=tmp_path / "state", KERNEL_TESTS=files,
        TEST_LIMIT="3", FILE_LIMIT="15", timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, log
    failures = (tmp_path / "out/failures.txt").read_text()
    assert "FAILED" in failures and "test_fails_with_a_reason" in failures
    assert "the reason a GPU run must bring back" in failures  # the whole assertion message, not one line
    assert "test_hangs" in failures and "crashed" in failures  # a hung test costs its own time limit only
    assert "TIMEOUT" in failures and "test_stuck_at_import.py" in failures  # a hung file costs that file only
    assert "killed at the file's limit" in (tmp_path / "out/junit/test_stuck_at_import.timeout").read_text()
    assert "test_passes" not in failures
    assert "=== EXIT" in failures and "test_crash_at_start.py: pytest ended without a result" in failures
    assert "node down" in failures and "Unknown flags in XLA_FLAGS: --xla_cpu_nonsense" in failures


def _junit(path: Path, tests: int, failures: int = 0, errors: int = 0, skipped: int = 0) -> None:
    path.write_text(
        f'<testsuites><testsuite name="pytest" tests="{tests}" failures="{failures}" errors="{errors}" '
        f'skipped="{skipped}"/></testsuites>'
    )


def test_the_summary_passes_only_whole_files_with_no_failure(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks/gpu"))
    try:
        import summarise_tests
    finally:
        sys.path.pop(0)
    _junit(tmp_path / "test_relu_attention_triton.xml", tests=40, skipped=8)
    _junit(tmp_path / "test_linear_attention_triton.xml", tests=30, failures=1)
    _junit(tmp_path / "test_relu_attention_mosaic_gpu.xml", tests=12, skipped=12)  # nothing ran: not a pass
    (tmp_path / "test_linear_attention_mosaic_gpu.timeout").write_text("killed after 300 s")
    got = {row["file"].split("/")[-1]: (row["passed"], row["result"]) for row in summarise_tests.summarise(tmp_path)}
    assert got == {
        "test_relu_attention_triton.py": (True, "32 passed, 0 failed, 0 errors, 8 skipped"),
        "test_linear_attention_triton.py": (False, "29 passed, 1 failed, 0 errors, 0 skipped"),
        "test_relu_attention_mosaic_gpu.py": (False, "0 passed, 0 failed, 0 errors, 12 skipped"),
        "test_linear_attention_mosaic_gpu.py": (False, "stopped at its time limit (killed after 300 s)"),
    }
