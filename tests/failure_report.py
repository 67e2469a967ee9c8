"""A pytest plugin that writes every failure's full report to a file as it happens.

    PYTEST_FAILURES_FILE=out/failures.txt python -m pytest -p tests.failure_report ...

Each failed test (setup, call or teardown) and each collection error is appended with its node id and the
whole traceback, and the file is flushed at once, so a run that is killed later (a time limit, a crash of the
process) still leaves the reasons of the failures it reached. With pytest-xdist the controller writes the file.
"""

from __future__ import annotations

import os

_in_xdist_worker = False


def pytest_configure(config) -> None:
    global _in_xdist_worker
    _in_xdist_worker = hasattr(config, "workerinput")  # workers forward their reports to the controller


def _append(header: str, text: str) -> None:
    path = os.environ.get("PYTEST_FAILURES_FILE")
    if not path or _in_xdist_worker:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"=== {header}\n{text.rstrip()}\n\n")
        f.flush()


def pytest_runtest_logreport(report) -> None:
    if report.failed:
        # What the test printed comes too: a command's own report of an error is often the reason.
        captured = "".join(f"\n--- {name}\n{text.rstrip()}\n" for name, text in report.sections if text.strip())
        _append(f"FAILED {report.nodeid} ({report.when})", report.longreprtext + captured)


def pytest_collectreport(report) -> None:
    if report.failed:
        _append(f"ERROR collecting {report.nodeid}", report.longreprtext)
