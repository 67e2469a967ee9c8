"""Config sections every task shares (seed, train, mesh), and the workdir's config.json with resume checks."""

from __future__ import annotations

import json
import os

import ml_collections

from zoo.files import as_path, atomic_write_bytes, is_url
from zoo.training.mesh import LOGICAL_RULES

# Fields that may change when a run is resumed: they alter when things happen, not what is computed.
RESUMABLE_FIELDS = frozenset(
    {
        "train.steps",  # except with the cosine schedule, which decays to 0 at train.steps (check_resume_config)
        "train.log_every",
        "train.eval_every",
        "train.checkpoint_every",
        "train.keep_checkpoints",
        "train.eval_batch_size",  # evaluation means are over examples, whatever the batch
    }
)
# Schedules whose learning rate at a step depends on train.steps: extending such a run changes its past.
STEP_DEPENDENT_SCHEDULES = frozenset({"cosine"})


class ConfigMismatchError(ValueError):
    """Resuming a workdir with a config that would alter the run."""


def train_config(**overrides) -> ml_collections.ConfigDict:
    """Optimiser, schedule and loop fields.

    schedule:
      "rsqrt"     LRA's `constant * linear_warmup * rsqrt_decay`: lr = learning_rate · min(1, s/warmup) /
                  √max(s, warmup); the peak is learning_rate/√warmup (0.05 and 1000 give 1.6e-3).
      "cosine"    linear warmup to learning_rate, cosine decay to 0 at train.steps.
      "constant"  linear warmup to learning_rate, then constant.
    """
    cfg = ml_collections.ConfigDict(
        {
            "steps": 1000,  # 0: no training, evaluate the initialised model
            # Examples per global batch, split over processes and the data × fsdp mesh axes. 0 for tasks that
            # batch by tokens (translation: data.max_tokens, rows a multiple of data.row_multiple).
            "batch_size": 32,
            "eval_batch_size": 0,  # 0: same as batch_size
            # Evaluate only the first N batches of each split (quick sweeps); 0: all. A prefix is a fair sample
            # only where the split is in random order (LRA Text's splits are grouped by label: never cap them).
            "eval_max_batches": 0,
            "learning_rate": 1e-3,
            "schedule": "cosine",
            "warmup_steps": 100,
            "weight_decay": 0.1,
            "weight_decay_mask": "all",  # all | no_norm_or_bias (BERT); never γ or the SGU bias (zoo.training.optim)
            "b1": 0.9,
            "b2": 0.98,
            "eps": 1e-9,
            "grad_clip_norm": 1.0,  # 0 disables clipping
            "grad_accum_steps": 1,  # micro-batches per step; batch_size must be divisible by it
            "label_smoothing": 0.0,
            "log_every": 50,
            "eval_every": 500,  # 0 disables periodic evaluation
            "checkpoint_every": 500,
            "keep_checkpoints": 3,
        }
    )
    cfg.update(overrides)
    return cfg


def small_run_config(steps: int, *, eval_every: int = 0, **fields) -> ml_collections.ConfigDict:
    """The demo / tiny presets' training: `train_config` (cosine schedule, a log line every 50 steps) with a
    checkpoint at every evaluation, or only at the end when there is none during training."""
    return train_config(steps=steps, eval_every=eval_every, checkpoint_every=eval_every or steps, **fields)


def mesh_config(**overrides) -> ml_collections.ConfigDict:
    """Device-mesh axis sizes (-1 takes all remaining devices; default: every device on `data`), the rules that
    map parameters' logical axes to mesh axes ("" = replicated), and how much more parameter memory than an
    even fsdp × tensor split a device may hold before the run is refused (MaxText's sharding_tolerance)."""
    cfg = ml_collections.ConfigDict(
        {
            "data": -1,
            "fsdp": 1,
            "tensor": 1,
            "rules": dict(LOGICAL_RULES),
            # 5%: under fsdp alone, the biases of tensor-split layers stay whole (2.4% on lra_code at fsdp=8).
            "sharding_tolerance": 0.05,
        }
    )
    cfg.update(overrides)
    return cfg


def flatten_config(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten_config(v, key + "."))
        else:
            out[key] = v
    return out


def config_to_json(config: ml_collections.ConfigDict) -> str:
    return json.dumps(config.to_dict(), indent=2, sort_keys=True, default=str)


def _with_model_defaults(config: dict) -> dict:
    """The flattened config with model fields added since it was written at their defaults: new fields default
    to the computation older runs did, so a run started before them resumes (a non-default value still differs)."""
    if isinstance(config.get("model"), dict):
        from zoo.models import stored_model_config  # zoo.models imports zoo.training

        config = {**config, "model": stored_model_config(config["model"]).to_dict()}
    return flatten_config(config)


def check_resume_config(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> None:
    """Refuses a config that would alter the run recorded in workdir/config.json, naming every changed field."""
    path = as_path(workdir) / "config.json"
    text = config_to_json(config)
    if path.exists():
        old, new = (_with_model_defaults(json.loads(t)) for t in (path.read_text(), text))
        missing = object()
        changed = [
            k
            for k in sorted(set(old) | set(new))
            if k not in RESUMABLE_FIELDS and old.get(k, missing) != new.get(k, missing)
        ]
        if old.get("train.steps") != new.get("train.steps") and new.get("train.schedule") in STEP_DEPENDENT_SCHEDULES:
            raise ConfigMismatchError(
                f"{path}: train.steps {old.get('train.steps')} -> {new.get('train.steps')} cannot change on resume "
                f"with the {new.get('train.schedule')!r} schedule, which decays to 0 at train.steps: the steps already "
                "run would differ from a fresh run of the new length. Use a new --workdir. Nothing in the workdir "
                "was changed."
            )
        if changed:
            lines = "\n".join(f"  {k}: {old.get(k, '<absent>')!r} -> {new.get(k, '<absent>')!r}" for k in changed)
            raise ConfigMismatchError(
                f"{path} was written by a run with a different config; resuming would alter it:\n{lines}\n"
                f"Use a new --workdir, or restore these fields (only {', '.join(sorted(RESUMABLE_FIELDS))} "
                "may change on resume). Nothing in the workdir was changed."
            )


def check_output_dir(path: str | os.PathLike, flag: str = "--workdir") -> None:
    """Raises a one-line ValueError when `path` cannot be a directory this process writes into.

    A URL (gs://...) is checked only for being a file: its permissions show at the first write."""
    if is_url(path):
        if as_path(path).is_file():
            raise ValueError(f"{flag}={path} exists and is not a directory")
        return
    path = os.path.abspath(path)
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


def write_config(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> None:
    """Writes workdir/config.json atomically (call `check_resume_config` first)."""
    path = as_path(workdir) / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, config_to_json(config).encode())
