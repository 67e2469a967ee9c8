"""What a GPU session's kernel tests gave, file by file: `python benchmarks/gpu/summarise_tests.py JUNIT_DIR OUT.json`.

Reads the per-file JUnit reports `session.sh kernel-tests` writes (`<test file stem>.xml`, or `<stem>.timeout` for
a file killed at its limit) and writes one row per file: the counts and whether the file passed (a report, at least
one test passed, none failed or errored; skipped tests count neither way). A person reads the failures, commits
this file beside the session's others, and adds an entry to `kernels.auto.TABLE` citing it for each build that
passed and was measured faster: the library itself never reads test reports.
"""

from __future__ import annotations

import datetime
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def junit_counts(path: Path) -> dict[str, int]:
    """Passed / failures / errors / skipped of a pytest JUnit XML report."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        for key in counts:
            counts[key] += int(suite.get(key, 0))
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def summarise(junit_dir: Path) -> list[dict]:
    """One row per test file with a report or a timeout marker in `junit_dir`, sorted by file."""
    rows = []
    stems = sorted({p.stem for p in junit_dir.iterdir() if p.suffix in (".xml", ".timeout")})
    for stem in stems:
        timeout = junit_dir / f"{stem}.timeout"
        row = {"file": f"tests/kernels/{stem}.py"}
        if timeout.exists():
            row.update(passed=False, result=f"stopped at its time limit ({timeout.read_text().strip()})")
        else:
            c = junit_counts(junit_dir / f"{stem}.xml")
            row.update(
                passed=c["passed"] > 0 and c["failures"] == 0 and c["errors"] == 0,
                result=f"{c['passed']} passed, {c['failures']} failed, {c['errors']} errors, {c['skipped']} skipped",
            )
        rows.append(row)
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not Path(argv[0]).is_dir():
        print("usage: python benchmarks/gpu/summarise_tests.py JUNIT_DIR OUT.json", file=sys.stderr)
        return 2
    import jax  # here, not at the top: the summary's tests need no backend

    device = jax.devices()[0]
    summary = {
        "device": device.device_kind,
        "compute_capability": getattr(device, "compute_capability", None),
        "jax": jax.__version__,
        "date": datetime.date.today().isoformat(),
        "files": summarise(Path(argv[0])),
    }
    Path(argv[1]).write_text(json.dumps(summary, indent=1) + "\n")
    for row in summary["files"]:
        print(f"{row['file']}: {'PASSED' if row['passed'] else 'not passed'} — {row['result']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
