"""`lra-compare`: run a sweep of LRA trainings (task × mixer variant × seed) and tabulate it (`lra_flax.compare`).

lra-compare --config=lra_flax/configs/compare.py:demo --workdir=runs/compare [--cells | --report_only]
"""

from __future__ import annotations

import sys

from absl import app, flags

from lra_flax import compare
from lra_flax.configs.compare import SWEEP_FIELDS
from zoo import config_fields
from zoo.files import require_local
from zoo.plots import MissingExtra
from zoo.training import cli
from zoo.training.config import check_output_dir

_CONFIG = cli.define_config_flag("Sweep config (lra_flax/configs/compare.py:PRESET).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Sweep directory: cells/ and the reports.")
_CELLS = flags.DEFINE_bool("cells", False, "List the cells and their state; run nothing.")
_SHARD = flags.DEFINE_string("shard", "1/1", "Run only shard i of n (cell k belongs to shard k mod n + 1).")
_RETRY = flags.DEFINE_bool("retry_failed", False, "Run failed cells and failed efficiency entries again.")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Only rebuild the reports from finished cells.")
flags.mark_flags_as_required(["config", "workdir"])

# The fields that make a config a sweep's (its cells); a sweep file's other fields keep their declared defaults.
_CELL_FIELDS = tuple(f for f in SWEEP_FIELDS if f.name in ("tasks", "variants", "seeds"))
SWEEP_CONFIG = {"lra_flax/configs/compare.py": {"": _CELL_FIELDS}}
SWEEP_CONFIG_KIND = "an lra-compare sweep config (lra_flax/configs/compare.py)"


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value
    try:
        problem = cli.foreign_config_problem(config, SWEEP_CONFIG, "lra-compare", what=SWEEP_CONFIG_KIND)
        if problem is not None:
            raise ValueError(problem)
        config = config_fields.completed(SWEEP_FIELDS, config)
        if problems := compare.sweep_problems(config):  # before anything runs, --cells too
            raise ValueError("invalid sweep config: " + "; ".join(problems))
        # The sweep runs its cells as local subprocesses that append to local logs; a cell's own workdir
        # (lra-train) may be a URL, the sweep's directory may not.
        root = require_local(_WORKDIR.value, "--workdir")
        check_output_dir(root, "--workdir")
        compare.check_sweep_dir(root, must_exist=_REPORT_ONLY.value)
        all_cells = compare.cells(config)
        if _CELLS.value:
            i, n = compare.parse_shard(_SHARD.value)
            changed, failing = compare.changed_cells(config, root), 0
            for cell in compare.shard(all_cells, i, n):
                if cell.name in changed:
                    state, note = "changed", f"  trained with: {changed[cell.name]}"
                else:
                    state = compare.state(cell, root)
                    problem = compare.config_problem(cell) if state != "done" else None
                    note = f"  will fail: {problem}" if problem else ""
                    failing += problem is not None
                print(f"{state:8}  {cell.name}  ({cell.config_spec}){note}")
            if failing:  # a script that checks the sweep first learns it would fail
                raise ValueError(f"{failing} of the listed cells will fail (each says why above); nothing was run")
            return
        compare.check_cells_unchanged(config, root)
        counts = {}
        if _REPORT_ONLY.value and all(compare.state(cell, root) in ("to do", "started") for cell in all_cells):
            raise ValueError(
                f"--report_only: none of the {len(all_cells)} cells in {root} has finished, so there is nothing to "
                "report: run the sweep without --report_only"
            )
        if not _REPORT_ONLY.value:
            counts = compare.run_sweep(config, root, shard_spec=_SHARD.value, retry_failed=_RETRY.value)
            if _SHARD.value == "1/1" and not counts.get("preempted"):
                # one machine only: timings on a shared host would mislead
                counts["efficiency failed"] = compare.run_efficiency(config, root, retry_failed=_RETRY.value)["failed"]
        paths = compare.write_report(config, root)
    except (ValueError, OSError, MissingExtra) as e:
        print(f"lra-compare: error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # finished cells are kept, a started one has its checkpoints
        print(
            "lra-compare: interrupted; finished cells are kept and the one under way resumes from its last "
            "checkpoint: run the same command to go on",
            file=sys.stderr,
        )
        sys.exit(130)
    print("\n".join(f"{name}: {path}" for name, path in paths.items()))
    if counts.get("preempted"):
        sys.exit(compare.PREEMPTED_EXIT_CODE)
    if counts.get("busy"):
        print(
            f"lra-compare: {counts['busy']} cell(s) were being run by another lra-compare on this sweep; run "
            "--report_only once it ends",
            file=sys.stderr,
        )
    if counts.get("failed"):  # the reports are written, failures included; a script still learns of them
        print(
            f"lra-compare: {counts['failed']} cell(s) of this shard failed (each cell's failed.json and train.log "
            "say why; --retry_failed runs them again)",
            file=sys.stderr,
        )
    if counts.get("efficiency failed"):
        print(
            f"lra-compare: {counts['efficiency failed']} of the efficiency entries failed (each "
            "efficiency/VARIANT/L<length>.json says why; --retry_failed runs them again)",
            file=sys.stderr,
        )
    if counts.get("failed") or counts.get("efficiency failed"):
        sys.exit(1)


def run() -> None:
    # Not `cli.run`: the sweep is one local process that starts its cells as commands of their own.
    fields = "\n".join(config_fields.help_lines(SWEEP_FIELDS, ""))
    cli.before_parsing(main, "lra-compare", help_epilogue=f"\nSweep config fields (--config.FIELD=value):\n{fields}\n")
    app.run(main, flags_parser=cli.flags_parser("lra-compare"))


if __name__ == "__main__":
    run()
