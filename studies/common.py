"""What every study shares: its command line (`--tiny`, `--out`, `--record`) and the three files it writes."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from zoo.files import atomic_write_bytes
from zoo.training.config import check_output_dir

ROOT = Path(__file__).resolve().parent.parent / "benchmarks" / "studies"  # the committed results (`--record`)
RUNS = Path("runs") / "studies"  # where a study writes by default, relative to the working directory


NOT_MEASURABLE = "not measurable at this budget"


def left_the_plateau(perplexity: float, unigram: float) -> bool:
    """Whether a language model (masked or causal) learned more than word frequencies: held-out perplexity under
    half the unigram's. A comparison between models none of which did cannot support a verdict either way."""
    return perplexity < 0.5 * unigram


def write_study(out_dir: Path, result: dict, readme: str) -> None:
    """result.json and README.md into `out_dir` (the figure is the study's to draw there)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out_dir / "result.json", (json.dumps(result, indent=2, sort_keys=True) + "\n").encode())
    atomic_write_bytes(out_dir / "README.md", readme.encode())


def study_readme(
    name: str, tiny: bool, *, title: str, claim: str, setting: str, table: str, verdict: str, figure: str, notes=""
) -> str:
    """A study's README.md: the claim, the command and setting, the measured table, the verdict, the figure."""
    command = f"python -m studies.{name}" + (" --tiny" if tiny else "")
    parts = [f"# {title}", f"**Claim** {claim}", f"**Setting**: `{command}` — {setting}", table]
    parts.append(f"**Verdict**: {verdict}")
    if notes:
        parts.append(f"**What may explain it**: {notes}")
    parts.append(f"![{name}]({figure})")
    return "\n\n".join(parts) + "\n"


def output_dir(name: str, *, tiny: bool, out: Path | None, record: bool) -> Path:
    """Where a study writes: `out`; by default runs/studies/NAME (NAME-tiny with --tiny); with `record`, the
    committed results, benchmarks/studies/NAME — full runs only, and never both `record` and `out`."""
    if record and out is not None:
        raise ValueError("--record writes the committed results (benchmarks/studies/NAME): give it or --out, not both")
    if record and tiny:
        raise ValueError("--record is for full runs: a --tiny run checks the mechanics and is never committed")
    if record:
        return ROOT / name
    return out or RUNS / (f"{name}-tiny" if tiny else name)


def study_main(
    name: str, doc: str, run: Callable[[bool, Path], dict], report: Callable[[dict, Path], dict] | None = None
) -> None:
    """`python -m studies.NAME [--tiny] [--out DIR | --record] [--report]`: runs `run(tiny, out_dir)` and prints
    its verdict.

    Writes under runs/studies/NAME by default (NAME-tiny with --tiny, which checks the mechanics in seconds);
    `--record` replaces the committed results in benchmarks/studies/NAME, nothing else writes there. With
    `--report` (studies that separate measuring from judging) nothing is measured: the verdict, figure and
    README.md are made again from the folder's result.json, under the rule as it stands."""
    parser = argparse.ArgumentParser(prog=f"python -m studies.{name}", description=doc.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a few seconds: the mechanics, not the verdict")
    parser.add_argument("--out", type=Path, default=None, help=f"output folder (default {RUNS / name})")
    parser.add_argument("--record", action="store_true", help=f"write the committed results, {ROOT / name}")
    if report is not None:
        parser.add_argument("--report", action="store_true", help="judge the folder's result.json again, no runs")
    args = parser.parse_args()
    try:  # before any computation: a study can take hours
        out_dir = output_dir(name, tiny=args.tiny, out=args.out, record=args.record)
        check_output_dir(out_dir, "--out")
        out_dir.mkdir(parents=True, exist_ok=True)  # permissions alone do not tell (/proc, a read-only mount)
        measured = None
        if getattr(args, "report", False):
            if not (out_dir / "result.json").is_file():
                raise ValueError(f"--report: {out_dir / 'result.json'} does not exist (run the study first)")
            measured = json.loads((out_dir / "result.json").read_text())
    except (ValueError, OSError) as e:
        _usage_error(parser.prog, e)
    if measured is None:
        result = run(args.tiny, out_dir)
    else:
        try:  # a result.json the study's current report cannot read (recorded by an earlier version of it)
            result = report(measured, out_dir)
        except ValueError as e:
            _usage_error(parser.prog, ValueError(f"--report: {out_dir / 'result.json'}: {e}"))
        except KeyError as e:
            _usage_error(parser.prog, ValueError(f"--report: {out_dir / 'result.json'} has no field {e}"))
    print(f"{name}: {result['verdict']} — {out_dir}")


def _usage_error(prog: str, error: Exception) -> None:
    print(f"{prog}: error: {' '.join(str(error).split())}", file=sys.stderr)  # one line, a usage error's 2
    sys.exit(2)
