"""The trainable-kernel paper: "a single-layer OGLU converges faster and with less variance between runs than
the orthogonal linear kernel" (docs/mixers.md). Learning curves and final scores over 16 seeds of each, on ListOps.

    python -m studies.kernel_convergence          # 2 × 16 runs of 300 steps, about 50 minutes on 2 CPU cores
    python -m studies.kernel_convergence --gpu    # 2 × 10 runs of 3,000 steps, one H100
    python -m studies.kernel_convergence --tiny   # 2 × 3 runs of 4 steps on 128 examples, seconds

The `lra-train` ListOps demo setting (short expressions, 2-layer d 128 encoder, batch 64) with the `linear`
mixer and a one-layer kernel: `oglu` or `orth_softplus` (the paper's "orth. linear"), orthogonality
regulariser λ 0.1 for both; seeds change the initialisation and the batch order. Judged by the studies' rule: each
kernel learned the task (the control), then faster — a smaller area under the training-loss curve (its mean over
the logged steps), Welch's test — and steadier — a smaller variance of the final test accuracy between seeds, the
F-test. Validation at a quarter, half and three quarters of the steps gives each part's history.
"""

from __future__ import annotations

from pathlib import Path

import ml_collections
import numpy as np

from lra_flax.tasks import make_task
from lra_flax.tasks.listops import held_out_majority_rate
from studies.common import (
    NOT_MEASURABLE,
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
    decide_spread,
    failed_controls,
    gap_budget,
    judged,
    learned,
    mean_pm_std,
    mean_std,
    seeds_for_spread,
    with_budget,
)
from zoo.plots import pyplot, save_figure
from zoo.training import train_and_evaluate

KERNELS = {"OGLU": "oglu", "orth. linear": "orth_softplus"}
RUNS = Path("runs/studies/kernel_convergence")
SEEDS = {"tiny": 3, "cpu": 16, "gpu": 10}  # gpu: 3,000-step runs within the 8-minute plan
STEPS = {"tiny": 4, "cpu": 300, "gpu": 3000}


def config_for(kernel: str, seed: int, preset: str, data_dir: Path):
    config = listops_config(seed, data_dir, "linear")
    config.model.mixer_options.linear.update(feature_map=kernel, kernel_depth=1)
    steps = STEPS[preset]
    # Validation at a quarter, half and three quarters of the steps: the spread's sign over the last two doublings.
    config.train.update(
        steps=steps, log_every=20, eval_every=steps // 4, checkpoint_every=steps, warmup_steps=steps // 10
    )
    if preset == "tiny":
        config.data.generator.update(num_train=128, num_valid=32, num_test=32)
        config.train.update(steps=4, log_every=2, checkpoint_every=4, warmup_steps=1, batch_size=16)
        config.train.eval_batch_size = 16
    return config


def planned_runs(preset: str, root: Path) -> list[tuple[str, Path, ml_collections.ConfigDict]]:
    """(kernel's name, workdir, config) of every run of the preset, in order."""
    return [
        (name, root / kernel / f"seed{seed}", config_for(kernel, seed, preset, root / "data"))
        for name, kernel in KERNELS.items()
        for seed in range(SEEDS[preset])
    ]


def run(preset: str, out_dir: Path) -> dict:
    fields = ("train_loss", "valid_accuracy", "test_accuracy", "test_top_prediction_share")
    measured = {field: {name: [] for name in KERNELS} for field in fields}
    root = runs_root(preset, out_dir, RUNS)
    for name, workdir, config in planned_runs(preset, root):
        results = train_and_evaluate(config, workdir, make_task(config))
        steps, loss = logged_curve(workdir, "train", "loss")
        valid_steps, valid = logged_curve(workdir, "valid", "accuracy")
        values = (loss, valid, results["test_accuracy"], results["test_top_prediction_share"])
        for field, value in zip(fields, values, strict=True):
            measured[field][name].append(value)
    majority = held_out_majority_rate(config)  # the runs share their data
    result = {
        "steps": steps, "valid_steps": valid_steps, "seeds": list(range(SEEDS[preset])), **measured,
        "majority_rate": majority, "tiny": preset == "tiny", "preset": preset,
    }  # fmt: skip
    return report(result, out_dir)


SMALLEST_EFFECT = 0.01  # nats of mean training loss: a gap smaller than this is not one that matters


def judge(result: dict) -> tuple[Verdict, dict[str, Verdict]]:
    """The verdict and its parts (module docstring); each part not measurable says its budget."""
    steps, accuracy = result["steps"], result["test_accuracy"]
    curves = {name: np.asarray(c) for name, c in result["train_loss"].items()}
    parts = {
        f"{name} learned the task (control)": learned(
            name, accuracy[name], result["majority_rate"], result.get("test_top_prediction_share", {}).get(name)
        )
        for name in KERNELS
    }
    if (unjudged := failed_controls(parts)) is not None:
        return unjudged, parts
    # Per seed, the mean training loss over the logged steps up to a point (the area under its curve): the lower,
    # the faster. At a quarter and half of the steps: whether the gap held as training went on.
    upto = [max(i for i, step in enumerate(steps) if step <= steps[-1] * f) for f in (0.25, 0.5, 1.0)]
    area = {name: [c[:, : i + 1].mean(axis=1) for i in upto] for name, c in curves.items()}
    oglu, linear = (Arm(name, tuple(map(float, area[name][-1]))) for name in KERNELS)
    gaps = [float(np.mean(a) - np.mean(b)) for a, b in zip(area["OGLU"], area["orth. linear"], strict=True)]
    faster = decide(oglu, linear, higher_is_better=False, smallest_effect=SMALLEST_EFFECT, history=gaps[:2])
    if faster.verdict == NOT_MEASURABLE:
        faster = with_budget(faster, gap_budget(oglu, linear, [steps[upto[1]], steps[-1]], gaps[1:], [0.0, 0.0],
                                                higher_is_better=False, smallest_effect=SMALLEST_EFFECT))  # fmt: skip
    final = {name: Arm(f"{name} test accuracy", tuple(map(float, accuracy[name]))) for name in KERNELS}
    valid = {name: np.asarray(v) for name, v in result.get("valid_accuracy", {}).items()}
    spread_history = (
        [float(valid["OGLU"][:, i].std(ddof=1) - valid["orth. linear"][:, i].std(ddof=1)) for i in (0, 1)]
        if valid else None
    )  # fmt: skip
    steadier = decide_spread(final["OGLU"], final["orth. linear"], history=spread_history)
    if steadier.verdict == NOT_MEASURABLE:
        steadier = with_budget(steadier, seeds_for_spread(final["OGLU"], final["orth. linear"]))
    parts["faster"], parts["steadier"] = faster, steadier
    return combine(parts), parts


def report(result: dict, out_dir: Path) -> dict:
    """The verdict, the figure and README.md from the curves in `result`; returns `result` with the verdict and the
    per-seed figures it rests on."""
    steps, preset = result["steps"], result_preset(result)
    curves = {name: np.asarray(c) for name, c in result["train_loss"].items()}
    accuracy = result["test_accuracy"]
    area = {name: c.mean(axis=1) for name, c in curves.items()}
    if "majority_rate" not in result:
        raise ValueError("this result.json has no majority_rate (recorded before the held-out check): run it again")
    verdict, parts = judge(result)
    measured = (
        "steps", "valid_steps", "seeds", "train_loss", "valid_accuracy", "test_accuracy", "test_top_prediction_share",
        "majority_rate", "tiny", "preset",
    )  # fmt: skip
    result = judged(result, measured, parts, verdict)
    result["mean_loss_over_training"] = {name: a.tolist() for name, a in area.items()}

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, c in curves.items():
        mean, std = c.mean(axis=0), c.std(axis=0, ddof=1)
        ax.plot(steps, mean, label=f"{name} (mean of {len(c)})")
        ax.fill_between(steps, mean - std, mean + std, alpha=0.25)
    ax.set(xlabel="step", ylabel="training loss", title="One-layer trainable kernels on ListOps: mean ± std over seeds")
    ax.legend()
    save_figure(fig, out_dir / "kernel_convergence.png")

    rows = "\n".join(
        f"| {name} | {len(area[name])} | {mean_pm_std(area[name], 4)} | {mean_pm_std(accuracy[name], 1, scale=100)} |"
        for name in KERNELS
    )
    return write_study("kernel_convergence", out_dir, result, study_readme(
        "kernel_convergence", preset,
        title="Convergence of a one-layer OGLU vs the orthogonal linear kernel",
        claim="(trainable-kernel paper, docs/mixers.md): a single-layer OGLU converges faster and with less variance "
        "between runs than the orthogonal linear kernel.",
        setting=f"ListOps demo data and model (2 layers, d 128) with `mixer=linear`, `kernel_depth=1`, {steps[-1]} "
        f"steps, seeds {', '.join(map(str, result['seeds']))}. Faster: a lower mean training loss over the run, per "
        "seed (the area under the learning curve); steadier: a smaller variance of the final test accuracy between "
        "seeds. Mean ± std over seeds (n − 1).",
        table="| kernel | seeds | mean training loss over the run | test accuracy % |\n"
        f"|---|---|---|---|\n{rows}\n| majority class | — | — | {100 * result['majority_rate']:.1f} |",
        verdict=f"{verdict.verdict} — {verdict.reason}.",
    ))  # fmt: skip


CLAIM = "a one-layer OGLU converges faster and with less variance than the orthogonal linear kernel (kernel paper)"
PAPER = "qualitative (learning curves)"


def summary(result: dict) -> str:
    """The README's figures of a committed result.json (studies.table)."""
    area = {name: [float(np.mean(c)) for c in curves] for name, curves in result["train_loss"].items()}
    loss = [mean_pm_std(area[name], 3) for name in KERNELS]
    spread = [100 * mean_std(result["test_accuracy"][name])[1] for name in KERNELS]
    return (f"mean training loss {loss[0]} (OGLU) vs {loss[1]}; final test accuracy's std between "
            f"runs {spread[0]:.2f} vs {spread[1]:.2f} points, {len(result['seeds'])} seeds")  # fmt: skip


if __name__ == "__main__":
    study_main("kernel_convergence", __doc__, run, report, runs=RUNS)
