"""ReLUFormer: "ReLU attention can capture more distant correlations" than softmax attention (docs/mixers.md). Mean
attention distance per layer and head, and attention maps, of trained models on held-out inputs.

    python -m studies.attention_distance          # studies.stability's models, ~1 min (+3.5 min a missing one)
    python -m studies.attention_distance --gpu    # the models of `studies.stability --gpu`
    python -m studies.attention_distance --tiny   # studies.stability's --tiny models, seconds

The models are `studies.stability`'s at its first learning rate, one per seed (ListOps, 512–1,024 tokens, 2 layers,
4 heads, post-LN): ReLU attention with the 1/√(n/2) factor against softmax, same data, optimiser and seeds. The
attention matrix of every layer is read out of the mixer's own `attend` (what the trained model computes): its
inputs are recorded on a forward pass of 8 test examples, then it is applied to one-hot values. The distance of
query i is Σ_j a_ij |i − j| / Σ_j a_ij over the real keys (ReLU rows are not normalised; rows with no weight are
skipped), averaged over real queries; a seed's figure is its mean over layers and heads.

Judged by the studies' rule (studies/verdict.py), higher is better, in three parts: each arm's models learned the
task (test accuracy measurably above the majority class), each arm's attention left the untrained pattern (its
distance measurably away from uniform attention, which weights every real key alike — where softmax starts), and
ReLU's distance beyond softmax's by more than the rule's margin. A model at chance or an attention at uniform says
nothing of which attention reaches farther: "not measurable at this budget". `--report` judges result.json again.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx

from lra_flax.tasks import make_task
from lra_flax.tasks.listops import held_out_majority_rate, train_label_entropy
from studies import stability
from studies.common import (
    StudyError,
    gpu_work_seconds,
    result_preset,
    runs_root,
    study_main,
    study_readme,
    write_study,
)
from studies.verdict import (
    REPRODUCED,
    Arm,
    Verdict,
    combine,
    decide,
    decide_threshold,
    failed_controls,
    judged,
    learned,
    mean_pm_std,
    mean_std,
    with_budget,
)
from zoo.files import read_json
from zoo.mixers.attention import MultiHeadMixer
from zoo.plots import pyplot, save_figure
from zoo.training.config import read_run_config
from zoo.training.state import restore_model

ARMS = ("relu, 1/√(n/2)", "softmax")
EXAMPLES = 8


def load_run(workdir: Path):
    """(model in eval mode, config, task) of a finished lra-train workdir."""
    config = read_run_config(workdir, reader="attention_distance reads the lra-train runs of the stability study")
    task = make_task(config)
    model, _ = restore_model(task.build_model, config.train, workdir / "checkpoints")
    model.eval()
    return model, config, task


@contextlib.contextmanager
def recording_attention(records: list):
    """Every MultiHeadMixer.attend call appends (mixer, q, k, mask, causal) to `records`."""
    classes = {cls for cls in _subclasses(MultiHeadMixer) if "attend" in vars(cls)}
    originals = {cls: vars(cls)["attend"] for cls in classes}

    def recorder(original):
        def attend(self, q, k, v, mask, causal, **kwargs):  # kwargs: rngs, for mixers that drop attention weights
            records.append((self, original, q, k, mask, causal))
            return original(self, q, k, v, mask, causal, **kwargs)

        return attend

    for cls, original in originals.items():
        cls.attend = recorder(original)
    try:
        yield records
    finally:
        for cls, original in originals.items():
            cls.attend = original


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def attention_matrices(model: nnx.Module, inputs: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per layer, the `[batch, heads, query, key]` weights the model's mixers apply to `inputs` and the real
    positions `[batch, length]` they saw (a classifier's [CLS] included)."""
    records: list = []
    with recording_attention(records):
        model(jnp.asarray(inputs))
    matrices = []
    for mixer, attend, q, k, mask, causal in records:
        b, t, h, d = q.shape
        columns = []
        for start in range(0, t, d):  # one-hot values, a head dim of key positions at a time
            width = min(d, t - start)
            eye = jnp.zeros((t, d)).at[start + jnp.arange(width), jnp.arange(width)].set(1.0)
            values = jnp.broadcast_to(eye[None, :, None, :], (b, t, h, d)).astype(q.dtype)
            columns.append(attend(mixer, q, k, values, mask, causal)[..., :width])
        weights = jnp.concatenate(columns, axis=-1)  # [b, query, h, key]
        real = np.ones((b, t), bool) if mask is None else np.asarray(mask, bool)
        matrices.append((np.asarray(weights.transpose(0, 2, 1, 3), np.float64), real))
    return matrices


def mean_distance(weights: np.ndarray, real: np.ndarray) -> np.ndarray:
    """Per head, the weighted mean |i − j| of `[batch, heads, query, key]` weights over real query rows."""
    t = weights.shape[-1]
    weights = np.abs(weights) * real[:, None, None, :]
    distance = np.abs(np.arange(t)[:, None] - np.arange(t)[None, :])
    mass = weights.sum(-1)
    per_row = (weights * distance).sum(-1) / np.where(mass > 0, mass, 1.0)
    rows = (mass > 0) & real[:, None, :]
    return (per_row * rows).sum((0, 2)) / np.maximum(rows.sum((0, 2)), 1)


def planned_gpu_seconds() -> float:
    """The `gpu` preset on one H100, once `studies.stability --gpu` has trained its models (their time is that
    study's plan): per model, a forward pass that records every layer's attention inputs and one `attend` per
    layer, each compiled once per model (a model is loaded anew)."""
    config = stability.config_for(ARMS[0], 0, "gpu", Path("data"))
    models = len(ARMS) * len(stability.seeds_of("gpu"))
    programs = models * (1 + config.model.num_layers)
    return gpu_work_seconds(programs=programs, dispatches=programs)


def run(preset: str, out_dir: Path) -> dict:
    tiny = preset == "tiny"
    root = runs_root(preset, out_dir / "stability", stability.RUNS)
    seeds = stability.seeds_of(preset)
    first_rate = stability.GRIDS[preset][0]
    distances = {arm: [] for arm in ARMS}
    accuracy = {arm: [] for arm in ARMS}
    final_loss = {arm: [] for arm in ARMS}  # each model's last logged training loss: the budget of the controls
    maps, uniform, majority, entropy = {}, None, None, None
    for arm in ARMS:
        for seed in seeds:
            workdir = stability.arm_dir(root, arm, seed, first_rate)
            if not (workdir / "results.json").exists():  # not on this machine (its summary may be committed)
                stability.train_one(arm, seed, first_rate, preset, root)
            if not (workdir / "results.json").exists():
                raise StudyError(
                    f"{workdir}: {arm}, seed {seed}, did not finish at the first learning rate ({first_rate:g}): "
                    "the study needs its trained model (diverged? metrics.jsonl there has its losses)"
                )
            model, config, task = load_run(workdir)
            accuracy[arm].append(float(read_json(workdir / "results.json", "train it again")["test_accuracy"]))
            final_loss[arm].append(float(stability.logged(workdir)[-1]["loss"]))
            batch = next(iter(task.eval_batches("test")))
            matrices = attention_matrices(model, batch["inputs"][:EXAMPLES])
            distances[arm].append([mean_distance(w, real).tolist() for w, real in matrices])
            weights, real = matrices[-1]
            if seed == seeds[0]:
                maps[arm] = (weights[0], int(real[0].sum()))
            if majority is None:  # every model read the same data (seeds change the initialisation and batch order)
                # The reference points: every real key weighted equally (≈ n/3 for n real tokens), the majority class,
                # the training labels' entropy (the loss of a model that learned only the class frequencies).
                uniform = float(np.mean(mean_distance(np.ones_like(weights[:, :1]), real)))
                majority, entropy = held_out_majority_rate(config), train_label_entropy(config)
    result = {
        "seeds": seeds, "mean_distance": distances, "test_accuracy": accuracy, "majority_rate": majority,
        "label_entropy": entropy, "uniform_attention_distance": uniform, "final_train_loss": final_loss, "tiny": tiny,
        "preset": preset,
    }  # fmt: skip

    plt = pyplot()
    fig, axes = plt.subplots(2, 4, figsize=(12, 6.2))
    for row, arm in enumerate(ARMS):
        weights, n = maps[arm]
        for head in range(min(4, weights.shape[0])):
            ax = axes[row, head]
            w = weights[head, :n, :n]
            ax.imshow(w / (np.abs(w).max() or 1.0), cmap="magma", interpolation="nearest")
            ax.set_title(f"{arm}, head {head}: {distances[arm][0][-1][head]:.0f} tokens", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(
        f"Last layer's attention on one held-out ListOps example, seed {seeds[0]} (rows: queries)", fontsize=10
    )
    fig.tight_layout()
    save_figure(fig, out_dir / "attention_distance.png")
    return report(result, out_dir)


def seed_distances(result: dict, arm: str) -> tuple[float, ...]:
    """Per seed, the arm's mean distance over every layer and head."""
    return tuple(float(np.mean([np.mean(heads) for heads in layers])) for layers in result["mean_distance"][arm])


def judge(result: dict) -> tuple[Verdict, dict[str, Verdict]]:
    """The verdict and its parts (module docstring): the controls first, the comparison only when they hold."""
    uniform, majority = result["uniform_attention_distance"], result["majority_rate"]
    parts = {}
    for arm in ARMS:
        losses = result.get("final_train_loss", {}).get(arm)  # absent from results measured before it
        parts[f"{arm} learned the task (control)"] = learned(
            arm, result["test_accuracy"][arm], majority, last_losses=losses, label_entropy=result.get("label_entropy")
        )
        distance = Arm(f"{arm} mean distance", seed_distances(result, arm), uniform)
        farther = mean_std(distance.values)[0] > uniform  # either side of uniform: the attention left it
        part = decide_threshold(distance, uniform, higher_is_better=farther)
        if part.verdict != REPRODUCED:  # one model per seed, read at its end: no curve to carry forward
            part = with_budget(part, "none from a curve: the distances are read from each run's final model only; "
                                     "a model that learns the task comes first (the control above)")  # fmt: skip
        parts[f"{arm} attention is not uniform (control)"] = part
    if (unjudged := failed_controls(parts)) is not None:
        return unjudged, parts
    relu, softmax = (Arm(f"{arm} mean distance", seed_distances(result, arm), -math.inf) for arm in ARMS)
    parts["ReLU attends farther than softmax"] = decide(relu, softmax, higher_is_better=True)
    return combine(parts), parts


def report(result: dict, out_dir: Path) -> dict:
    """The verdict under the studies' rule and README.md from the distances in `result` (the figure is run's)."""
    if "seeds" not in result:
        raise ValueError("this result.json was measured on one seed, before the rule: run the study again")
    preset = result_preset(result)
    verdict, parts = judge(result)
    measured = ("seeds", "mean_distance", "test_accuracy", "majority_rate", "uniform_attention_distance", "tiny")
    # Absent from results measured before them:
    measured += tuple(field for field in ("final_train_loss", "label_entropy") if field in result)
    result = judged({**result, "preset": preset}, (*measured, "preset"), parts, verdict)
    distances, uniform = result["mean_distance"], result["uniform_attention_distance"]

    def per_layer(arm: str, layer: int) -> str:
        return mean_pm_std([float(np.mean(layers[layer])) for layers in distances[arm]], 1)

    rows = "\n".join(
        f"| {arm} | {layer} | {per_layer(arm, layer)} | "
        f"{', '.join(f'{np.mean([s[layer][h] for s in distances[arm]]):.1f}' for h in range(len(heads)))} |"
        for arm in ARMS
        for layer, heads in enumerate(distances[arm][0])
    )
    rows += f"\n| uniform (every real key alike) | any | {uniform:.1f} | — |"
    accuracies = "; ".join(f"{arm} {mean_pm_std(result['test_accuracy'][arm], 1, scale=100)}%" for arm in ARMS)
    config = stability.config_for(ARMS[0], 0, preset, Path("data"))
    model, train = config.model, config.train
    seeds = ", ".join(map(str, result["seeds"]))
    readme = study_readme(
        "attention_distance", preset,
        title="Mean attention distance of trained ReLU and softmax attention",
        claim="(ReLUFormer, docs/mixers.md): ReLU attention captures more distant correlations than softmax attention.",
        setting="the models of `studies.stability` at its first learning rate, seeds " + seeds + " ("
        + ("tiny" if preset == "tiny" else f"ListOps, 512–1,024 tokens, {model.num_layers} layers, d {model.d_model}, "
           f"{model.num_heads} heads, post-LN, {train.steps} steps at learning rate {train.learning_rate:g}")
        + f"), {EXAMPLES} held-out examples; distance = Σ_j a_ij |i − j| / Σ_j a_ij over real tokens. Test accuracy "
        f"{accuracies} (majority class {100 * result['majority_rate']:.1f}%).",
        table="| attention | layer | mean distance (tokens), mean ± std over seeds | per head (mean over seeds) |\n"
        "|---|---|---|---|\n" + rows,
        verdict=f"{verdict.verdict} — {verdict.reason}.",
        figure="attention_distance.png",
        notes=f"read against the uniform row: attention that weights every real key alike is {uniform:.0f} tokens "
        "away on average, and softmax starts there. A model that has not left chance on ListOps has learned no "
        "pattern of attention worth comparing: the rule asks both controls before the comparison.",
    )  # fmt: skip
    write_study(out_dir, result, readme)
    return result


CLAIM = "ReLU attention captures more distant correlations than softmax (ReLUFormer)"
PAPER = "qualitative"


def summary(result: dict) -> str:
    """The README's figures of a committed result.json (studies.table), also of one recorded on one seed."""
    uniform = f" tokens (uniform {result['uniform_attention_distance']:.0f})"
    if "seeds" not in result:
        per_layer = result["mean_distance_per_layer"]
        layers = "; ".join(f"{arm} {', '.join(f'{d:.0f}' for d in ds)}" for arm, ds in per_layer.items())
        return f"mean distance per layer: {layers}{uniform}; seed 0"
    arms = ", ".join(f"{arm} {mean_pm_std(seed_distances(result, arm), 0)}" for arm in ARMS)
    return f"mean distance over layers and heads: {arms}{uniform}, {len(result['seeds'])} seeds"


if __name__ == "__main__":
    study_main("attention_distance", __doc__, run, report, runs=stability.RUNS)
