"""Config sections every task shares (seed, train, mesh), and the workdir's config.json with resume checks."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import ml_collections

from zoo.config_fields import Field, Rule, above, at_least, in_range, integer, one_of, section
from zoo.files import as_path, atomic_write_bytes, check_utf8_path, is_url, read_json
from zoo.models import stored_model_config
from zoo.training.mesh import LOGICAL_RULES, PARAMETER_AXES
from zoo.training.optim import SCHEDULES, WEIGHT_DECAY_MASKS

# Fields that may change when a run is resumed: they alter when things happen, not what is computed.
RESUMABLE_FIELDS = frozenset(
    {
        "train.steps",  # except with the cosine schedule, which decays to 0 at train.steps (check_resume_config)
        "train.log_every",
        "train.eval_every",
        "train.checkpoint_every",
        "train.keep_checkpoints",
        "train.eval_batch_size",  # evaluation means are over examples, whatever the batch
        "train.device_memory_gib",  # the memory check's limit
        "train.peak_tflops_per_device",  # what MFU is measured against
        "data.cache_dir",  # where caches go; they are keyed by their contents' sources and settings
    }
)
# Schedules whose learning rate at a step depends on train.steps: extending such a run changes its past.
STEP_DEPENDENT_SCHEDULES = frozenset({"cosine"})


class ConfigMismatchError(ValueError):
    """Resuming a workdir with a config that would alter the run."""


# Upper bounds of the size fields: far above any run this code is for, low enough that a typo (an extra zero
# or three) is refused at once instead of building a model or a batch that exhausts memory.
MAX_BATCH = 2**20

TRAIN_FIELDS: tuple[Field, ...] = (
    Field("steps", 1000, integer(0, 10**9), "train steps; 0 evaluates the initialised model only"),
    Field("batch_size", 32, integer(0, MAX_BATCH), "examples per global batch, split over processes and the "
          "data × fsdp mesh axes; 0 for tasks that batch by tokens (translation: data.max_tokens)"),
    Field("eval_batch_size", 0, integer(0, MAX_BATCH), "examples per evaluation batch; 0: batch_size"),
    Field("eval_max_batches", 0, integer(0, 10**9), "evaluate only the first N batches of each split (quick "
          "sweeps); 0: all. A prefix is a fair sample only where the split is in random order (never cap LRA Text's)"),
    Field("learning_rate", 1e-3, above(0), "peak learning rate (rsqrt: the factor; the peak is "
          "learning_rate/√warmup_steps)"),
    Field("schedule", "cosine", one_of(*SCHEDULES), "rsqrt: the LRA code's constant · linear_warmup · "
          "rsqrt_decay, lr = learning_rate · min(1, s/warmup) / √max(s, warmup); cosine: linear warmup, cosine "
          "decay to 0 at train.steps; constant: linear warmup, then constant"),
    Field("warmup_steps", 100, integer(0, 10**9), "steps of linear warm-up"),
    Field("weight_decay", 0.1, at_least(0), "AdamW's decoupled weight decay"),
    Field("weight_decay_mask", "all", one_of(*WEIGHT_DECAY_MASKS), "which parameters decay: all, or none of "
          "the norms and biases (BERT); never γ or the SGU bias (zoo/training/optim.py)"),
    Field("b1", 0.9, in_range(0, 1), "Adam's β₁"),
    Field("b2", 0.98, in_range(0, 1), "Adam's β₂"),
    Field("eps", 1e-9, above(0), "Adam's ε"),
    Field("grad_clip_norm", 1.0, at_least(0), "clip the global gradient norm to this; 0 disables clipping"),
    Field("grad_accum_steps", 1, integer(1, 4096), "micro-batches per step (batch_size must be divisible by it)"),
    Field("label_smoothing", 0.0, in_range(0, 1), "label smoothing of the cross-entropy"),
    Field("log_every", 50, integer(1, 10**9), "steps between log lines (metrics.jsonl, TensorBoard, progress)"),
    Field("eval_every", 500, integer(0, 10**9), "steps between evaluations of the first eval split; 0 disables them"),
    Field("checkpoint_every", 500, integer(1, 10**9), "steps between checkpoints (and one at the last step)"),
    Field("keep_checkpoints", 3, integer(1, 10**6), "checkpoints kept in the workdir"),
    Field("peak_tflops_per_device", 0.0, at_least(0), "a device's peak TFLOP/s, the denominator of MFU; 0: the "
          "accelerator's dense bf16 figure (zoo/training/flops.py), or on a CPU the float32 matmul rate measured at "
          "start-up (and again where MFU came out above 1)"),
    Field("device_memory_gib", 0.0, at_least(0), "memory one device may use: a run whose compiled train step "
          "needs more is refused before anything is written; 0: the device's own (GPU/TPU: the allocator's limit; "
          "CPU: the host's available memory ÷ local devices)"),
)  # fmt: skip


def train_config(**overrides) -> ml_collections.ConfigDict:
    """Optimiser, schedule and loop fields (`TRAIN_FIELDS`' defaults, with `overrides`)."""
    return section(TRAIN_FIELDS, **overrides)


def small_run_config(steps: int, *, eval_every: int = 0, **fields) -> ml_collections.ConfigDict:
    """The demo / tiny presets' training: `train_config` with a checkpoint at every evaluation (else at the end)."""
    return train_config(steps=steps, eval_every=eval_every, checkpoint_every=eval_every or steps, **fields)


def _mesh_axis(size) -> bool:
    return isinstance(size, int) and not isinstance(size, bool) and (size == -1 or size >= 1)


_AXIS = Rule(_mesh_axis, "must be -1 (every remaining device) or an integer ≥ 1", "-1 or int ≥ 1")
MESH_FIELDS: tuple[Field, ...] = (
    Field("data", -1, _AXIS, "devices on the data axis (batch split); -1: every remaining device"),
    Field("fsdp", 1, _AXIS, "devices on the fsdp axis (batch and parameters split)"),
    Field("tensor", 1, _AXIS, "devices on the tensor axis (parameters split along heads and hidden units)"),
    # Each entry is checked (and named) by zoo/training/validate.py.
    Field("rules", dict(LOGICAL_RULES), None, "parameters' logical axes → mesh axes: one of "
          f"{', '.join(PARAMETER_AXES)}, or '' (replicated)"),
    Field("sharding_tolerance", 0.05, Rule(lambda x: isinstance(x, int | float) and 0 <= x <= 1, "must be a "
          "number in [0, 1]", "[0, 1]"), "how much more parameter memory than an even fsdp × tensor split a "
          "device may hold before the run is refused (MaxText's sharding_tolerance); 5%: under fsdp alone the "
          "biases of tensor-split layers stay whole (1.9% on lra_code at fsdp=8)"),
)  # fmt: skip


def mesh_config(**overrides) -> ml_collections.ConfigDict:
    """Device-mesh axis sizes, logical-axis rules and sharding tolerance (`MESH_FIELDS`' defaults, with `overrides`)."""
    return section(MESH_FIELDS, **overrides)


def task_config(task: str, **sections: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A preset's first fields: `task` (the task it runs), seed 0 and the mesh, then the task's own `sections`
    (`data=section(DATA_FIELDS)`, ...); the preset adds model and train."""
    return ml_collections.ConfigDict({"task": task, "seed": 0, "mesh": mesh_config(), **sections})


def flatten_config(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(flatten_config(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def config_to_json(config: ml_collections.ConfigDict) -> str:
    return json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str)


def _with_model_defaults(config: dict) -> dict:
    """The flattened config with model fields added since it was written at their defaults: new fields default
    to the computation older runs did, so a run started before them resumes (a non-default value still differs)."""
    if isinstance(config.get("model"), dict):
        config = {**config, "model": stored_model_config(config["model"]).to_dict()}
    return flatten_config(config)


def config_changes(config: ml_collections.ConfigDict, path: str | os.PathLike) -> dict[str, tuple[Any, Any]]:
    """{field: (recorded, now)} for every field where `config` differs from the config.json at `path`."""
    recorded = read_json(as_path(path), "a damaged workdir: restore the file or use another workdir")
    if not isinstance(recorded, dict):
        raise ValueError(f"{path}: not a config (a JSON object); restore the file or use another workdir")
    return recorded_changes(recorded, config)


def recorded_changes(recorded: dict, config: ml_collections.ConfigDict) -> dict[str, tuple[Any, Any]]:
    """{field: (recorded, now)} for every field where `config` differs from `recorded` (as JSON holds a config)."""
    old, new = _with_model_defaults(recorded), _with_model_defaults(json.loads(config_to_json(config)))
    absent = "<absent>"
    return {
        k: (old.get(k, absent), new.get(k, absent))
        for k in sorted(set(old) | set(new))
        if old.get(k, absent) != new.get(k, absent)
    }


def check_resume_config(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> None:
    """Refuses a config that would alter the run recorded in workdir/config.json, naming every changed field."""
    path = as_path(workdir) / "config.json"
    if not path.exists() and has_run_output(workdir):
        raise ConfigMismatchError(
            f"{path} is missing but the run there saved checkpoints or results: a resume cannot be checked against "
            "the config it trained with, and would record this one as if the whole run had used it. Restore the "
            "file or use a new --workdir. Nothing in the workdir was changed."
        )
    if path.exists() and not has_run_output(workdir):
        print(f"{path}: written by a run that saved no checkpoint and no results; it is replaced", flush=True)
    elif path.exists():
        changes = config_changes(config, path)
        if changes.get("task", ("<absent>",))[0] != "<absent>":  # another command's run: not a field-by-field diff
            raise ConfigMismatchError(
                f"{another_kind(workdir, changes['task'][0])}; use a new --workdir. Nothing in the workdir was changed."
            )
        changed = [k for k in changes if k not in RESUMABLE_FIELDS]
        steps = "train.steps" in changes
        schedule = config.train.get("schedule") if "train" in config else None
        if steps and schedule in STEP_DEPENDENT_SCHEDULES and not changed:
            old_steps, new_steps = changes["train.steps"]
            raise ConfigMismatchError(
                f"{path}: train.steps {old_steps} -> {new_steps} cannot change on resume "
                f"with the {schedule!r} schedule, which decays to 0 at train.steps: the steps already "
                "run would differ from a fresh run of the new length. Use a new --workdir. Nothing in the workdir "
                "was changed."
            )
        if changed:  # every field at once (train.steps too where it matters), not one per attempt
            schedule_note = ""
            if steps and schedule in STEP_DEPENDENT_SCHEDULES:
                changed.append("train.steps")
                schedule_note = f", train.steps not with the {schedule!r} schedule"
            lines = "\n".join(f"  {k}: {changes[k][0]!r} -> {changes[k][1]!r}" for k in changed)
            raise ConfigMismatchError(
                f"{path} was written by a run with a different config; resuming would alter it:\n{lines}\n"
                f"Use a new --workdir, or restore these fields (only {', '.join(sorted(RESUMABLE_FIELDS))} "
                f"may change on resume{schedule_note}). Nothing in the workdir was changed."
            )


def has_run_output(workdir: str | os.PathLike) -> bool:
    """Whether a run in `workdir` got as far as a checkpoint (good or moved aside as broken) or results.json:
    only then does its config.json describe something that a different config would alter."""
    workdir = as_path(workdir)
    return (workdir / "results.json").exists() or any(
        (workdir / name).is_dir() and any(p.name.split(".")[0].isdigit() for p in (workdir / name).iterdir())
        for name in ("checkpoints", "checkpoints_broken")
    )


def check_output_dir(path: str | os.PathLike, flag: str = "--workdir") -> None:
    """Raises a one-line ValueError when `path` cannot be a directory this process writes into (a URL: when it is a
    file; its permissions show at the first write)."""
    check_utf8_path(path, flag)
    path = as_path(path)  # file:// → local; an unsupported scheme or a missing package is an error here
    if is_url(path):
        if path.is_file():
            raise ValueError(f"{flag}={path} exists and is not a directory")
        return
    path = os.path.abspath(path)
    if os.path.islink(path) and not os.path.exists(path):  # mkdir would fail with "File exists"
        raise ValueError(f"{flag}={path} is a symbolic link to {os.readlink(path)}, which does not exist")
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise ValueError(f"{flag}={path} exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"{flag}={path} is not writable")
        return
    parent = os.path.dirname(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"{flag}={path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag}={path} cannot be created: {parent} is not writable")


def check_output_file(
    path: str | os.PathLike, flag: str, suffixes: tuple[str, ...] = (), replace: str | None = None
) -> None:
    """Raises a one-line ValueError when `path` cannot be a file this process writes (checked before the work that
    produces it). `replace`: the flag that allows replacing an existing file, which is refused when given."""
    if os.path.isdir(path):
        raise ValueError(f"{flag}={path} is a directory; give a file path")
    if replace and os.path.exists(path):
        raise ValueError(f"{flag}={path} exists; pass {replace} to replace it")
    if suffixes and Path(path).suffix.lower() not in suffixes:
        raise ValueError(f"{flag}={path}: the file name must end in one of {', '.join(suffixes)}")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise ValueError(f"{flag}={path} exists and this process cannot overwrite it")
    check_output_dir(os.path.dirname(os.path.abspath(path)), f"{flag}'s directory")


# What a run writes in its workdir, by kind: a path of the other kind there would fail only when first written
# (a file named `checkpoints` stalls Orbax for minutes).
WORKDIR_DIRECTORIES = ("checkpoints", "checkpoints_broken", "tensorboard", "profile")
WORKDIR_FILES = ("config.json", "metrics.jsonl", "results.json", "lock")


def check_workdir_layout(workdir: str | os.PathLike) -> None:
    """A one-line error when a name the run writes in `workdir` exists as the wrong kind (file vs directory)."""
    workdir = as_path(workdir)
    if not workdir.exists():
        return
    if (workdir / "cells").is_dir():  # lra-compare's folder: its results.json is the sweep's report
        raise ValueError(f"{workdir} holds cells/: it is a sweep's folder (lra-compare), not a run's. Use another one.")
    for name in WORKDIR_DIRECTORIES:
        if (workdir / name).exists() and not (workdir / name).is_dir():
            raise ValueError(f"{workdir / name} is a file; a run keeps a directory there. Move it away.")
    for name in WORKDIR_FILES:
        if (workdir / name).is_dir():
            raise ValueError(f"{workdir / name} is a directory; a run writes a file there. Move it away.")


def write_config(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> None:
    """Writes workdir/config.json atomically (call `check_resume_config` first)."""
    path = as_path(workdir) / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, config_to_json(config).encode())


def another_kind(path: str | os.PathLike, task: Any) -> str:
    """How a run of another command (its config.json's `task`) is named when this one cannot use it."""
    return f"{path} is a {task!r} run"


def read_run_config(
    workdir: str | os.PathLike, *, reader: str, tasks: tuple[str, ...] = ()
) -> ml_collections.ConfigDict:
    """A workdir's config.json, model fields added since at their old values (`zoo.models.stored_model_config`).
    A missing or damaged file, or a task outside `tasks` (when given), is refused; `reader` ends each message
    ("mt-translate reads mt-train runs")."""
    path = as_path(workdir) / "config.json"
    if path.parent.is_file():
        raise ValueError(f"{path.parent} is a file, not a run's folder; {reader}")
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; {reader}")
    config = ml_collections.ConfigDict(read_json(path, "a damaged workdir: restore the file"))
    if tasks and config.get("task") not in tasks:
        raise ValueError(f"{another_kind(path, config.get('task'))}; {reader}")
    if "model" in config:
        config.model = stored_model_config(config.model.to_dict())
    return config
