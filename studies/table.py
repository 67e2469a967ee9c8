"""The README's table of the papers' claims, written from the committed results: one row per study, its figures
from the study's own `summary` of benchmarks/studies/NAME/result.json, its verdict as recorded there.

    python -m studies.table            # rewrites the table in README.md, between its two marker lines
    python -m studies.table --check    # exit 1 when README.md's table is not what the results say

A verdict recorded without the rule's parts (before `studies/verdict.py`) is shown as "not measurable at this
budget *(recorded before the rule as …)*": the rule did not give it. A "not measurable" or "partly reproduced"
verdict links to the study's README, where each part's reason says which part holds and what would settle the rest.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from studies.common import NOT_MEASURABLE, ROOT
from studies.verdict import PARTLY

NAMES = (
    "variance", "parameter_budget", "approximation", "kernel_convergence", "stability", "attention_distance",
    "sgu_ablation", "toeplitz", "amlp_alignment", "ffn_memory",
)  # fmt: skip
STUDIES = tuple(importlib.import_module(f"studies.{name}") for name in NAMES)  # the README's row order
README = ROOT.parents[1] / "README.md"
BEGIN = "<!-- the claims table: written by `python -m studies.table` from benchmarks/studies/*/result.json -->"
END = "<!-- end of the claims table -->"


def name_of(study) -> str:
    return study.__name__.rpartition(".")[2]


def row(study, root: Path = ROOT) -> str:
    name = name_of(study)
    result = json.loads((root / name / "result.json").read_text())
    verdict = result["verdict"]
    if "parts" not in result:  # a verdict the rule did not give cannot stand as one
        verdict = f"{NOT_MEASURABLE} *(recorded before the rule as {verdict})*"
    elif verdict in (NOT_MEASURABLE, PARTLY):  # its README gives each part's reason and what would settle it
        verdict = f"[{verdict}](benchmarks/studies/{name}/README.md)"
    return f"| {study.CLAIM} | {study.PAPER} | {study.summary(result)} | {verdict} | `python -m studies.{name}` |"


def render(root: Path = ROOT) -> str:
    """The table, header and one row per study, from the results under `root`."""
    header = "| claim (paper) | the paper | here (mean ± std over seeds) | verdict | command |\n|---|---|---|---|---|"
    return "\n".join([header, *(row(study, root) for study in STUDIES)])


def readme_table(text: str) -> str:
    """The table between the markers of a README's text."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"README.md has no claims table: the lines {BEGIN!r} and {END!r} mark where it goes")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m studies.table", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write; exit 1 on a difference")
    args = parser.parse_args()
    text, table = README.read_text(), render()
    try:
        current = readme_table(text)
    except ValueError as e:
        print(f"python -m studies.table: error: {e}", file=sys.stderr)
        sys.exit(2)
    if args.check:
        if current != table:
            print("README.md's claims table differs from the committed results: run `python -m studies.table`")
            sys.exit(1)
        return
    README.write_text(text.replace(f"{BEGIN}\n{current}\n{END}", f"{BEGIN}\n{table}\n{END}"))
    print(f"{README}: the claims table written from {len(STUDIES)} results")


if __name__ == "__main__":
    main()
