"""ReLUFormer: "ReLU attention can capture more distant correlations" than softmax attention (docs/mixers.md). Mean
attention distance per layer and head, and attention maps, of models that learned ListOps, on held-out inputs.

    python -m studies.attention_distance          # 2 arms × 8 seeds of 700 steps, ~50 minutes on 2 CPU cores
    python -m studies.attention_distance --gpu    # 8 seeds of 3,000 steps on 512–1,024-token expressions, one H100
    python -m studies.attention_distance --tiny   # 3 seeds of 4 steps on 128 examples, seconds

The `lra-train` ListOps demo setting (expressions of 20–128 tokens, 2 layers, d 128, 4 heads, 700 steps: the
models learn the task) with ReLU attention (with the 1/√(n/2) factor) or softmax attention, same data and seeds.
The attention matrix of every layer is read out of the mixer's own `attend` (what the trained model computes): its
inputs are recorded on a forward pass of 8 test examples, then it is applied to one-hot values. The distance of
query i is Σ_j a_ij |i − j| / Σ_j a_ij over the real keys (ReLU rows are not normalised; rows with no weight are
skipped), averaged over real queries. A head that weights no key on most rows (ReLU's can) is dead: it is counted
apart, not as distance 0; a seed's figure is its mean over the live heads of every layer. Read at a quarter, half
and all of the steps (the checkpoints), for the gap's sign over the last two doublings.

The paper's evidence is attention maps; the mean distance is the quantity such a map shows (how far from the
query its weight lies), so it is taken as the paper's measure. Judged by the studies' rule: each arm's models
learned the task (the control), then ReLU's mean distance against softmax's, Welch's test, the smallest effect
that matters SMALLEST_EFFECT of the uniform attention's distance.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from lra_flax.tasks import make_task
from lra_flax.tasks.listops import held_out_majority_rate, train_label_entropy
from studies.common import (
    NOT_MEASURABLE,
    arm_folder,
    listops_config,
    logged_curve,
    result_preset,
    runs_root,
    study_main,
    study_readme,
    write_study,
)
from studies.verdict import (
    Arm,
    Verdict,
    combine,
    decide,
    failed_controls,
    judged,
    learned,
    mean_pm_std,
    seeds_for_gap,
    with_budget,
)
from zoo.mixers.attention import MultiHeadMixer
from zoo.plots import pyplot, save_figure
from zoo.training import train_and_evaluate
from zoo.training.state import load_model

RELU, SOFTMAX = "relu, 1/√(n/2)", "softmax"
ARMS = {RELU: ("relu", True), SOFTMAX: ("softmax", None)}
RUNS = Path("runs/studies/attention_distance")
SEEDS = {"tiny": 3, "cpu": 8, "gpu": 8}
STEPS = {"tiny": 4, "cpu": 700, "gpu": 3000}
EXAMPLES = 8
DEAD_ROW_SHARE = 0.1  # a head with weight on fewer of the real query rows than this is dead
SMALLEST_EFFECT = 0.05  # of the uniform attention's distance: a gap smaller than this is not one that matters


def config_for(arm: str, seed: int, preset: str, data_dir: Path):
    config = listops_config(seed, data_dir, *ARMS[arm])
    steps = STEPS[preset]
    # Checkpoints at a quarter, half and all of the steps, all kept: the distances at each.
    config.train.update(steps=steps, eval_every=0, checkpoint_every=steps // 4, keep_checkpoints=4)
    if preset == "tiny":
        config.data.generator.update(num_train=128, num_valid=32, num_test=32)
        config.train.update(log_every=2, warmup_steps=1, batch_size=16, eval_batch_size=16)
    if preset == "gpu":
        config.data.generator.update(min_length=512, max_length=1024, max_depth=10, max_args=10)
        config.model.max_length = 1024
        config.train.update(warmup_steps=steps // 10, batch_size=32)
    return config


def arm_dir(root: Path, arm: str, seed: int) -> Path:
    return root / arm_folder(*ARMS[arm]) / f"seed{seed}"


def planned_runs(preset: str, root: Path) -> list[tuple[str, int, Path, ml_collections.ConfigDict]]:
    """(arm, seed, workdir, config) of every run of the preset, in order."""
    return [
        (arm, seed, arm_dir(root, arm, seed), config_for(arm, seed, preset, root / "data"))
        for arm in ARMS
        for seed in range(SEEDS[preset])
    ]


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


def mean_distance(weights: np.ndarray, real: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per head of `[batch, heads, query, key]` weights: the weighted mean |i − j| over the real query rows that
    weight some key, and the share of real query rows that do (a dead head's distance is NaN, not 0)."""
    t = weights.shape[-1]
    weights = np.abs(weights) * real[:, None, None, :]
    distance = np.abs(np.arange(t)[:, None] - np.arange(t)[None, :])
    mass = weights.sum(-1)
    per_row = (weights * distance).sum(-1) / np.where(mass > 0, mass, 1.0)
    rows = (mass > 0) & real[:, None, :]
    live = rows.sum((0, 2)) / np.maximum(real.sum(), 1)
    mean = (per_row * rows).sum((0, 2)) / np.maximum(rows.sum((0, 2)), 1)
    return np.where(live >= DEAD_ROW_SHARE, mean, np.nan), live


def distances_at(model: nnx.Module, inputs: np.ndarray) -> tuple[list, list, np.ndarray, np.ndarray]:
    """Per layer and head, the distance (None: dead) and live-row share of `model`, and the last layer's weights
    `[batch, heads, query, key]` and real positions `[batch, length]`."""
    distances, live = [], []
    for weights, real in attention_matrices(model, inputs):
        d, share = mean_distance(weights, real)
        distances.append([None if math.isnan(x) else float(x) for x in d])
        live.append(share.tolist())
    return distances, live, weights, real


def run(preset: str, out_dir: Path) -> dict:
    root = runs_root(preset, out_dir, RUNS)
    steps = STEPS[preset]
    read_at = [steps // 4, steps // 2, steps]
    fields = ("mean_distance", "live_rows", "test_accuracy", "test_top_prediction_share", "final_train_loss")
    measured = {field: {arm: [] for arm in ARMS} for field in fields}
    earlier = {arm: [] for arm in ARMS}  # per seed, the mean distance at a quarter and half of the steps
    maps, uniform = {}, None
    for arm, seed, workdir, config in planned_runs(preset, root):
        task = make_task(config)
        results = train_and_evaluate(config, workdir, task)
        inputs = next(iter(task.eval_batches("test")))["inputs"][:EXAMPLES]
        at_steps = [distances_at(load_model(workdir, step)[0], inputs) for step in read_at]
        distances, live, weights, real = at_steps[-1]
        earlier[arm].append([seed_distance(d) for d, *_ in at_steps[:-1]])
        last_loss = logged_curve(workdir, "train", "loss")[1][-1]
        values = (distances, live, results["test_accuracy"], results["test_top_prediction_share"], last_loss)
        for field, value in zip(fields, values, strict=True):
            measured[field][arm].append(value)
        if seed == 0:
            maps[arm] = ((weights[0], int(real[0].sum())), distances[-1])
        if uniform is None:  # every model reads the same inputs: every real key weighted alike (≈ n/3 for n)
            uniform = float(np.mean(mean_distance(np.ones_like(weights[:, :1]), real)[0]))
            majority, entropy = held_out_majority_rate(config), train_label_entropy(config)
    result = {
        "seeds": list(range(SEEDS[preset])), "read_at_steps": read_at, **measured, "earlier_mean_distance": earlier,
        "majority_rate": majority, "label_entropy": entropy, "uniform_attention_distance": uniform, "preset": preset,
    }  # fmt: skip

    plt = pyplot()
    fig, axes = plt.subplots(2, 4, figsize=(12, 6.2))
    for row, arm in enumerate(ARMS):
        (weights, n), heads = maps[arm]
        for head in range(min(4, weights.shape[0])):
            ax = axes[row, head]
            w = weights[head, :n, :n]
            ax.imshow(w / (np.abs(w).max() or 1.0), cmap="magma", interpolation="nearest")
            title = "dead" if heads[head] is None else f"{heads[head]:.0f} tokens"
            ax.set_title(f"{arm}, head {head}: {title}", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle("Last layer's attention on one held-out ListOps example, seed 0 (rows: queries)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, out_dir / "attention_distance.png")
    return report(result, out_dir)


def seed_distance(layers: list[list[float | None]]) -> float:
    """One model's mean distance over the live heads of every layer (NaN when every head is dead)."""
    live = [d for heads in layers for d in heads if d is not None]
    return float(np.mean(live)) if live else math.nan


def dead_heads(result: dict, arm: str) -> int:
    return sum(d is None for layers in result["mean_distance"][arm] for heads in layers for d in heads)


def judge(result: dict) -> tuple[Verdict, dict[str, Verdict]]:
    """The verdict and its parts (module docstring): the controls first, the comparison only when they hold."""
    parts = {
        f"{arm} learned the task (control)": learned(
            arm, result["test_accuracy"][arm], result["majority_rate"], result["test_top_prediction_share"][arm],
            last_losses=result["final_train_loss"][arm], label_entropy=result["label_entropy"],
        )
        for arm in ARMS
    }  # fmt: skip
    if (unjudged := failed_controls(parts)) is not None:
        return unjudged, parts
    relu, softmax = (
        Arm(f"{arm} mean distance", tuple(map(seed_distance, result["mean_distance"][arm]))) for arm in ARMS
    )
    earlier = {arm: np.mean(result["earlier_mean_distance"][arm], axis=0) for arm in ARMS}  # at ¼ and ½ of the steps
    history = (earlier[RELU] - earlier[SOFTMAX]).tolist()
    effect = SMALLEST_EFFECT * result["uniform_attention_distance"]
    part = decide(relu, softmax, higher_is_better=True, smallest_effect=effect, history=history)
    if part.verdict == NOT_MEASURABLE:  # the gap is read at three points, too few to extend: its budget is in seeds
        part = with_budget(part, seeds_for_gap(relu, softmax, smallest_effect=effect))
    parts["ReLU attends farther than softmax"] = part
    return combine(parts), parts


def report(result: dict, out_dir: Path) -> dict:
    """The verdict and README.md from the distances in `result` (the figure is run's)."""
    if "live_rows" not in result:
        raise ValueError("this result.json was measured before dead heads were counted apart: run the study again")
    preset = result_preset(result)
    verdict, parts = judge(result)
    measured = (
        "seeds", "read_at_steps", "mean_distance", "live_rows", "test_accuracy", "test_top_prediction_share",
        "final_train_loss", "earlier_mean_distance", "majority_rate", "label_entropy", "uniform_attention_distance",
        "preset",
    )  # fmt: skip
    result = judged(result, measured, parts, verdict)
    distances, uniform = result["mean_distance"], result["uniform_attention_distance"]

    def cell(values: list[float | None]) -> str:
        live = [v for v in values if v is not None]
        dead = len(values) - len(live)
        text = mean_pm_std(live, 1) if len(live) > 1 else f"{live[0]:.1f}" if live else "—"
        return text + (f" ({dead} dead)" if dead else "")

    rows = "\n".join(
        f"| {arm} | {layer} | "
        + " | ".join(cell([s[layer][h] for s in distances[arm]]) for h in range(len(heads)))
        + " |"
        for arm in ARMS
        for layer, heads in enumerate(distances[arm][0])
    )
    heads = len(distances[RELU][0][0])
    per_seed = "; ".join(
        f"{arm} {mean_pm_std([seed_distance(s) for s in distances[arm]], 1)} tokens over live heads, "
        f"{dead_heads(result, arm)} dead of {sum(len(h) for s in distances[arm] for h in s)}"
        for arm in ARMS
    )
    accuracies = "; ".join(
        f"{arm} {mean_pm_std(result['test_accuracy'][arm], 1, scale=100)}% (most frequent prediction "
        f"{100 * max(result['test_top_prediction_share'][arm]):.0f}% at most)"
        for arm in ARMS
    )
    config = config_for(RELU, 0, preset, Path("data"))
    model, gen = config.model, config.data.generator
    return write_study("attention_distance", out_dir, result, study_readme(
        "attention_distance", preset,
        title="Mean attention distance of trained ReLU and softmax attention",
        claim="(ReLUFormer, docs/mixers.md): ReLU attention captures more distant correlations than softmax attention.",
        setting=f"ListOps expressions of {gen.min_length}–{gen.max_length} tokens, {model.num_layers} layers, d "
        f"{model.d_model}, {model.num_heads} heads, {config.train.steps} steps, seeds "
        f"{', '.join(map(str, result['seeds']))}; {EXAMPLES} held-out examples; distance = Σ_j a_ij |i − j| / Σ_j a_ij "
        f"over real tokens; a head weighting no key on over {100 * (1 - DEAD_ROW_SHARE):.0f}% of the rows is dead. "
        f"Test accuracy {accuracies} (majority class {100 * result['majority_rate']:.1f}%). Mean distance: {per_seed}; "
        f"uniform attention {uniform:.1f}.",
        table="| attention | layer | "
        + " | ".join(f"head {h}" for h in range(heads))
        + " |\n|---|---|"
        + "---|" * heads
        + "\n"
        + rows
        + f"\n\nCells: mean ± std over seeds of the live heads' distance in tokens; uniform attention {uniform:.1f}.",
        verdict=f"{verdict.verdict} — {verdict.reason}.",
    ))  # fmt: skip


CLAIM = "ReLU attention captures more distant correlations than softmax (ReLUFormer)"
PAPER = "qualitative (attention maps)"


def summary(result: dict) -> str:
    """The README's figures of a committed result.json (studies.table)."""
    arms = ", ".join(
        f"{arm} {mean_pm_std([seed_distance(s) for s in result['mean_distance'][arm]], 1)} ({dead_heads(result, arm)} "
        "dead heads apart)"
        for arm in ARMS
    )
    return (f"mean distance over live heads: {arms} tokens (uniform {result['uniform_attention_distance']:.1f}), "
            f"{len(result['seeds'])} seeds")  # fmt: skip


if __name__ == "__main__":
    study_main("attention_distance", __doc__, run, report, runs=RUNS)
