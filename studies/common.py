"""What every study shares: its command line (`--tiny` / `--gpu`, `--out`, `--record`), the files it writes
(result.json, README.md, a figure; runs.jsonl for the studies of hours), and the plan of its `gpu` preset."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import ml_collections
import numpy as np

from lra_flax.configs.listops import get_config as listops_demo
from zoo.files import atomic_write_bytes, read_json
from zoo.training import flops
from zoo.training.config import check_output_dir, flatten_config
from zoo.training.distributed import Preempted
from zoo.training.signals import Interrupted

ROOT = Path(__file__).resolve().parent.parent / "benchmarks" / "studies"  # the committed results (`--record`)
RUNS = Path("runs") / "studies"  # where a study writes by default, relative to the working directory


NOT_MEASURABLE = "not measurable at this budget"

# A study's sizes: `tiny` (about a minute: the mechanics, for the tests), `cpu` (the default: what 2 CPU cores finish in
# minutes to hours) and `gpu` (the settings that need scale, for one H100 in at most GPU_BUDGET_S).
PRESETS = ("tiny", "cpu", "gpu")

# How a `gpu` preset is planned before a GPU has run it. The one GPU session so far (2026-11-23, an H100,
# benchmarks/listops-gpu-h100-partial) trained the lra_code ListOps model (bf16, batch 32 × 2,000 tokens, 6.4
# TFLOP of model FLOPs a step) at 4.3 steps/s beside a second training: ~28 model TFLOP/s. A run is planned at
# GPU_TFLOPS, at least GPU_STEP_FLOOR_S a step (a small model's step is bound by its kernel launches, not its
# FLOPs), plus GPU_RUN_OVERHEAD_S (compilation, evaluation, checkpoints). The studies train in float32 where that
# measurement was bf16, and data preparation on the device is not counted: these are guesses, which the first GPU
# session to run a preset replaces with its measured time.
GPU_TFLOPS = 25.0
GPU_STEP_FLOOR_S = 0.004
GPU_RUN_OVERHEAD_S = 10.0
GPU_BUDGET_S = 8 * 60
# The studies that train nothing (an operator at initialisation, fitted feature maps, attention read out of trained
# models) are planned by their programs and dispatches: GPU_COMPILE_S a compilation of one small program (a guess,
# as above), GPU_STEP_FLOOR_S a dispatch.
GPU_COMPILE_S = 2.0


def plateau_line(unigram: float) -> float:
    """The held-out perplexity under which a language model (masked or causal) learned more than word frequencies:
    half the unigram's."""
    return 0.5 * unigram


def left_the_plateau(perplexity: float, unigram: float) -> bool:
    """Whether a language model's held-out perplexity is under `plateau_line`. A comparison between models none of
    which did cannot support a verdict either way."""
    return perplexity < plateau_line(unigram)


def runs_root(preset: str, out_dir: Path, cpu_root: Path) -> Path:
    """Where a study's training runs go: inside its output folder for `tiny`; `cpu_root` (shared between studies
    and kept, so re-running resumes) for `cpu`, and beside it with a -gpu suffix for `gpu`."""
    preset = as_preset(preset)
    if preset == "tiny":
        return out_dir / "runs"
    return cpu_root if preset == "cpu" else cpu_root.with_name(f"{cpu_root.name}-gpu")


def step_flops(config: ml_collections.ConfigDict) -> float:
    """Model FLOPs of one train step of a study's run (zoo/training/flops.py): an LRA classifier on
    `model.max_length` tokens, or a language model of `mlm_flax` on `data.seq_length` (masked: the head at
    `data.max_predictions` positions; causal, task "clm": at every position)."""
    rows = config.train.batch_size
    if "seq_length" in config.data:  # an mlm_flax run
        batch = {"inputs": np.empty((rows, config.data.seq_length), np.int32)}
        causal = config.task == "clm"
        return flops.language_model_step_flops(
            config.model, batch, config.data.vocab_size, causal=causal, predicted=config.data.max_predictions
        )
    return flops.encoder_step_flops(config.model, {"inputs": np.empty((rows, config.model.max_length))}, ("inputs",))


def gpu_seconds(configs: Iterable[ml_collections.ConfigDict]) -> float:
    """The planned time of a `gpu` preset's training runs on one H100 (see GPU_TFLOPS)."""
    return sum(
        GPU_RUN_OVERHEAD_S + config.train.steps * max(GPU_STEP_FLOOR_S, step_flops(config) / (GPU_TFLOPS * 1e12))
        for config in configs
    )


def gpu_work_seconds(*, programs: int, dispatches: int) -> float:
    """The planned time on one H100 of a study's own computation, outside training runs: `programs` compilations
    and `dispatches` calls of them (see GPU_COMPILE_S)."""
    return programs * GPU_COMPILE_S + dispatches * GPU_STEP_FLOOR_S


def listops_config(seed: int, data_dir: Path, mixer: str, relu_factor: bool | None = None) -> ml_collections.ConfigDict:
    """The `lra-train` ListOps demo config with `mixer` (`relu_factor`: ReLU's 1/√(n/2) factor on or off)."""
    config = listops_demo("demo")
    config.seed = seed
    config.data.dir = str(data_dir)
    config.model.mixer = mixer
    if relu_factor is not None:
        config.model.mixer_options.relu.variance_reduction = relu_factor
    return config


def arm_folder(mixer: str, relu_factor: bool | None) -> str:
    """A ListOps arm's folder name: the mixer, with -factor / -nofactor where ReLU's factor is set."""
    return mixer if relu_factor is None else f"{mixer}-{'factor' if relu_factor else 'nofactor'}"


def logged_metrics(workdir: Path, split: str) -> list[dict]:
    """The metrics a run (lra-train, mlm-train) logged on `split`, in step order (its metrics.jsonl)."""
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [m for m in map(json.loads, lines) if m["split"] == split]


def logged_curve(workdir: Path, split: str, metric: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `metric` as a run logged it on `split` (`logged_metrics`)."""
    logged = logged_metrics(workdir, split)
    return [m["step"] for m in logged], [m[metric] for m in logged]


LEDGER = "runs.jsonl"


class StudyError(ValueError):
    """A study cannot go on for a reason its user can act on: the command says so in one line and exits 2."""


class LedgerError(StudyError):
    """A ledger line that cannot be read (the message names its file and line)."""


class Ledger:
    """What each finished training run of a study gave, one JSON line per run in OUT/runs.jsonl beside result.json
    (committed with `--record`, so a study resumed on another machine trains only the runs no commit recorded).

    A line holds the run's key (its workdir relative to `runs`, the study's runs_root), its resolved config
    (flattened, `runs` written as "<runs>": the same run elsewhere is the same run) and the summary the study reads.
    A line is reused while every field it recorded has the same value now (fields added to the configs since are
    left out: a new field's default is what older code computed). The file is rewritten whole after every run."""

    def __init__(self, path: Path, runs: Path):
        self.path, self.runs = path, str(runs)
        self.lines = self._read()

    def _read(self) -> dict[str, dict]:
        lines: dict[str, dict] = {}
        if not self.path.exists():
            return lines
        for number, raw in enumerate(self.path.read_bytes().splitlines(), 1):
            if not raw.strip():
                continue
            try:
                entry = json.loads(raw.decode("utf-8"))
                lines[entry["key"]] = {"config": dict(entry["config"]), "summary": dict(entry["summary"])}
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                hint = f"fix or delete line {number} (a merge conflict?); the other lines stay valid"
                raise LedgerError(f"{self.path}:{number}: not a ledger line ({e}); {hint}") from None
        return lines

    def settings(self, config: ml_collections.ConfigDict) -> dict:
        """The config as the ledger records it: flattened, the runs folder's path written as "<runs>"."""
        return flatten_config(json.loads(config.to_json(sort_keys=True).replace(self.runs, "<runs>")))

    def changed(self, key: str, now: dict) -> list[str] | None:
        """The recorded fields of run `key` whose value differs in `now` (its `settings`) or that are gone
        ([]: none), or None where the run is not recorded."""
        entry = self.lines.get(key)
        if entry is None:
            return None
        return sorted(
            field if field in now else f"{field} (gone)"
            for field, value in entry["config"].items()
            if field not in now or now[field] != value
        )

    def run(self, workdir: Path, config: ml_collections.ConfigDict, train: Callable[[], dict]) -> dict:
        """The recorded summary of the run in `workdir` (under the runs folder), or `train()`'s, recorded."""
        key = Path(workdir).relative_to(self.runs).as_posix()
        settings = self.settings(config)  # before training, which may fill in the config
        changed = self.changed(key, settings)
        if changed == []:
            return self.lines[key]["summary"]
        if changed:
            print(f"{self.path}: {key} trained again: {', '.join(changed[:5])} changed since it was recorded")
        summary = train()
        self.lines = self._read()  # another process may have recorded runs meanwhile
        self.lines[key] = {"config": settings, "summary": summary}
        self._write()
        return summary

    def amend(self, workdir: Path, fields: dict) -> dict:
        """Adds `fields` to the recorded summary of the run in `workdir` (what a study reads of a run now and did not
        when it recorded it, computed from what the run left: its checkpoints); returns the summary."""
        key = Path(workdir).relative_to(self.runs).as_posix()
        self.lines = self._read()
        if key not in self.lines:
            raise LedgerError(f"{self.path}: no run {key} recorded to amend")
        self.lines[key]["summary"] = {**self.lines[key]["summary"], **fields}
        self._write()
        return self.lines[key]["summary"]

    def _write(self) -> None:
        text = "".join(json.dumps({"key": k, **v}, sort_keys=True) + "\n" for k, v in sorted(self.lines.items()))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.path, text.encode())


def write_study(name: str, out_dir: Path, result: dict, readme: str) -> dict:
    """result.json (`result`, with `study`: NAME, which folder it is) and README.md into `out_dir` (the figure is
    the study's to draw there); returns what result.json holds."""
    result = {**result, "study": name}
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out_dir / "result.json", (json.dumps(result, indent=2, sort_keys=True) + "\n").encode())
    atomic_write_bytes(out_dir / "README.md", readme.encode())
    return result


def _readme_study(path: Path) -> str | None:
    """The study whose command a README.md's setting line gives (`study_readme`), or None: no study's README."""
    match = re.search(r"^\*\*Setting\*\*: `python -m studies\.(\w+)", path.read_text(errors="replace"), re.M)
    return match and match[1]


def check_study_folder(name: str, out_dir: Path) -> dict | None:
    """Raises a one-line ValueError where `out_dir` holds what studies.NAME does not write (another study's
    result.json or README.md, a README.md of no study, any other file): writing there would mix two studies' files
    or replace a user's. A result.json recorded before its `study` field is the study's whose command its README.md
    gives (with no README.md, the study's own). A *.log beside them is its command's (the GPU script keeps it there).
    Returns the folder's result.json, if any."""
    if not out_dir.is_dir():
        return None
    result, path, readme = None, out_dir / "result.json", out_dir / "README.md"
    readme_study = _readme_study(readme) if readme.is_file() else None
    if path.is_file():
        result = read_json(path, "record the study again")
        if not isinstance(result, dict):
            raise ValueError(f"{path} is not a {name} study's result (not a study result)")
        owner = result.get("study") or readme_study
        if owner not in (None, name):
            raise ValueError(f"{path} is not a {name} study's result (it is {owner}'s)")
    if readme.is_file() and readme_study != name:
        raise ValueError(f"{readme} is not a {name} study's README (it is {readme_study or 'no study'}'s)")
    own = ("result.json", "README.md", LEDGER, "runs", f"{name}.png")  # and NAME_*.png (toeplitz_weights.png)
    ours = lambda p: p.name in own or p.name.startswith((".", f"{name}_")) or p.suffix == ".log"  # a run's log too
    other = sorted(p.name for p in out_dir.iterdir() if not ours(p))
    if other:
        raise ValueError(f"{out_dir / other[0]} is not a file studies.{name} writes (it writes {', '.join(own)})")
    return result


def study_readme(
    name: str, preset: str, *, title: str, claim: str, setting: str, table: str, verdict: str, notes=""
) -> str:
    """A study's README.md: the claim, the command (for `preset`, one of PRESETS) and setting, the measured table,
    the verdict, the figure (NAME.png, the study's to draw)."""
    preset = as_preset(preset)
    command = f"python -m studies.{name}" + ("" if preset == "cpu" else f" --{preset}")
    parts = [f"# {title}", f"**Claim** {claim}", f"**Setting**: `{command}` — {setting}", table]
    parts.append(f"**Verdict**: {verdict}")
    if notes:
        parts.append(f"**What may explain it**: {notes}")
    parts.append(f"![{name}]({name}.png)")
    return "\n\n".join(parts) + "\n"


def as_preset(preset: bool | str) -> str:
    """One of PRESETS; True / False (a `tiny` flag, in results recorded before the `gpu` preset) are tiny / cpu."""
    if isinstance(preset, bool):
        return "tiny" if preset else "cpu"
    if preset not in PRESETS:
        raise ValueError(f"preset {preset!r} is not one of {', '.join(PRESETS)}")
    return preset


def result_preset(result: dict) -> str:
    """The preset a result.json was measured at (`tiny` alone in results recorded before the `gpu` preset)."""
    return as_preset(result["preset"] if "preset" in result else result["tiny"])


def output_dir(name: str, *, preset: str, out: Path | None, record: bool) -> Path:
    """Where a study writes: `out`; by default runs/studies/NAME (NAME-tiny, NAME-gpu for those presets); with
    `record`, the committed results, benchmarks/studies/NAME (NAME-gpu) — never a tiny run's, and never both
    `record` and `out`."""
    preset = as_preset(preset)
    if record and out is not None:
        raise ValueError("--record writes the committed results (benchmarks/studies/NAME): give it or --out, not both")
    if record and preset == "tiny":
        raise ValueError("--record is for full runs: a --tiny run checks the mechanics and is never committed")
    folder = name if preset == "cpu" else f"{name}-{preset}"
    if record:
        return ROOT / folder
    return out or RUNS / folder


def study_main(
    name: str,
    doc: str,
    run: Callable[[str, Path], dict],
    report: Callable[[dict, Path], dict] | None = None,
    *,
    runs: Path | None = None,
) -> None:
    """`python -m studies.NAME [--tiny | --gpu] [--out DIR | --record] [--report]`: runs `run(preset, out_dir)`
    (where: `output_dir`) and prints its verdict; `--report` measures nothing and makes the verdict, figure and
    README.md again from the folder's result.json. `runs`: the study's shared folder of training runs (`runs_root`),
    checked as --out is before any work."""
    parser = argparse.ArgumentParser(prog=f"python -m studies.{name}", description=doc.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--tiny", action="store_true", help="about a minute: the mechanics, not the verdict")
    size.add_argument("--gpu", action="store_true", help="the settings that need scale, for one H100 (≤ 8 minutes)")
    parser.add_argument("--out", type=Path, default=None, help=f"output folder (default {RUNS / name})")
    parser.add_argument("--record", action="store_true", help=f"write the committed results, {ROOT / name}")
    if report is not None:
        parser.add_argument("--report", action="store_true", help="judge the folder's result.json again, no runs")
    args = parser.parse_args()
    try:  # before any computation: a study can take hours
        preset = "tiny" if args.tiny else "gpu" if args.gpu else "cpu"
        out_dir = output_dir(name, preset=preset, out=args.out, record=args.record)
        check_output_dir(out_dir, "--out")
        reporting = getattr(args, "report", False)  # only studies with a `report` take the flag
        if runs is not None and preset != "tiny" and not reporting:
            check_output_dir(runs_root(preset, out_dir, runs), "its runs folder")
        if reporting and not (out_dir / "result.json").is_file():  # a mistyped --out leaves no empty folder
            raise ValueError(f"--report: {out_dir / 'result.json'} does not exist (run the study first)")
        try:  # another study's folder, or a user's: neither is mixed with this study's files nor replaced
            found = check_study_folder(name, out_dir)
        except ValueError as e:
            raise ValueError(f"--report: {e}" if reporting else f"--out: {e}; give it a new or empty folder") from None
        measured = found if reporting else None
        out_dir.mkdir(parents=True, exist_ok=True)  # permissions alone do not tell (/proc, a read-only mount)
    except (ValueError, OSError) as e:
        _usage_error(parser.prog, e)
    if measured is None:
        try:
            result = run(preset, out_dir)
        except StudyError as e:
            _usage_error(parser.prog, e)
        except (KeyboardInterrupt, Interrupted, Preempted):  # Ctrl-C or SIGTERM: every finished run is kept
            print(
                f"{parser.prog}: stopped; the runs that finished are kept (their workdirs, and {LEDGER} where the "
                "study keeps one) and the one under way resumes from its last checkpoint: run the same command to "
                "go on",
                file=sys.stderr,
            )
            sys.exit(130)
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
