"""`make test`'s `--dist loadgroup`: the tests that use a module-scoped fixture of their file run on one pytest
worker, which computes the fixture once; the other tests spread over both workers (tests/worker_groups.py)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CASES = """
import os
import time

import pytest


def _record(kind, name):
    with open(os.path.join(os.environ["GROUPS_OUT"], f"{kind}-{name}-{os.environ['PYTEST_XDIST_WORKER']}"), "w"):
        pass


@pytest.fixture(scope="module")
def trained():
    _record("fixture", "trained")
    time.sleep(0.3)


@pytest.mark.parametrize("case", range(4))
def test_uses_the_fixture(trained, case):
    _record("shared", case)


@pytest.mark.parametrize("case", range(8))
def test_alone(case):
    time.sleep(0.2)
    _record("alone", case)
"""

CONFTEST = """
from tests.worker_groups import share_module_fixtures


def pytest_collection_modifyitems(config, items):
    share_module_fixtures(config, items)
"""


@pytest.mark.slow
def test_tests_sharing_a_module_fixture_run_on_one_worker_which_computes_it_once(tmp_path):
    (tmp_path / "test_cases.py").write_text(textwrap.dedent(CASES))
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "GROUPS_OUT": str(out), "PYTHONPATH": str(Path(__file__).parents[1])}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q", "-p", "no:cacheprovider", "."],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:]
    marks = [p.name.split("-") for p in out.iterdir()]
    fixture_workers = [worker for kind, _, worker in marks if kind == "fixture"]
    shared_workers = {worker for kind, _, worker in marks if kind == "shared"}
    assert len(fixture_workers) == 1 and shared_workers == set(fixture_workers), marks
    assert len([m for m in marks if m[0] == "shared"]) == 4
    assert {worker for kind, _, worker in marks if kind == "alone"} == {"gw0", "gw1"}  # the rest still spread
