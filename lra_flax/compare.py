"""`lra-compare`: run a sweep of LRA cells (task × mixer variant × seed) and tabulate accuracy.

    lra-compare --config=lra_flax/configs/compare.py:demo --workdir=runs/compare         # run what is missing
    lra-compare --config=lra_flax/configs/compare.py:demo --workdir=runs/compare --cells # list cells, run nothing
    lra-compare ... --shard=1/3        # this process runs every third cell (several machines, one workdir)
    lra-compare ... --report_only      # rebuild results.{md,csv,json} and the figure from finished cells

Each cell is an ordinary `lra-train` run in `WORKDIR/cells/<task>/<variant>/seed<k>` (its own config.json,
checkpoints, metrics and results.json), started as a subprocess so that a crash or an out-of-memory error
in one cell cannot take the sweep down; a cell whose config the harness's validation refuses is recorded as
failed without starting one. A finished cell (results.json) is skipped; an interrupted one
resumes from its checkpoint; a failed one is recorded in `failed.json` with its reason and retried only
with --retry_failed. So a sweep can be stopped, re-run, or extended with more seeds or variants at any time.
A sweep whose cells were trained with other settings than it gives them now (an edited width, a variant's
option, more steps) is refused, naming the cells and fields: results of one setting never enter the table of
another.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib
import io
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import ml_collections

from lra_flax.configs.compare import SWEEP_FIELDS
from lra_flax.tasks import REGISTRY, published_rows
from zoo.config_fields import problems as field_problems
from zoo.files import atomic_write_bytes, parse_ordered_pair, read_json
from zoo.plots import pyplot, save_figure
from zoo.training.config import RESUMABLE_FIELDS, config_changes, flatten_config, has_run_output
from zoo.training.distributed import PREEMPTED_EXIT_CODE
from zoo.training.validate import config_problems
from zoo.training.workdir_lock import WorkdirBusy, WorkdirLock

FAILED = "failed.json"
RESULTS = "results.json"
CELL_LOCK = "sweep.lock"  # held by the lra-compare process that runs the cell
CONFIGS_DIR = Path(__file__).resolve().parent / "configs"  # the presets cells and efficiency entries run

TASK_ORDER = tuple(REGISTRY)  # the LRA paper's table order


@dataclasses.dataclass(frozen=True)
class Cell:
    task: str  # the sweep's task label
    config_spec: str  # "module:preset" under lra_flax/configs
    variant: str
    mixer: str
    options: tuple[tuple[str, object], ...]
    seed: int
    overrides: tuple[tuple[str, object], ...]

    @property
    def name(self) -> str:
        return f"{self.task}/{self.variant}/seed{self.seed}"

    def workdir(self, root: Path) -> Path:
        return root / "cells" / self.task / self.variant / f"seed{self.seed}"

    def train_command(self, root: Path) -> list[str]:
        cmd = [sys.executable, "-m", "lra_flax", f"--config={config_path(self.config_spec)}"]
        cmd += [f"--workdir={self.workdir(root)}", f"--config.model.mixer={self.mixer}", f"--config.seed={self.seed}"]
        cmd += [f"--config.model.mixer_options.{self.mixer}.{k}={v}" for k, v in self.options]
        cmd += [f"--config.{k}={v}" for k, v in self.overrides]
        return cmd


def config_path(spec: str) -> str:
    """ "module:preset" as the `--config` of a command: the preset file of the installed package, so that a sweep
    run from any directory finds it."""
    module, _, preset = spec.partition(":")
    return f"{CONFIGS_DIR / module}.py:{preset}"


def check_sweep_dir(root: Path, *, must_exist: bool) -> None:
    """Refuses a folder that is not a sweep's: a training run's workdir (its results.json would be replaced by
    the sweep's report), or, when only reports are asked for, a folder with no cells."""
    if (root / "config.json").exists():  # a sweep writes none there, each cell's is in its own folder
        raise ValueError(
            f"--workdir={root} is a training run's workdir (it holds config.json), not a sweep's: give "
            "lra-compare a folder of its own"
        )
    if must_exist and not (root / "cells").is_dir():
        raise ValueError(f"--workdir={root} holds no sweep (no cells/ folder): run the sweep there first")


def _items(node) -> tuple[tuple[str, object], ...]:
    """A (nested) dict of overrides as sorted ("a.b", value) pairs."""
    if node is None:
        return ()
    data = node.to_dict() if isinstance(node, ml_collections.ConfigDict) else dict(node)
    return tuple(sorted(flatten_config(data).items()))


def cells(config: ml_collections.ConfigDict) -> list[Cell]:
    """Every cell of the sweep, in a fixed order (task, variant, seed) that --shard splits."""
    out = []
    for task, spec in config.tasks.items():
        task_overrides = _items(config.task_overrides.get(task)) if "task_overrides" in config else ()
        overrides = tuple(sorted(_items(config.overrides) + task_overrides))
        out += [
            Cell(task, spec, name, variant.mixer, _items(variant.get("options")), int(seed), overrides)
            for name, variant in config.variants.items()
            for seed in config.seeds
        ]
    return out


def parse_shard(text: str) -> tuple[int, int]:
    """ "i/n" with 1 <= i <= n."""
    return parse_ordered_pair(text, "/", "--shard", "i/n (e.g. 1/4)")


def shard(all_cells: Sequence[Cell], i: int, n: int) -> list[Cell]:
    """Cells k with k mod n == i − 1: every cell in exactly one of the n shards."""
    return [c for k, c in enumerate(all_cells) if k % n == i - 1]


def state(cell: Cell, root: Path) -> str:
    workdir = cell.workdir(root)
    if (workdir / RESULTS).exists():
        return "done"
    if (workdir / FAILED).exists():
        return "failed"
    if (workdir / "checkpoints").exists():
        return "started"
    return "to do"


# Fields a finished cell's results do not depend on (how often it logged, where its caches went, ...); every
# other field, train.steps included, makes a different cell.
_RESULT_NEUTRAL_FIELDS = RESUMABLE_FIELDS - {"train.steps"}


def changed_cells(config: ml_collections.ConfigDict, root: Path) -> dict[str, str]:
    """{cell name: its changed fields} of the cells that trained (results.json or a checkpoint) with another config
    than the sweep gives them now: an edited sweep (another width, a variant's option, more steps) would otherwise
    report the old cells as its."""
    changed = {}
    for cell in cells(config):
        workdir = cell.workdir(root)
        if not (workdir / "config.json").exists() or not has_run_output(workdir):
            continue
        try:
            now = cell_config(cell)
        except (KeyError, TypeError, ValueError, AttributeError, ImportError):
            continue  # a field only the command's flag parser converts: the cell's own run checks it
        changes = {
            k: v for k, v in config_changes(now, workdir / "config.json").items() if k not in _RESULT_NEUTRAL_FIELDS
        }
        if changes:
            changed[cell.name] = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changes.items())
    return changed


def check_cells_unchanged(config: ml_collections.ConfigDict, root: Path) -> None:
    """Refuses a sweep whose workdir holds cells trained with other settings than the sweep's now."""
    lines = [f"{name}: {fields}" for name, fields in changed_cells(config, root).items()]
    if lines:
        more = f"; and {len(lines) - 5} more" if len(lines) > 5 else ""
        raise ValueError(
            f"--workdir={root} holds {len(lines)} cell(s) trained with other settings than this sweep gives them: "
            f"{'; '.join(lines[:5])}{more}. Use a new --workdir, or delete those cells' folders to train them "
            "again with these settings. Nothing was changed."
        )


def _reason(log_tail: str, returncode: int) -> str:
    lines = [line for line in log_tail.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() or "Error" in line]
    return (errors[-1] if errors else lines[-1] if lines else f"exit status {returncode}").strip()[:500]


def config_module(cell: Cell) -> ModuleType:
    """The config module under lra_flax/configs that the cell's config spec names."""
    return importlib.import_module(f"lra_flax.configs.{cell.config_spec.partition(':')[0]}")


def cell_fields(cell: Cell) -> dict[str, object]:
    """The fields the cell's command sets on its preset ("model.mixer", "seed", overrides, mixer options)."""
    fields = {"model.mixer": cell.mixer, "seed": cell.seed, **dict(cell.overrides)}
    fields.update({f"model.mixer_options.{cell.mixer}.{k}": v for k, v in cell.options})
    return fields


def cell_config(cell: Cell) -> ml_collections.ConfigDict:
    """The config the cell's command trains with, built here: its preset with the cell's fields set."""
    config = config_module(cell).get_config(cell.config_spec.partition(":")[2])
    config.update_from_flattened_dict(cell_fields(cell))
    return config


def _preset_config(spec: str, field: str) -> ml_collections.ConfigDict:
    """The config that `field`'s "module:preset" names; ValueError naming the field when there is none."""
    module, _, preset = spec.partition(":")
    try:
        return importlib.import_module(f"lra_flax.configs.{module}").get_config(preset)
    except ModuleNotFoundError:
        raise ValueError(f"{field}={spec!r}: there is no task config module lra_flax/configs/{module}.py") from None
    except ValueError as e:
        raise ValueError(f"{field}={spec!r}: {e}") from None


def _set_fields(config: ml_collections.ConfigDict, fields: dict[str, object], module: str, prefix: str = "") -> bool:
    """Sets `fields` on `config` as the command line would; ValueError naming the first the config does not have
    (`prefix` heads its name). False when a value has a type only the command's flag parser converts: the rest is
    the command's check."""
    for field, value in fields.items():
        try:
            config.update_from_flattened_dict({field: value})
        except (KeyError, AttributeError):
            raise ValueError(f"{prefix}{field}: {module} configs have no such field") from None
        except (TypeError, ValueError):
            return False
    return True


def config_problem(cell: Cell) -> str | None:
    """What the cell's command would refuse ("invalid config: ...", a task module or a field that does not
    exist), or None. A value this cannot set as the command line would (a type that only the flag parser
    converts) leaves the check to the command."""
    try:
        config = _preset_config(cell.config_spec, f"tasks.{cell.task}")
        if not _set_fields(config, cell_fields(cell), cell.config_spec.partition(":")[0]):
            return None
    except ValueError as e:
        return str(e)
    problems = config_problems(config, config_module(cell).CONFIG_SECTIONS)
    return "invalid config: " + "; ".join(problems) if problems else None


def sweep_problems(config: ml_collections.ConfigDict) -> list[str]:
    """Every problem with the sweep config's own fields (`SWEEP_FIELDS`), one line each naming the field; the
    efficiency task's preset and override fields too (a cell's preset, mixer and fields are the cell's check)."""
    problems = field_problems(config, SWEEP_FIELDS, "")
    if problems:
        return problems
    tasks = ", ".join(config.tasks) or "none"
    problems += [
        f"task_overrides.{name} names no task of this sweep (tasks: {tasks})"
        for name in config.task_overrides
        if name not in config.tasks
    ]
    eff = config.efficiency
    if eff.lengths:
        try:
            preset = _preset_config(eff.task, "efficiency.task")
            _set_fields(preset, dict(_items(eff.overrides)), eff.task.partition(":")[0], "efficiency.overrides.")
        except ValueError as e:
            problems.append(str(e))
    return problems


def run_cell(cell: Cell, root: Path, *, env: dict | None = None) -> str:
    """Runs (or resumes) one cell; returns "done", "failed", "preempted" (stopped by a signal or a
    preemption: re-running resumes it) or "busy" (another lra-compare holds the cell). A config that validation
    refuses fails here, without a process (seconds of start-up a cell). Output goes to the cell's train.log."""
    workdir = cell.workdir(root)
    workdir.mkdir(parents=True, exist_ok=True)
    # The cell's lock, taken before its process starts (lra-train takes the workdir's own lock only after
    # compiling): a second sweep on the same folder passes over the cell instead of failing it.
    lock = WorkdirLock(workdir, name=CELL_LOCK)
    try:
        lock.acquire()
    except WorkdirBusy:
        return "busy"
    try:
        if state(cell, root) == "done":  # finished by another sweep since this one looked
            return "done"
        return _run_cell_process(cell, root, env)
    finally:
        lock.release()


def _run_cell_process(cell: Cell, root: Path, env: dict | None) -> str:
    workdir, cmd = cell.workdir(root), cell.train_command(root)
    (workdir / FAILED).unlink(missing_ok=True)
    returncode, reason = None, config_problem(cell)
    with (workdir / "train.log").open("a") as log:
        log.write(f"$ {' '.join(cmd)}\n" + ("" if reason is None else f"not started: {reason}\n"))
        if reason is None:
            log.flush()
            env = {**os.environ, **(env or {})}
            returncode = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    if returncode is not None:
        if returncode == 0 and (workdir / RESULTS).exists():
            return "done"
        if returncode == PREEMPTED_EXIT_CODE or returncode < 0:
            return "preempted"  # stopped from outside (preemption, a signal): not the cell's fault, resume later
        reason = _reason((workdir / "train.log").read_text()[-4000:], returncode)
    record = {"returncode": returncode, "reason": reason[:500], "command": cmd}
    _write(workdir / FAILED, json.dumps(record, indent=1) + "\n")
    return "failed"


def run_sweep(
    config: ml_collections.ConfigDict,
    root: str | os.PathLike,
    *,
    shard_spec: str = "1/1",
    retry_failed: bool = False,
    env: dict | None = None,
) -> dict[str, int]:
    """Runs this shard's unfinished cells in order, one progress line each; returns counts by outcome."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    mine = shard(cells(config), *parse_shard(shard_spec))
    runnable = ("to do", "started", "failed") if retry_failed else ("to do", "started")
    todo = [c for c in mine if state(c, root) in runnable]
    counts = {"done": 0, "failed": 0, "skipped": len(mine) - len(todo)}
    start = time.perf_counter()
    print(f"lra-compare: {len(mine)} cells in shard {shard_spec}, {len(todo)} to run", flush=True)
    for k, cell in enumerate(todo, start=1):
        cell_start = time.perf_counter()
        outcome = run_cell(cell, root, env=env)
        if outcome == "preempted":
            print(f"lra-compare: {cell.name} was stopped from outside; run the same command to resume", flush=True)
            counts["preempted"] = 1
            break
        counts[outcome] = counts.get(outcome, 0) + 1
        elapsed = time.perf_counter() - start
        remaining = elapsed / k * (len(todo) - k)
        if outcome == "busy":
            detail = "another lra-compare is running it"
        elif outcome == "done":
            result = read_json(cell.workdir(root) / RESULTS)
            detail = f"test accuracy {100 * result.get('test_accuracy', float('nan')):.1f}%"
        else:
            detail = read_json(cell.workdir(root) / FAILED)["reason"]
        print(
            f"[{k}/{len(todo)}] {cell.name}: {outcome} in {time.perf_counter() - cell_start:.0f}s ({detail}); "
            f"elapsed {elapsed / 60:.1f} min, about {remaining / 60:.1f} min to go",
            flush=True,
        )
    return counts


# Efficiency (the LRA paper's Table 2 shape): measured steps/s and memory per mixer and length.

OUT_OF_MEMORY_SIGNS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "MemoryError", "Cannot allocate")


def efficiency_entries(config: ml_collections.ConfigDict) -> list[tuple[str, int]]:
    eff = config.get("efficiency")
    if eff is None or not eff.lengths:
        return []
    return [(variant, int(length)) for variant in config.variants for length in eff.lengths]


def efficiency_path(root: Path, variant: str, length: int) -> Path:
    return root / "efficiency" / variant / f"L{length}.json"


def efficiency_command(config: ml_collections.ConfigDict, variant: str, length: int, output: Path) -> list[str]:
    eff, v = config.efficiency, config.variants[variant]
    cmd = [sys.executable, "-m", "lra_flax.efficiency", f"--config={config_path(eff.task)}"]
    cmd += [f"--config.model.max_length={length}", f"--config.model.mixer={v.mixer}", f"--output={output}"]
    cmd += [f"--config.model.mixer_options.{v.mixer}.{k}={val}" for k, val in _items(v.get("options"))]
    cmd += [f"--config.{k}={val}" for k, val in _items(eff.get("overrides"))]
    return [*cmd, f"--steps={eff.steps}", f"--warmup={eff.warmup}"]


def efficiency_failed(record: dict) -> bool:
    """An entry that measured nothing for another reason than running out of memory (a result in the LRA paper's
    table, not a failure)."""
    return "error" in record and record["error"] != "out of memory"


def run_efficiency(
    config: ml_collections.ConfigDict,
    root: str | os.PathLike,
    *,
    retry_failed: bool = False,
    env: dict | None = None,
) -> dict[str, int]:
    """Measures every (variant, length) not yet measured (and failed ones with `retry_failed`), each in its own
    process; returns how many ran and how many of those failed (`efficiency_failed`)."""
    root, counts = Path(root), {"ran": 0, "failed": 0}
    entries = efficiency_entries(config)
    for k, (variant, length) in enumerate(entries, start=1):
        path = efficiency_path(root, variant, length)
        if path.exists() and not (retry_failed and efficiency_failed(read_json(path))):
            continue
        path.unlink(missing_ok=True)  # a failed entry run again: its record is what the new run leaves
        start = time.perf_counter()
        cmd = efficiency_command(config, variant, length, path)
        try:
            proc = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=config.efficiency.timeout_s,
                env={**os.environ, **(env or {})},
            )
            output, returncode = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired:
            output, returncode = "", None
        if not path.exists():
            if returncode is None:
                error = f"timed out after {config.efficiency.timeout_s}s"
            elif returncode == -9 or any(sign in output for sign in OUT_OF_MEMORY_SIGNS):
                error = "out of memory"
            else:
                error = _reason(output, returncode)
            _write(path, json.dumps({"mixer": config.variants[variant].mixer, "length": length, "error": error}) + "\n")
        result = read_json(path)
        counts["ran"] += 1
        counts["failed"] += efficiency_failed(result)
        what = result.get("error") or f"{result['steps_per_s']:.3g} steps/s, {result['memory_bytes'] / 2**20:,.0f} MiB"
        print(
            f"[efficiency {k}/{len(entries)}] {variant} at {length}: {what} ({time.perf_counter() - start:.0f}s)",
            flush=True,
        )
    return counts


def collect_efficiency(config: ml_collections.ConfigDict, root: Path) -> list[dict]:
    rows = []
    for variant, length in efficiency_entries(config):
        path = efficiency_path(root, variant, length)
        if path.exists():
            rows.append({"variant": variant, **read_json(path), "length": length})
    return rows


def efficiency_table(config: ml_collections.ConfigDict, rows: list[dict], baseline: str = "softmax") -> str:
    """Markdown: per variant and length, steps/s and memory, each also as a ratio to the baseline variant."""
    lengths = [int(x) for x in config.efficiency.lengths]
    by = {(r["variant"], r["length"]): r for r in rows}
    header = "| variant | " + " | ".join(
        f"{L:,}: steps/s (×{baseline}) | {L:,}: memory MiB (×{baseline}) | {L:,}: MFU" for L in lengths
    )
    lines = [header + " |", "|---" * (1 + 3 * len(lengths)) + "|"]

    def ratio(r, b, key):  # r's value as a multiple of the baseline's, where that was measured
        return f" (×{r[key] / b[key]:.2f})" if b is not None and "error" not in b and b[key] else ""

    for variant in config.variants:
        cells_text = []
        for L in lengths:
            r, b = by.get((variant, L)), by.get((baseline, L))
            if r is None:
                cells_text += ["—", "—", "—"]
            elif "error" in r:
                shown = r["error"] if r["error"] == "out of memory" or r["error"].startswith("timed out") else "failed"
                cells_text += [shown, shown, shown]
            else:
                cells_text += [
                    f"{r['steps_per_s']:.3g}" + ratio(r, b, "steps_per_s"),
                    f"{r['memory_bytes'] / 2**20:,.0f}" + ratio(r, b, "memory_bytes"),
                    f"{100 * r['mfu']:.1f}%" if "mfu" in r else "—",
                ]
        lines.append(f"| {variant} | " + " | ".join(cells_text) + " |")
    sources = sorted({r["memory_source"] for r in rows if "memory_source" in r})
    devices = sorted({r["device"] for r in rows if "device" in r})
    batch = sorted({r["batch_size"] for r in rows if "batch_size" in r})
    lines += [
        "",
        *_softmax_paths(rows),
        f"Task {config.efficiency.task}, batch {', '.join(map(str, batch))}, {config.efficiency.steps} timed train "
        f"steps after compilation and {config.efficiency.warmup} warm-up; device {', '.join(devices)}; memory: "
        f"{'; '.join(sources) or '—'}. MFU: the model FLOPs of a train step (zoo/training/flops.py) per second over "
        f"the device's peak ({'; '.join(sorted({r['peak_source'] for r in rows if 'peak_source' in r})) or '—'}).",
    ]
    return "\n".join(lines)


def _softmax_paths(rows: list[dict]) -> list[str]:
    """A line naming the implementation behind the softmax figures of `rows` (results.json / efficiency files)."""
    paths = sorted({r["softmax_attention"] for r in rows if r.get("softmax_attention")})
    return [f"Softmax attention computed by: {'; '.join(paths)}.", ""] if paths else []


def efficiency_figure(config: ml_collections.ConfigDict, rows: list[dict], path: Path) -> Path:
    """steps/s and memory against length, log axes, one line per variant."""
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for variant in config.variants:
        points = sorted((r["length"], r) for r in rows if r["variant"] == variant and "error" not in r)
        if not points:
            continue
        xs = [p[0] for p in points]
        axes[0].plot(xs, [p[1]["steps_per_s"] for p in points], marker="o", label=variant)
        axes[1].plot(xs, [p[1]["memory_bytes"] / 2**20 for p in points], marker="o", label=variant)
    for ax, label in zip(axes, ("train steps/s", "memory (MiB)"), strict=True):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"lra-compare efficiency: {config.efficiency.task}")
    fig.tight_layout()
    return save_figure(fig, path)


def _results_problem(results) -> str | None:
    """Why a cell's results.json cannot be tabulated (None: it can): it must hold a test accuracy in [0, 1]."""
    if not isinstance(results, dict):
        return f"not a results record (a JSON object), but {type(results).__name__}"
    accuracy = results.get("test_accuracy")
    if isinstance(accuracy, bool) or not isinstance(accuracy, int | float) or not 0 <= accuracy <= 1:
        return f"test_accuracy={accuracy!r} is not an accuracy in [0, 1]"
    return None


def collect(config: ml_collections.ConfigDict, root: str | os.PathLike) -> list[dict]:
    """One row per cell: its identity, state, every metric of results.json (or the failure reason)."""
    root = Path(root)
    rows = []
    for cell in cells(config):
        workdir = cell.workdir(root)
        row = {
            "task": cell.task,
            "config": cell.config_spec,
            "variant": cell.variant,
            "mixer": cell.mixer,
            "options": json.dumps(dict(cell.options), sort_keys=True),
            "seed": cell.seed,
            "state": state(cell, root),
            "workdir": str(workdir),
        }
        if row["state"] == "done":
            results = read_json(workdir / RESULTS)
            if (problem := _results_problem(results)) is None:
                row.update(results)
            else:  # a file edited or written by something else: shown as such, never averaged into the table
                row.update(state="failed", reason=f"{workdir / RESULTS}: {problem}")
        elif row["state"] == "failed":
            row["reason"] = read_json(workdir / FAILED)["reason"]
        rows.append(row)
    return rows


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value); exactly 0 for equal values (`statistics` computes in
    exact fractions: a float sum's rounding would read as spread)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _accuracies(rows: list[dict], variant: str, task: str) -> list[float]:
    """Test accuracies (%) of the finished cells of `variant` on `task`."""
    done = (r for r in rows if r["state"] == "done")
    return [100 * r["test_accuracy"] for r in done if r["variant"] == variant and r["task"] == task]


def accuracy_table(config: ml_collections.ConfigDict, rows: list[dict]) -> str:
    """Markdown, the LRA paper's Table 1 shape: variants × tasks (mean ± std over seeds, n), best in bold."""
    tasks = [t for t in TASK_ORDER if t in config.tasks] + [t for t in config.tasks if t not in TASK_ORDER]
    stats: dict[tuple[str, str], tuple[float, float, int] | str] = {}
    for variant in config.variants:
        for task in tasks:
            if accs := _accuracies(rows, variant, task):
                stats[variant, task] = (*mean_std(accs), len(accs))
            elif any(r["state"] == "failed" and (r["variant"], r["task"]) == (variant, task) for r in rows):
                stats[variant, task] = "failed"
    best = {}
    for task in tasks:
        means = [s[0] for (v, t), s in stats.items() if t == task and not isinstance(s, str)]
        best[task] = max(means) if means else None

    def fmt(variant, task):
        s = stats.get((variant, task))
        if s is None:
            return "—"
        if isinstance(s, str):
            return s
        text = f"{s[0]:.1f} ± {s[1]:.1f} (n={s[2]})"
        return f"**{text}**" if best[task] is not None and s[0] == best[task] and len(config.variants) > 1 else text

    lines = ["| variant | " + " | ".join(tasks) + " | average |", "|---" * (len(tasks) + 2) + "|"]
    for variant in config.variants:
        means = [stats[variant, t][0] for t in tasks if isinstance(stats.get((variant, t)), tuple)]
        average = f"{sum(means) / len(means):.1f}" if len(means) == len(tasks) else "—"
        lines.append(f"| {variant} | " + " | ".join(fmt(variant, t) for t in tasks) + f" | {average} |")
    for name, numbers in published_rows().items():  # docs/tasks.md
        if not any(numbers.get(t) is not None for t in tasks):
            continue
        cells_text = [f"{numbers[t]:.2f}" if numbers.get(t) is not None else "—" for t in tasks]
        lines.append(f"| *{name} (published)* | " + " | ".join(cells_text) + " | |")
    presets = sorted({spec for spec in config.tasks.values()})
    notes = [
        "",
        *_softmax_paths(rows),
        "Cells: test accuracy (%), mean ± sample std over seeds, n = finished seeds; best mean per task in bold.",
        f"Presets: {', '.join(presets)}.",
    ]
    merged = {cell.task: cell.overrides for cell in cells(config)}  # the sweep's and the task's overrides
    changed = {t: merged.get(t, ()) for t in tasks}
    if any(changed.values()):
        notes.append(
            "Sweep overrides of the presets: "
            + "; ".join(f"{t}: " + ", ".join(f"{k}={v}" for k, v in items) for t, items in changed.items() if items)
            + "."
        )
    examples = {
        t: sorted({int(r["test_examples"]) for r in rows if r["task"] == t and "test_examples" in r}) for t in tasks
    }
    if any(examples.values()):
        notes.append(
            "Test examples per cell: "
            + ", ".join(f"{t} {'/'.join(map(str, n))}" for t, n in examples.items() if n)
            + " (train.eval_max_batches > 0 evaluates the first batches of a split only)."
        )
    if any(spec.endswith(":demo") or spec.endswith("_demo") for spec in presets):
        notes.append(
            "Demo presets are CPU-sized runs on offline data, not the published settings: the published rows are "
            "not comparable with them."
        )
    return "\n".join(lines + notes)


def bubble_points(config: ml_collections.ConfigDict, rows: list[dict], efficiency_rows: list[dict]) -> list[dict]:
    """Per variant: average accuracy over the tasks (all finished), and speed and memory relative to softmax at
    the longest length where both were measured — the LRA paper's Figure 3."""
    tasks = list(config.tasks)
    measured = {(r["variant"], r["length"]): r for r in efficiency_rows if "error" not in r}
    lengths = sorted({L for (v, L) in measured if v == "softmax"}, reverse=True)
    points = []
    for variant in config.variants:
        accs = [sum(done) / len(done) for task in tasks if (done := _accuracies(rows, variant, task))]
        length = next((L for L in lengths if (variant, L) in measured), None)
        if len(accs) != len(tasks) or not tasks or length is None:
            continue
        r, base = measured[variant, length], measured["softmax", length]
        points.append(
            {
                "variant": variant,
                "average_accuracy": sum(accs) / len(accs),
                "speed_vs_softmax": r["steps_per_s"] / base["steps_per_s"],
                "memory_mib": r["memory_bytes"] / 2**20,
                "length": length,
            }
        )
    return points


def bubble_figure(config: ml_collections.ConfigDict, points: list[dict], path: Path) -> Path:
    """x = steps/s relative to softmax, y = average LRA accuracy, bubble area ∝ memory."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4))
    biggest = max(p["memory_mib"] for p in points)
    for p in points:
        ax.scatter(p["speed_vs_softmax"], p["average_accuracy"], s=2000 * p["memory_mib"] / biggest, alpha=0.5)
        ax.annotate(p["variant"], (p["speed_vs_softmax"], p["average_accuracy"]), fontsize=8, ha="center")
    ax.set_xlabel(f"train steps/s relative to softmax (length {points[0]['length']:,})")
    ax.set_ylabel("average test accuracy over tasks (%)")
    ax.set_title(f"lra-compare {config.get('preset', '')}: accuracy, speed, memory (bubble area)")
    fig.tight_layout()
    return save_figure(fig, path)


def write_report(config: ml_collections.ConfigDict, root: str | os.PathLike) -> dict[str, Path]:
    """results.md, results.csv, results.json and accuracy.png in the sweep workdir (atomically each)."""
    root = Path(root)
    rows = collect(config, root)
    counts = {s: sum(r["state"] == s for r in rows) for s in ("done", "failed", "started", "to do")}
    md = [f"# lra-compare: {config.get('preset', 'sweep')}"]
    if rows:
        md += ["", "## Accuracy", "", accuracy_table(config, rows)]
        md += ["", f"Cells: {len(rows)} — " + ", ".join(f"{k} {v}" for k, v in counts.items() if v)]
    efficiency_rows = collect_efficiency(config, root) if efficiency_entries(config) else []
    if efficiency_rows:
        md += ["", "## Efficiency", "", efficiency_table(config, efficiency_rows)]
    failed = [r for r in rows if r["state"] == "failed"]
    if failed:
        md += ["", "## Failed cells", ""] + [
            f"- {r['task']}/{r['variant']}/seed{r['seed']}: {r['reason']}" for r in failed
        ]
    keys = sorted({k for r in rows for k in r})
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
    paths = {
        "md": _write(root / "results.md", "\n".join(md) + "\n"),
        "csv": _write(root / "results.csv", buffer.getvalue()),
        "json": _write(
            root / "results.json",
            json.dumps({"config": config.to_dict(), "cells": rows, "efficiency": efficiency_rows}, indent=1) + "\n",
        ),
    }
    if any(r["state"] == "done" for r in rows):  # no figure without a finished cell to draw
        paths["accuracy_png"] = accuracy_figure(config, rows, root / "accuracy.png")
    if any("error" not in r for r in efficiency_rows):  # no figure without a measurement to draw
        paths["efficiency_png"] = efficiency_figure(config, efficiency_rows, root / "efficiency.png")
    points = bubble_points(config, rows, efficiency_rows)
    if points:
        paths["bubble_png"] = bubble_figure(config, points, root / "bubble.png")
    for name in ("accuracy", "efficiency", "bubble"):  # one with nothing to draw now is not left from before
        if f"{name}_png" not in paths:
            (root / f"{name}.png").unlink(missing_ok=True)
    return paths


def _write(path: Path, text: str) -> Path:
    atomic_write_bytes(path, text.encode())
    return path


def accuracy_figure(config: ml_collections.ConfigDict, rows: list[dict], path: Path) -> Path:
    """Grouped bars: test accuracy per task, one bar per variant (mean, with the seed std as error bars)."""
    plt = pyplot()

    tasks = [t for t in TASK_ORDER if t in config.tasks] + [t for t in config.tasks if t not in TASK_ORDER]
    variants = list(config.variants)
    width = 0.8 / max(len(variants), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(tasks)), 3.6))
    for i, variant in enumerate(variants):
        stats = [mean_std(a) if (a := _accuracies(rows, variant, task)) else (float("nan"), 0.0) for task in tasks]
        xs = [t + (i - (len(variants) - 1) / 2) * width for t in range(len(tasks))]
        ax.bar(xs, [m for m, _ in stats], width, yerr=[sd for _, sd in stats], label=variant, capsize=2)
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"lra-compare {config.get('preset', '')}: mean ± std over seeds")
    ax.legend(fontsize=7, ncol=min(len(variants), 4))
    fig.tight_layout()
    return save_figure(fig, path)


__all__ = ["Cell", "accuracy_table", "cells", "collect", "run_sweep", "shard", "write_report"]
