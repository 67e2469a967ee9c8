"""gMLP paper: the learned spatial weights W of a gMLP trained on real text become Toeplitz-like (shift-invariant
bands along the diagonal; the paper's figure of W, docs/mixers.md). Toeplitz score per layer against training steps.

    python -m studies.toeplitz          # reads (or trains) the 3 seeds of the split gMLP of studies.sgu_ablation
    python -m studies.toeplitz --gpu    # the same at the `gpu` preset of studies.sgu_ablation, one H100
    python -m studies.toeplitz --tiny   # 1 seed of 4 steps on a Markov-chain corpus, seconds

The shared setting (`studies.mlm_setting`: KJV, 1k vocabulary, 64-token sequences, 4-layer d 128 gMLP,
2,000 steps, a checkpoint every 250 kept) — the same workdirs as `studies.sgu_ablation`'s default gating, so
running both trains them once. Score (`zoo.mixers.sgu.toeplitz_score`): the share of ‖W‖² explained by W's
diagonal means, 1 for a Toeplitz matrix, about 2/n for noise (0.031 at n = 64; the demo's W stay there).
Judged by the studies' rule (`decide_threshold`): in every layer, the final score over seeds above THRESHOLD (and
the noise level 2/n), each layer a part, the score at a quarter and half of the steps its history; "not
measurable" whenever the models have not left the unigram plateau (held-out perplexity under half the unigram's).
The paper shows W as a figure; the score measures what the figure shows (how constant W's diagonals are), so it is
taken as the paper's measure.
"""

from __future__ import annotations

from pathlib import Path

import ml_collections
import numpy as np

from mlm_flax.sgu_analysis import load_model, plot_spatial_weights, spatial_weights
from studies import sgu_ablation
from studies.common import NOT_MEASURABLE, plateau_line, result_preset, runs_root, study_main, study_readme, write_study
from studies.mlm_setting import RUNS, setting, train
from studies.verdict import (
    MIN_SEEDS,
    REPRODUCED,
    Arm,
    budget_from_curve,
    combine,
    control,
    decide_threshold,
    failed_controls,
    history_means,
    judged,
    mean_pm_std,
    needed_mean,
    with_budget,
)
from zoo.mixers.sgu import toeplitz_score
from zoo.plots import pyplot, save_figure

THRESHOLD = 0.5


def planned_runs(preset: str, root: Path) -> list[tuple[int, Path, ml_collections.ConfigDict]]:
    """(seed, workdir, config) of every run of the preset: studies.sgu_ablation's split arm."""
    runs = sgu_ablation.planned_runs(preset, root)
    return [(config.seed, workdir, config) for arm, workdir, config in runs if arm == sgu_ablation.SPLIT]


def run(preset: str, out_dir: Path) -> dict:
    runs = planned_runs(preset, runs_root(preset, out_dir, RUNS))
    seeds = [seed for seed, _, _ in runs]
    scores, perplexity = {}, {}
    for seed, workdir, config in runs:
        results = train(config, workdir)
        perplexity[str(seed)] = results["test_perplexity"]
        scores[str(seed)] = {}
        for step in sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()):
            model, _, _ = load_model(workdir, step)
            scores[str(seed)][str(step)] = [toeplitz_score(w) for _, w in spatial_weights(model)]
        if seed == seeds[0]:
            title = f"gMLP W after {step} steps, seed {seed}"
            plot_spatial_weights(spatial_weights(model), out_dir / "toeplitz_weights.png", title)
    result = {
        "seeds": seeds, "scores": scores, "noise_level": 2 / config.model.max_length, "test_perplexity": perplexity,
        "unigram_perplexity": results["unigram_perplexity"], "tiny": preset == "tiny", "preset": preset,
    }  # fmt: skip
    return report(result, out_dir)


def judge(scores: dict[str, dict[int, list[float]]], perplexity: dict[str, float], unigram: float, noise: float):
    """(the verdict, each layer's) (module docstring). `scores`: per seed, each layer's score at every recorded step;
    a layer the rule cannot judge gets the budget its mean score's curve calls for (`budget_from_curve`)."""
    final = {seed: per[max(per)] for seed, per in scores.items()}
    layers = len(next(iter(final.values())))
    # The control: W is read only from models that learned more than word frequencies (held-out perplexity under
    # `plateau_line`), measurably so over the seeds.
    plateau = decide_threshold(Arm("held-out perplexity", tuple(perplexity.values())), plateau_line(unigram),
                               higher_is_better=False, trained=False)  # fmt: skip
    parts = {"the models left the unigram plateau (control)": control(plateau)}
    if (failed := failed_controls(parts)) is not None:
        return failed, parts
    steps = sorted(set.intersection(*(set(per) for per in scores.values())))
    level = max(THRESHOLD, noise)  # above the claim's threshold and above a random W's score
    for i in range(layers):
        arm = Arm(f"layer {i}", tuple(s[i] for s in final.values()))
        curve = [float(np.mean([per[step][i] for per in scores.values()])) for step in steps]
        logged = [list(zip(steps, curve, strict=True))]
        history = history_means(logged) if len(steps) >= 2 else None
        part = decide_threshold(arm, level, higher_is_better=True, history=history)
        # The curve is read where every seed was scored, and ends where the verdict reads the seeds.
        ends_together = all(max(per) == steps[-1] for per in scores.values()) if steps else False
        if part.verdict == NOT_MEASURABLE and len(final) >= MIN_SEEDS and len(steps) >= 2 and ends_together:
            needed = needed_mean(arm, level, higher_is_better=True)
            part = with_budget(part, budget_from_curve(steps, curve, needed, higher_is_better=True, best=1.0))
        parts[f"layer {i}"] = part
    return combine(parts), parts


def report(result: dict, out_dir: Path) -> dict:
    """The verdict (`judge`), the figure and README.md from `result`; returns `result` with the verdict."""
    seeds, preset, unigram = result["seeds"], result_preset(result), result["unigram_perplexity"]
    noise = result["noise_level"]
    scores = {str(seed): {int(step): v for step, v in per.items()} for seed, per in result["scores"].items()}
    perplexity = {str(seed): p for seed, p in result["test_perplexity"].items()}
    final = {seed: per[max(per)] for seed, per in scores.items()}
    verdict, parts = judge(scores, perplexity, unigram, noise)
    measured = ("seeds", "scores", "noise_level", "test_perplexity", "unigram_perplexity", "tiny", "preset")
    mean_final = np.mean(list(final.values()), axis=0).tolist()
    result = {**judged(result, measured, parts, verdict), "final_scores_mean_over_seeds": mean_final}

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for j, per_step in enumerate(scores.values()):
        steps = sorted(per_step)
        layers = np.asarray([per_step[s] for s in steps])
        for layer in range(layers.shape[1]):
            label = f"layer {layer}" if j == 0 else None
            ax.plot(steps, layers[:, layer], color=f"C{layer}", marker="o", alpha=0.8, label=label)
    ax.axhline(noise, color="grey", linestyle=":", label=f"noise ≈ 2/n = {noise:.3f}")
    ax.axhline(THRESHOLD, color="black", linestyle="--", linewidth=0.8, label=f"threshold {THRESHOLD}")
    ax.set(ylim=(0, 1), xlabel="step", ylabel="Toeplitz score of W",
           title="gMLP spatial weights on the KJV, one line per layer and seed")  # fmt: skip
    ax.legend(fontsize=8)
    save_figure(fig, out_dir / "toeplitz.png")

    rows = "\n".join(
        f"| {seed} | {perplexity[seed]:.1f} | " + " | ".join(f"{x:.2f}" for x in final[seed]) + " |" for seed in final
    )
    header = " | ".join(f"layer {i}" for i in range(len(mean_final)))
    return write_study("toeplitz", out_dir, result, study_readme(
        "toeplitz", preset,
        title="Toeplitz-like spatial weights in a gMLP trained on real text",
        claim="(gMLP paper, docs/mixers.md): the spatial weights W a gMLP learns on text are Toeplitz-like — bands "
        "along the diagonal, the same for every position (the paper's figure of W).",
        setting=f"the split gMLP of the shared small MLM setting (`studies/mlm_setting.py`: {setting(preset)}), "
        f"seeds {', '.join(map(str, seeds))}; unigram perplexity {unigram:.1f}, noise level of "
        f"the score 2/n = {noise:.3f}; the claim, per layer: the final score above {THRESHOLD}.",
        table=f"| seed | held-out perplexity | {header} (final Toeplitz score) |\n"
        f"|---|---|{'---|' * len(mean_final)}\n" + rows,
        verdict=f"{verdict.verdict} — {verdict.reason}.",
        notes="" if verdict.verdict == REPRODUCED else "see W (`toeplitz_weights.png`) and the curve per layer.",
    ))  # fmt: skip


CLAIM = "gMLP's spatial weights become Toeplitz-like on text (gMLP)"
PAPER = "qualitative (a figure of W)"


def summary(result: dict) -> str:
    """The README's figures of a committed result.json (studies.table)."""
    final = [per[max(per, key=int)] for per in result["scores"].values()]
    layers = zip(*final, strict=True)
    cells = [mean_pm_std(scores, 2) for scores in layers]
    return f"final Toeplitz score per layer {', '.join(cells)} (claim: > {THRESHOLD}), {len(final)} seeds"


if __name__ == "__main__":
    study_main("toeplitz", __doc__, run, report, runs=RUNS)
