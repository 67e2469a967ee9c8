"""Parameter counts of a config's encoder stack, per layer and per sub-module, against the same stack with softmax
attention (every other field as configured): the kernel paper's rule that a trainable feature map adds under 10%.

    python -m zoo.parameter_counts --config=lra_flax/configs/listops.py:demo [--config.model.mixer=linear]

Nothing is allocated: the model is built with `nnx.eval_shape`.
"""

from __future__ import annotations

import math
from collections import defaultdict

import jax
import ml_collections
from absl import app, flags
from flax import nnx

from kernels.platforms import device_class
from zoo.mixers.softmax import softmax_attention_path
from zoo.models import Encoder
from zoo.models.config import MODEL_FIELDS
from zoo.training import cli
from zoo.training.validate import config_problems

KIND = "a task config with a model section (lra_flax/configs/<task>.py, mt_flax/configs, mlm_flax/configs)"
_CONFIG = cli.define_config_flag("A task config with a `model` section.", lock_config=False)


def parameter_counts(model_cfg: ml_collections.ConfigDict) -> dict[str, dict[str, int]]:
    """{"block_i": {sub-module: count}} plus {"final_norm": ...} for an encoder built from `model_cfg`."""
    encoder = nnx.eval_shape(lambda: Encoder(model_cfg, rngs=nnx.Rngs(0)))
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(encoder, nnx.Param)):
        keys = [str(getattr(p, "key", getattr(p, "idx", p))) for p in path]
        if keys[0] == "blocks":
            layer, part = f"block_{keys[1]}", keys[2]
        else:
            layer, part = keys[0], keys[0]
        counts[layer][part] += math.prod(leaf.shape)
    return {k: dict(v) for k, v in counts.items()}


def total(counts: dict[str, dict[str, int]]) -> int:
    return sum(sum(parts.values()) for parts in counts.values())


def describe(model_cfg: ml_collections.ConfigDict) -> str:
    counts = parameter_counts(model_cfg)
    lines = [f"encoder: mixer={model_cfg.mixer}, {model_cfg.num_layers} layers, d_model={model_cfg.d_model}"]
    for layer, parts in counts.items():
        detail = ", ".join(f"{k} {v:,}" for k, v in parts.items())
        lines.append(f"  {layer:<12} {sum(parts.values()):>12,}  ({detail})")
    n = total(counts)
    baseline_cfg = model_cfg.copy_and_resolve_references()
    baseline_cfg.mixer = "softmax"
    base = total(parameter_counts(baseline_cfg))
    path = softmax_attention_path(model_cfg, device_class())
    lines += [
        f"  {'total':<12} {n:>12,}",
        f"  {'softmax':<12} {base:>12,}  (same encoder with softmax attention, ffn={model_cfg.ffn} as configured)",
        f"  extra parameters vs softmax: {n - base:+,} ({100 * (n - base) / base:+.2f}%)",
        f"  softmax attention on this machine (the baseline's, and a softmax mixer's): {path}",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    # Any task config: it needs the model section alone.
    problem = cli.foreign_config_problem(
        _CONFIG.value, {"zoo/models/config.py": {"model": MODEL_FIELDS}}, "", what=KIND
    )
    if problem is not None:
        raise app.UsageError(problem)
    model = _CONFIG.value.model
    # Checked as a training run checks it, the softmax baseline too: a bad field is one line naming it.
    baseline = model.copy_and_resolve_references()
    baseline.mixer = "softmax"
    problems = config_problems(ml_collections.ConfigDict({"model": model}))
    problems += [p for p in config_problems(ml_collections.ConfigDict({"model": baseline})) if p not in problems]
    if problems:
        raise ValueError("invalid config: " + "; ".join(problems))
    print(describe(model))


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    cli.run(main, "zoo.parameter_counts")
