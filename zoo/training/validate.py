"""One validation pass over a resolved task config, before anything touches the workdir.

Every numeric field of `train`, `model` and `mesh` is checked against its range, every enum against its
values, and every mixer's options — the inactive mixers' too, so that a typo set today does not wait for
the day that mixer is chosen. All problems are reported at once, each naming its field.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import ml_collections
from absl import logging
from flax import nnx

from kernels.options import IMPLS
from zoo import mixers
from zoo.files import is_url
from zoo.layers.common import DTYPES
from zoo.layers.embeddings import EMBED_SCALES, POSITIONAL
from zoo.layers.ffn import FFN_INITS, FFN_KINDS
from zoo.layers.heads import POOLINGS
from zoo.mixers.attention import ATTENTION_INITS
from zoo.models.blocks import NORMS
from zoo.models.config import mixer_config
from zoo.models.encoder import REMAT
from zoo.models.seq2seq import TIE_EMBEDDINGS
from zoo.training import mesh as mesh_lib

_Rule = tuple[Callable[[object], bool], str]


def _number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _at_least(low) -> _Rule:
    return (lambda x: _number(x) and x >= low), f"must be a number ≥ {low}"


def _above(low) -> _Rule:
    return (lambda x: _number(x) and x > low), f"must be a number > {low}"


def _in_range(low, high) -> _Rule:  # [low, high)
    return (lambda x: _number(x) and low <= x < high), f"must be in [{low}, {high})"


def _one_of(*values) -> _Rule:
    return (lambda x: x in values), f"must be one of {', '.join(map(str, values))}"


def _integer(low) -> _Rule:
    return (lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= low), f"must be an integer ≥ {low}"


TRAIN_RULES: dict[str, _Rule] = {
    "steps": _integer(0),  # 0 evaluates the initialised model only (the MLM demo's "untrained" row)
    "batch_size": _integer(0),  # 0 only for token-batched tasks (the loop checks which)
    "eval_batch_size": _integer(0),
    "eval_max_batches": _integer(0),
    "learning_rate": _above(0),
    "schedule": _one_of("rsqrt", "cosine", "constant"),
    "warmup_steps": _integer(0),
    "weight_decay": _at_least(0),
    "weight_decay_mask": _one_of("all", "no_norm_or_bias"),
    "b1": _in_range(0, 1),
    "b2": _in_range(0, 1),
    "eps": _above(0),
    "grad_clip_norm": _at_least(0),
    "grad_accum_steps": _integer(1),
    "label_smoothing": _in_range(0, 1),
    "log_every": _integer(1),
    "eval_every": _integer(0),
    "checkpoint_every": _integer(1),
    "keep_checkpoints": _integer(1),
}
MODEL_RULES: dict[str, _Rule] = {
    "num_layers": _integer(1),
    "num_decoder_layers": _integer(0),
    "d_model": _integer(1),
    "num_heads": _integer(1),
    "mlp_dim": _integer(1),
    "max_length": _integer(1),
    "dropout": _in_range(0, 1),
    "ffn": _one_of(*FFN_KINDS),
    "positional": _one_of(*POSITIONAL),
    "pooling": _one_of(*POOLINGS),
    "pad_id": _integer(-1),
    "dtype": _one_of(*DTYPES),
    "remat": _one_of(*REMAT),
    "scan_layers": ((lambda x: isinstance(x, bool)), "must be True or False"),
    "layer_norm_eps": _above(0),
    "gelu_approximate": _one_of(True, False),
    "tie_embeddings": _one_of(*TIE_EMBEDDINGS),
    "qkv_dim": _integer(0),
    "attention_bias": _one_of(True, False),
    "attention_dropout": _in_range(0, 1),
    "ffn_dropout": ((lambda x: x == -1 or (isinstance(x, (int, float)) and 0 <= x < 1)), "must be in [0, 1) or -1"),
    "ffn_init": _one_of(*FFN_INITS),
    "norm": _one_of(*NORMS),
    "head_layers": _integer(1),
    "pixel_zero_is_padding": _one_of(True, False),
    "embed_scale": _one_of(*EMBED_SCALES),
    "attention_init": _one_of(*ATTENTION_INITS),
}
# Mixer options by name (the same name means the same thing in every mixer that has it).
OPTION_RULES: dict[str, _Rule] = {
    "impl": _one_of(*IMPLS),  # the kernels' own list
    "eps": _above(0),
    "rms_norm_eps": _above(0),
    "gamma_init": _above(0),
    "num_features": _integer(1),
    "chunk_size": _integer(1),
    "kernel_depth": _integer(1),
    "gate_rank": _integer(0),
    "d_ffn": _integer(0),
    "tiny_attention_dim": _integer(0),
    "relative_buckets": _integer(0),
    "relative_max_distance": _integer(1),
    "spatial_init_scale": _at_least(0),
    "entropy_margin": _in_range(0, 1),
    "orth_loss_weight": _at_least(0),
    "norm_loss_weight": _at_least(0),
    "entropy_loss_weight": _at_least(0),
}


def _check(section: ml_collections.ConfigDict, rules: dict[str, _Rule], prefix: str) -> list[str]:
    problems = []
    for name, (ok, what) in rules.items():
        if name in section and not ok(section[name]):
            problems.append(f"{prefix}.{name}={section[name]!r} {what}")
    return problems


def _mixer_problems(model: ml_collections.ConfigDict) -> list[str]:
    problems = []
    for name in sorted(model.mixer_options.keys()):
        prefix = f"model.mixer_options.{name}"
        found = _check(model.mixer_options[name], OPTION_RULES, prefix)
        if not found:
            try:  # shapes only: the mixer's own checks (enums, divisibility) without allocating anything
                nnx.eval_shape(lambda n=name: mixers.build(mixer_config(model, name=n), rngs=nnx.Rngs(0)))
            except (ValueError, TypeError) as e:
                found = [f"{prefix}: {str(e).splitlines()[0]}"]
        problems += found
    return problems


def _url_data_paths(section, prefix: str) -> list[str]:
    """Data paths are read through the local filesystem (memory-mapped caches, directory listings): a URL
    there would be taken for a relative local path, so it is refused by name. Workdirs may be URLs."""
    if not isinstance(section, ml_collections.ConfigDict):
        return []
    problems = []
    for key, value in section.items():
        if isinstance(value, ml_collections.ConfigDict):
            problems += _url_data_paths(value, f"{prefix}.{key}")
        elif isinstance(value, str) and is_url(value):
            problems.append(f"{prefix}.{key}={value} must be a local path (copy the data to local disk first)")
    return problems


def config_problems(config: ml_collections.ConfigDict) -> list[str]:
    """Every problem found in `config`, one line each naming the field; empty when it is valid."""
    problems = _check(config.train, TRAIN_RULES, "train") if "train" in config else []
    if "mesh" in config:
        for axis in mesh_lib.AXES:
            size = config.mesh.get(axis)
            if not (isinstance(size, int) and (size == -1 or size >= 1)):
                problems.append(f"mesh.{axis}={size!r} must be -1 (every remaining device) or an integer ≥ 1")
        for name, axis in config.mesh.rules.items():
            if axis not in ("", *mesh_lib.PARAMETER_AXES):
                problems.append(f"mesh.rules.{name}={axis!r} must be one of {', '.join(mesh_lib.PARAMETER_AXES)} or ''")
        tolerance = config.mesh.sharding_tolerance
        if not (_number(tolerance) and 0 <= tolerance <= 1):
            problems.append(f"mesh.sharding_tolerance={tolerance!r} must be a number in [0, 1]")
    problems += _url_data_paths(config.get("data"), "data")
    if "model" in config:
        model = config.model
        problems += _check(model, MODEL_RULES, "model")
        if not problems and model.mixer not in mixers.names():
            problems.append(f"model.mixer: unknown mixer {model.mixer!r}; valid mixers: {', '.join(mixers.names())}")
        if not problems:
            problems += _mixer_problems(model)
    return problems


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Raises ValueError listing every problem (see `config_problems`); warns about legal oddities."""
    problems = config_problems(config)
    if problems:
        raise ValueError("invalid config: " + "; ".join(problems))  # one line: CLIs print errors as one
    train = config.get("train")
    if train is not None and 0 < train.steps < train.warmup_steps:
        logging.warning(
            "train.warmup_steps=%d exceeds train.steps=%d: the learning rate never finishes warming up",
            train.warmup_steps,
            train.steps,
        )
