"""gMLP paper: the learned spatial weights W of a gMLP trained on real text become Toeplitz-like (shift-invariant
bands along the diagonal; the paper's figure of W, docs/mixers.md). Toeplitz score per layer against training steps.

    python -m studies.toeplitz          # reads (or trains) the 2 seeds of the split gMLP of studies.sgu_ablation
    python -m studies.toeplitz --tiny   # 1 seed of 4 steps on a Markov-chain corpus, seconds

The shared setting (`studies.mlm_setting`: KJV, 1k vocabulary, 64-token sequences, 4-layer d 128 gMLP,
2,000 steps, a checkpoint every 250 kept) — the same workdirs as `studies.sgu_ablation`'s default gating, so
running both trains them once. Score (`zoo.mixers.sgu.toeplitz_score`): the share of ‖W‖² explained by W's
diagonal means, 1 for a Toeplitz matrix, about 2/n for noise (0.031 at n = 64; the demo's W stay there).
Reproduced if, having left the unigram plateau (held-out perplexity well below the unigram's), the final W
score at least 0.5 in every layer on average over seeds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlm_flax.sgu_analysis import load_model, plot_spatial_weights, spatial_weights
from studies.common import study_main, study_readme, write_study
from studies.mlm_setting import RUNS, mlm_config, train
from zoo.mixers.sgu import toeplitz_score
from zoo.plots import pyplot, save_figure

THRESHOLD = 0.5


def checkpoint_steps(workdir: Path) -> list[int]:
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def run(tiny: bool, out_dir: Path) -> dict:
    seeds = [0] if tiny else [0, 1]
    root = out_dir / "runs" if tiny else RUNS
    scores, perplexity = {}, {}
    for seed in seeds:
        workdir = root / f"gmlp-split_multiplicative-seed{seed}"
        config = mlm_config("gmlp", seed, tiny, root, sgu_variant="split_multiplicative")
        results = train(config, workdir)
        perplexity[seed] = results["test_perplexity"]
        scores[seed] = {}
        for step in checkpoint_steps(workdir):
            model, _, _ = load_model(workdir, step)
            scores[seed][step] = [toeplitz_score(w) for _, w in spatial_weights(model)]
        if seed == seeds[0]:
            title = f"gMLP W after {step} steps, seed {seed}"
            plot_spatial_weights(spatial_weights(model), out_dir / "toeplitz_weights.png", title)
    unigram = results["unigram_perplexity"]
    n = config.model.max_length
    final = {seed: s[max(s)] for seed, s in scores.items()}
    mean_final = np.mean([final[seed] for seed in seeds], axis=0).tolist()  # per layer
    left_plateau = float(np.mean(list(perplexity.values()))) < 0.5 * unigram
    toeplitz_like = float(np.mean(mean_final)) >= THRESHOLD
    verdict = "reproduced" if left_plateau and toeplitz_like else "not reproduced"
    result = {
        "seeds": seeds, "scores": {str(k): {str(s): v for s, v in d.items()} for k, d in scores.items()},
        "final_scores_mean_over_seeds": mean_final, "noise_level": 2 / n, "test_perplexity": perplexity,
        "unigram_perplexity": unigram, "left_plateau": left_plateau, "verdict": verdict, "tiny": tiny,
    }  # fmt: skip

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for seed, per_step in scores.items():
        steps = sorted(per_step)
        layers = np.asarray([per_step[s] for s in steps])
        for layer in range(layers.shape[1]):
            label = f"layer {layer}" if seed == seeds[0] else None
            ax.plot(steps, layers[:, layer], color=f"C{layer}", marker="o", alpha=0.8, label=label)
    ax.axhline(2 / n, color="grey", linestyle=":", label=f"noise ≈ 2/n = {2 / n:.3f}")
    ax.set_ylim(0, 1)
    ax.set_xlabel("step")
    ax.set_ylabel("Toeplitz score of W")
    ax.set_title("gMLP spatial weights on the KJV, one line per layer and seed")
    ax.legend(fontsize=8)
    save_figure(fig, out_dir / "toeplitz.png")

    rows = "\n".join(
        f"| {seed} | {perplexity[seed]:.1f} | " + " | ".join(f"{x:.2f}" for x in final[seed]) + " |" for seed in seeds
    )
    header = " | ".join(f"layer {i}" for i in range(len(mean_final)))
    readme = study_readme(
        "toeplitz", tiny,
        title="Toeplitz-like spatial weights in a gMLP trained on real text",
        claim="(gMLP paper, docs/mixers.md): the spatial weights W a gMLP learns on text are Toeplitz-like — bands "
        "along the diagonal, the same for every position (the paper's figure of W).",
        setting="the split gMLP of the shared small MLM setting (`studies/mlm_setting.py`"
        + (", tiny: a Markov-chain corpus, 4 steps" if tiny else ": KJV, 1k vocabulary, 64 tokens, 4 layers d 128, "
           "2,000 steps") + f"), seeds {', '.join(map(str, seeds))}; unigram perplexity {unigram:.1f}, noise level of "
        f"the score 2/n = {2 / n:.3f}.",
        table=f"| seed | held-out perplexity | {header} (final Toeplitz score) |\n"
        f"|---|---|{'---|' * len(mean_final)}\n" + rows,
        verdict=f"{verdict} (left the unigram plateau: {left_plateau}; mean final score "
        f"{np.mean(mean_final):.2f} against {THRESHOLD}).",
        figure="toeplitz.png",
        notes="" if verdict == "reproduced" else "see W (`toeplitz_weights.png`) and the curve per layer.",
    )  # fmt: skip
    write_study(out_dir, result, readme)
    return result


if __name__ == "__main__":
    study_main("toeplitz", __doc__, run)
