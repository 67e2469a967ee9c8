"""tests/failure_report.py: every failure's full report lands in the file as it happens, once, with xdist too."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CASES = textwrap.dedent(
    """
    import pytest

    @pytest.fixture
    def broken():
        raise RuntimeError("a fixture that breaks")

    def test_passes():
        pass

    def test_fails():
        values = [1, 2, 3]
        print("what the test printed")
        assert sum(values) == 7, "sum of the values"

    def test_setup_error(broken):
        pass
    """
)


def _pytest(tmp_path, *args, **kwargs):
    report = tmp_path / "failures.txt"
    env = {**os.environ, "PYTEST_FAILURES_FILE": str(report), "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-p", "tests.failure_report", "-p", "no:cacheprovider", *args]
    return subprocess.Popen(command, cwd=tmp_path, env=env, **kwargs), report


@pytest.mark.parametrize("workers", ["0", "2"])
def test_each_failure_once_with_its_whole_report(tmp_path, workers):
    (tmp_path / "test_cases.py").write_text(CASES)
    process, report = _pytest(tmp_path, "-n", workers, "-q", "test_cases.py", stdout=subprocess.DEVNULL)
    assert process.wait(timeout=120) == 1
    text = report.read_text()
    assert text.count("=== FAILED test_cases.py::test_fails (call)") == 1
    assert "sum of the values" in text and "values = [1, 2, 3]" in text  # the message and the source lines
    assert "--- Captured stdout call\nwhat the test printed" in text
    assert text.count("=== FAILED test_cases.py::test_setup_error (setup)") == 1
    assert "a fixture that breaks" in text
    assert "test_passes" not in text


def test_a_run_killed_later_keeps_the_failures_it_reached(tmp_path):
    (tmp_path / "test_first.py").write_text("def test_fails():\n    assert False, 'reached before the kill'\n")
    (tmp_path / "test_second.py").write_text("import time\n\ndef test_hangs():\n    time.sleep(120)\n")
    process, report = _pytest(tmp_path, "-n", "0", "test_first.py", "test_second.py", stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (report.exists() and "reached before the kill" in report.read_text()):
        assert time.monotonic() < deadline and process.poll() is None, "the failure never reached the file"
        time.sleep(0.2)
    process.kill()
    process.wait()
    assert "reached before the kill" in report.read_text()


def test_without_the_variable_nothing_is_written(tmp_path):
    (tmp_path / "test_cases.py").write_text(CASES)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_FAILURES_FILE"}
    command = [sys.executable, "-m", "pytest", "-p", "tests.failure_report", "-p", "no:cacheprovider", "-q"]
    run = subprocess.run([*command, "test_cases.py"], cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 1
    assert {p.name for p in tmp_path.iterdir()} - {"__pycache__"} == {"test_cases.py"}
