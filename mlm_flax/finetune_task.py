"""Fine-tuning task: a `TextClassifier` whose encoder starts as a pretraining run's `MaskedLM.backbone`.

The pretraining workdir gives the tokenizer (spm.model), the checkpoint and its config; the checkpoint is
loaded (and checked against this config's model section) in `prepare`, before anything is written to the
fine-tuning workdir, and copied into the fresh train state by `Task.warm_start`.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import ml_collections
import numpy as np
from flax import nnx

from mlm_flax import glue
from mlm_flax import input_pipeline as mlm_pipeline
from mlm_flax.configs.finetune import CONFIG_SECTIONS
from mlm_flax.task import TOKENIZER_FILE
from zoo.files import as_path
from zoo.models import MaskedLM, ModelBuilder, TextClassifier
from zoo.text import SentencePieceTokenizer
from zoo.training import Task, flops
from zoo.training import data as data_lib
from zoo.training.checkpoints import CheckpointDamaged
from zoo.training.config import flatten_config, read_run_config
from zoo.training.losses import classification_loss
from zoo.training.state import restore_model

# Model fields that do not change parameter shapes (fine-tuning may set them differently).
_SHAPE_FREE_FIELDS = ("dropout", "pooling", "dtype", "remat")


def pretrained_run(config: ml_collections.ConfigDict) -> tuple[Path, dict]:
    """The pretraining workdir and its config.json, with clear errors for a missing or incomplete one."""
    if not config.pretrained.workdir:
        raise ValueError("config field pretrained.workdir is empty: name the mlm-train workdir to fine-tune from")
    workdir = as_path(config.pretrained.workdir)
    missing = [name for name in ("config.json", TOKENIZER_FILE, "checkpoints") if not (workdir / name).exists()]
    if missing and missing[0] == "config.json":
        raise FileNotFoundError(
            f"pretrained.workdir={workdir} has no config.json; it must be an mlm-train workdir with a checkpoint"
        )
    reader = "fine-tuning starts from an mlm-train run (pretrained.workdir)"
    run_config = read_run_config(workdir, reader=reader, tasks=("mlm", "clm"))  # another command's run: named so
    if missing:
        raise FileNotFoundError(
            f"pretrained.workdir={workdir} has no {missing[0]}; it must be an mlm-train workdir with a checkpoint"
        )
    return workdir, run_config.to_dict()


def model_differences(pretrained: dict, model: ml_collections.ConfigDict) -> list[str]:
    """`model.FIELD: checkpoint X, config Y` for every shape-relevant model field that differs."""
    old = flatten_config(pretrained.get("model", {}))
    new = flatten_config(model.to_dict())
    keys = sorted(k for k in set(old) | set(new) if k.split(".")[0] not in _SHAPE_FREE_FIELDS)
    # Options of mixers the model does not use cannot matter.
    used = {f"mixer_options.{old.get('mixer')}", f"mixer_options.{new.get('mixer')}"}
    keys = [k for k in keys if not k.startswith("mixer_options.") or ".".join(k.split(".")[:2]) in used]
    return [
        f"model.{k}: checkpoint {old.get(k, '<absent>')!r}, config {new.get(k, '<absent>')!r}"
        for k in keys
        if old.get(k) != new.get(k)
    ]


def load_pretrained_backbone(config: ml_collections.ConfigDict, vocab_size: int) -> tuple[nnx.State, int]:
    """(the pretrained encoder's parameters, checkpoint step); a shape mismatch names the differing fields."""
    workdir, pre_config = pretrained_run(config)
    train = ml_collections.ConfigDict(pre_config["train"])
    try:
        model, step = restore_model(
            lambda rngs: MaskedLM(config.model, vocab_size=vocab_size, rngs=rngs),
            train,
            workdir / "checkpoints",
            step=config.pretrained.step or None,
        )
    except CheckpointDamaged:
        raise  # its own line names the step: the model section is not what is wrong
    except ValueError as e:
        diffs = model_differences(pre_config, config.model)
        detail = "\n  ".join(diffs) if diffs else str(e)
        raise ValueError(
            f"the encoder in {workdir / 'checkpoints'} does not match this config's model section:\n  {detail}\n"
            f"Use the ENCODER preset the pretraining run used (its config: {workdir / 'config.json'})."
        ) from None
    # config.json may say pretrained.step=0 (the latest): the log and results.json name the step restored.
    print(f"pretrained encoder: {workdir / 'checkpoints'} step {step}", flush=True)
    if not (workdir / "results.json").exists():
        print(f"warning: pretrained.workdir={workdir} is unfinished (step {step} of {train.steps})", flush=True)
    return nnx.state(model.backbone, nnx.Param), step


def make_task(config: ml_collections.ConfigDict) -> Task:
    spec = glue.task_spec(config.data.task)

    @functools.cache
    def tokenizer_path() -> Path:
        return pretrained_run(config)[0] / TOKENIZER_FILE

    @functools.cache
    def tokenizer() -> SentencePieceTokenizer:
        return SentencePieceTokenizer.load(tokenizer_path())

    @functools.cache
    def backbone() -> tuple[nnx.State, int]:
        return load_pretrained_backbone(config, tokenizer().vocab_size)

    @functools.cache
    def prepare() -> dict[str, Path]:
        tok = tokenizer()
        ids = mlm_pipeline.special_ids(tok)
        backbone()  # a missing or mismatched checkpoint fails here, before the workdir is touched
        d = config.data
        key_parts = (d.task, d.source, d.dir, d.valid_size, tokenizer_path())
        key = data_lib.source_key(*key_parts, config.model.max_length)
        paths = {
            split: data_lib.cache_root(d, reads_dir=d.source == "glue_tsv", default="data/finetune-cache")
            / f"{d.task}-{split}-{key}.array_record"
            for split in ("train", *glue.eval_splits(d.task))
        }
        if all(p.exists() for p in paths.values()):
            return paths
        splits = glue.load_splits(
            d.task, d.source, d.dir, wheel_cache=d.wheel_cache, tfds_data_dir=d.tfds_data_dir, valid_size=d.valid_size
        )
        for split, path in paths.items():
            records = (
                {
                    "inputs": glue.encode(
                        texts, tok, cls_id=ids.cls, sep_id=ids.sep, max_length=config.model.max_length
                    ),
                    "targets": np.int32(label),
                }
                for texts, label in splits[split]
            )
            data_lib.write_records(path, records, progress=f"caching {path.name}")
        return paths

    def warm_start(state: nnx.State) -> nnx.State:
        params, _ = backbone()
        target = state[0]["backbone"]
        nnx.replace_by_pure_dict(target, nnx.to_pure_dict(params))
        return state

    def batch_spec(batch: int):
        return {
            "inputs": jax.ShapeDtypeStruct((batch, config.model.max_length), np.int32),
            "targets": jax.ShapeDtypeStruct((batch,), np.int32),
            "weights": jax.ShapeDtypeStruct((batch,), np.float32),
        }

    return Task(
        build_model=ModelBuilder(
            TextClassifier, config.model, dict(vocab_size=lambda: tokenizer().vocab_size, num_classes=len(spec.labels))
        ),
        train_batches=lambda: data_lib.train_batches(
            data_lib.read_records(prepare()["train"]), global_batch=config.train.batch_size, seed=config.seed
        ),
        eval_batches=lambda split: data_lib.eval_batches(
            data_lib.read_records(prepare()[split]),
            global_batch=config.train.eval_batch_size or config.train.batch_size,
        ),
        loss_fn=classification_loss(config.train.label_smoothing),
        eval_splits=glue.eval_splits(config.data.task),
        prepare=prepare,
        batch_spec=batch_spec,
        artifacts=lambda: {TOKENIZER_FILE: tokenizer_path()},
        warm_start=warm_start,
        final_results=lambda results: {"pretrained_step": backbone()[1]},
        model_flops=lambda batch: flops.encoder_step_flops(config.model, batch, ("inputs",)),
        config_sections=CONFIG_SECTIONS,
    )
