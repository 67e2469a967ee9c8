"""What a task gives the training loop: its model, its batches, its loss, and its extras."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import grain
import jax
import numpy as np
from flax import nnx

from zoo.config_fields import Field
from zoo.training.steps import LossFn


@dataclasses.dataclass(frozen=True)
class Task:
    """What a task gives the loop.

    build_model:   rngs → the model (an `nnx.Module`).
    train_batches: () → an infinite `grain.IterDataset` of numpy batches with a `weights` field.
    eval_batches:  split name → a finite iterable of padded batches (same shapes every batch).
    loss_fn:       (model, batch, rngs, train) → (objective sum, metric sums); see `zoo.training.losses`.
    count_tokens:  batch → number of real input tokens (for tokens/s).
    eval_splits:   splits evaluated during training (first one) and at the end (all).
    row_multiple:  0 for batches of train.batch_size examples; > 0 for tasks that batch by tokens (translation),
                   whose rows vary in number, always a multiple of this (train.batch_size must then be 0).
    prepare:       () → {split: cached example file}; generates/caches data (process 0 first), before anything
                   is written to the workdir.
    batch_spec:    global batch size → {field: ShapeDtypeStruct} of the largest batch, for which every run
                   compiles its train step and checks its memory (None: no check); `--plan_memory` uses it too.
    artifacts:     () → {file name: path}; copied into the workdir with config.json (e.g. the tokenizer).
    generate_eval: (model in eval mode, split, workdir or None) → extra metrics (e.g. BLEU); `workdir` only at
                   the end, for files the task writes there. Text values go to results.json only.
    final_results: results → entries added to results.json under names of the task's choosing.
    model_flops:   batch → the model FLOPs of one train step on it (zoo/training/flops.py), for TFLOP/s and MFU;
                   None: neither is reported.
    warm_start:    fresh train state → the state to start from (e.g. a pretrained encoder); never on resume.
    scored:        what the loss's weights count ("examples"; "tokens" for a per-token loss): evaluation reports
                   their number under this name.
    config_sections: the task's own config sections by name ({"data": its fields, ...}), validated with the
                   shared ones before anything is written.
    """

    build_model: Callable[[nnx.Rngs], nnx.Module]
    train_batches: Callable[[], grain.IterDataset]
    eval_batches: Callable[[str], Iterable[dict]]
    loss_fn: LossFn
    count_tokens: Callable[[dict], int] = lambda batch: int(np.count_nonzero(batch["inputs"]))
    eval_splits: tuple[str, ...] = ("valid", "test")
    prepare: Callable[[], dict[str, Path]] = dict
    batch_spec: Callable[[int], dict[str, jax.ShapeDtypeStruct]] | None = None
    artifacts: Callable[[], dict[str, Path]] = dict
    generate_eval: Callable[[nnx.Module, str, Path | None], dict[str, float | str]] | None = None
    final_results: Callable[[dict], dict] = lambda results: {}
    warm_start: Callable[[nnx.State], nnx.State] | None = None
    model_flops: Callable[[dict], float] | None = None
    row_multiple: int = 0
    scored: str = "examples"
    config_sections: Mapping[str, tuple[Field, ...]] = dataclasses.field(default_factory=dict)
