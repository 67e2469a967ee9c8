"""The learned SGU spatial weights of a checkpoint: extraction, Toeplitz scores and the figure (`mlm-inspect`)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from mlm_flax import glue
from mlm_flax.task import TOKENIZER_FILE
from zoo.files import as_path
from zoo.mixers.sgu import SpatialGatingMixer, toeplitz_score
from zoo.models import MaskedLM, TextClassifier
from zoo.plots import pyplot, save_figure
from zoo.text import SentencePieceTokenizer
from zoo.training.config import read_run_config
from zoo.training.state import restore_model


def load_model(workdir: str | os.PathLike, step: int | None = None):
    """(model, config, step) of an mlm-train / mlm-finetune workdir's checkpoint."""
    workdir = as_path(workdir)
    config = read_run_config(
        workdir, reader="mlm-inspect reads mlm-train and mlm-finetune runs", tasks=("mlm", "mlm_finetune")
    )
    if not (workdir / TOKENIZER_FILE).is_file():
        raise FileNotFoundError(f"{workdir} has no {TOKENIZER_FILE}: not an mlm-train or mlm-finetune workdir")
    vocab = SentencePieceTokenizer.load(workdir / TOKENIZER_FILE).vocab_size
    if config.task == "mlm":
        build = lambda rngs: MaskedLM(config.model, vocab_size=vocab, rngs=rngs)
    else:  # mlm_finetune: read_run_config refused every other task
        classes = len(glue.task_spec(config.data.task).labels)
        build = lambda rngs: TextClassifier(config.model, vocab_size=vocab, num_classes=classes, rngs=rngs)
    model, step = restore_model(build, config.train, workdir / "checkpoints", step=step, model_config=config.model)
    return model, config, step


def spatial_weights(model) -> list[tuple[int, np.ndarray]]:
    """(layer index, W `[n, n]`) of every spatial gating unit of the model's encoder (Toeplitz ones expanded)."""
    out = []
    for i, block in enumerate(model.backbone.encoder.layers()):
        if isinstance(block.mixer, SpatialGatingMixer):
            out.append((i, np.asarray(block.mixer.spatial_matrix(block.mixer.max_length, causal=False))))
    return out


def plot_spatial_weights(weights: list[tuple[int, np.ndarray]], path: str | os.PathLike, title: str) -> Path:
    """One panel per layer, each with its own symmetric colour scale; written atomically."""
    plt = pyplot()
    cols = min(len(weights), 6)
    rows = math.ceil(len(weights) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.7 * rows + 0.4), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for ax, (layer, w) in zip(axes.ravel(), weights, strict=False):
        scale = float(np.abs(w).max()) or 1.0
        ax.imshow(w, cmap="RdBu_r", vmin=-scale, vmax=scale, interpolation="nearest")
        ax.set_title(f"layer {layer}  T={toeplitz_score(w):.2f}", fontsize=9)
        ax.axis("on")
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


DEFAULT_FIGURE = "sgu_weights.png"  # in the workdir, unless an output path is given


def inspect(workdir: str | os.PathLike, step: int | None = None, output: str | os.PathLike | None = None) -> dict:
    """Plots and scores a workdir's SGU weights; returns {"step", "figure", "layers": [{layer, toeplitz_score}]}."""
    model, config, step = load_model(workdir, step)
    weights = spatial_weights(model)
    if not weights:
        raise ValueError(f"{workdir}: model.mixer={config.model.mixer!r} has no spatial gating unit (use gmlp or amlp)")
    figure = plot_spatial_weights(
        weights, output or as_path(workdir) / DEFAULT_FIGURE, f"{config.model.mixer} spatial weights W, step {step}"
    )
    layers = [
        {"layer": i, "toeplitz_score": toeplitz_score(w), "rms": float(np.sqrt(np.mean(w * w)))} for i, w in weights
    ]
    return {"step": step, "figure": str(figure), "layers": layers}
