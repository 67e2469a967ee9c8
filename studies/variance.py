"""ReLUFormer's variance claim: at initialisation the output variance of plain ReLU attention grows with the
number of keys n, softmax's shrinks, and ReLU with the 1/√(n/2) factor stays flat (docs/mixers.md).

    python -m studies.variance          # n = 16 … 16,384, 4 draws, about a minute on 2 CPU cores
    python -m studies.variance --gpu    # n = 16 … 65,536, 8 draws, one H100
    python -m studies.variance --tiny   # n = 16 … 256, 3 draws, seconds

q, k, v ~ N(0, 1) per entry (head dim 64, so s = q·k/√64 ~ N(0, 1)), one head, every key visible. Var(out)
is the variance of every output entry of one draw; a log–log slope is fitted per draw, and the verdict rule
(studies/verdict.py, `decide_within`) reads the draws as its seeds. The three ReLU rows share their draws (the
factor and ReLU/L rescale by functions of n alone), so their slopes' spreads are one measurement's, not three.
Predicted log–log slopes against n: plain ReLU +1 (Var ≈ n/2), softmax −1 (Var ≈ Σ p² ≈ e/n), ReLU with the factor
0 (Var ≈ 1), ReLU/L −1 (Var ≈ 1/(2n)), ReLA 0 (its RMSNorm output gate rescales every row to unit RMS; taken here per
head vector, ε 1e-8).
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import kernels
from studies.common import gpu_work_seconds, study_main, study_readme, write_study
from studies.verdict import ALPHA, Arm, combine, decide_within, judged, mean_pm_std, mean_std
from zoo.plots import pyplot, save_figure

HEAD_DIM = 64
PREDICTED_SLOPE = {"softmax": -1.0, "relu (no factor)": 1.0, "relu (ReLUFormer factor)": 0.0, "relu_l": -1.0,
                   "rela": 0.0}  # fmt: skip
SLOPE_TOLERANCE = 0.15
XLA = kernels.ReluAttentionOptions(impl="xla")
MEASURED = ("lengths", "queries", "draws", "head_dim", "variance", "fitted_slope", "slope_per_draw",
            "predicted_slope", "slope_tolerance", "tiny", "preset")  # fmt: skip


def attend(kind: str, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """The attention operator `kind` on `[1, T, 1, D]` inputs, every key visible."""
    if kind == "softmax":
        return jax.nn.dot_product_attention(q, k, v)
    if kind == "rela":
        out = kernels.relu_attention(q, k, v, row_scale="none", options=XLA)
        return out * jax.lax.rsqrt(jnp.mean(out * out, axis=-1, keepdims=True) + 1e-8)
    row_scale = {"relu (no factor)": "none", "relu (ReLUFormer factor)": "sqrt_half", "relu_l": "count"}[kind]
    return kernels.relu_attention(q, k, v, row_scale=row_scale, options=XLA)


def output_variance(kind: str, n: int, *, queries: int, draw: int) -> float:
    """Var(out) over every entry of `queries` query rows attending to n keys, for one draw of q, k and v."""
    kq, kk, kv = jax.random.split(jax.random.key(1000 * draw + n), 3)
    q = jax.random.normal(kq, (1, queries, 1, HEAD_DIM))
    k = jax.random.normal(kk, (1, n, 1, HEAD_DIM))
    v = jax.random.normal(kv, (1, n, 1, HEAD_DIM))
    return float(jnp.var(attend(kind, q, k, v)))


# Per preset: the key counts n, the query rows and the draws (the rule's seeds).
SETTINGS = {
    "tiny": ([16, 64, 256], 16, 3),
    "cpu": ([16, 64, 256, 1024, 4096, 16384], 128, 4),
    "gpu": ([4**i for i in range(2, 9)], 128, 8),
}


def planned_gpu_seconds() -> float:
    """The `gpu` preset on one H100: a program per operator and n, called once per draw."""
    lengths, _, draws = SETTINGS["gpu"]
    programs = len(PREDICTED_SLOPE) * len(lengths)
    return gpu_work_seconds(programs=programs, dispatches=programs * draws)


def run(preset: str, out_dir: Path) -> dict:
    tiny = preset == "tiny"
    lengths, queries, draws = SETTINGS[preset]
    # One log–log slope per draw: the draws are the seeds over which the verdict rule reads the spread.
    per_draw = {kind: [[output_variance(kind, n, queries=queries, draw=d) for n in lengths] for d in range(draws)]
                for kind in PREDICTED_SLOPE}  # fmt: skip
    variances = {kind: np.mean(v, axis=0).tolist() for kind, v in per_draw.items()}
    draw_slopes = {kind: [float(np.polyfit(np.log(lengths), np.log(var), 1)[0]) for var in v]
                   for kind, v in per_draw.items()}  # fmt: skip
    slopes = {kind: mean_std(v)[0] for kind, v in draw_slopes.items()}
    parts = {
        f"{kind}: slope {slope:+.0f} ± {SLOPE_TOLERANCE}": decide_within(
            Arm(f"{kind} slope", tuple(draw_slopes[kind])), slope - SLOPE_TOLERANCE, slope + SLOPE_TOLERANCE
        )
        for kind, slope in PREDICTED_SLOPE.items()
    }
    verdict = combine(parts)
    result = judged(
        {
            "lengths": lengths, "queries": queries, "draws": draws, "head_dim": HEAD_DIM, "variance": variances,
            "fitted_slope": slopes, "slope_per_draw": draw_slopes, "predicted_slope": PREDICTED_SLOPE,
            "slope_tolerance": SLOPE_TOLERANCE, "tiny": tiny, "preset": preset,
        },
        MEASURED, parts, verdict,
    )  # fmt: skip

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for kind, var in variances.items():
        (line,) = ax.loglog(lengths, var, "o-", label=f"{kind}: slope {slopes[kind]:+.2f}")
        predicted = var[0] * (np.asarray(lengths) / lengths[0]) ** PREDICTED_SLOPE[kind]
        ax.loglog(lengths, predicted, "--", color=line.get_color(), alpha=0.5)
    ax.set(xlabel="keys n", ylabel="Var(attention output) at initialisation",
           title="Output variance vs n (dashed: predicted slope)")  # fmt: skip
    ax.legend(fontsize=8)
    save_figure(fig, out_dir / "variance.png")

    rows = "\n".join(
        f"| {kind} | {PREDICTED_SLOPE[kind]:+.0f} | {mean_pm_std(draw_slopes[kind], 3, signed=True)} | "
        + " / ".join(f"{x:.3g}" for x in (variances[kind][0], variances[kind][-1]))
        + " |"
        for kind in PREDICTED_SLOPE
    )
    return write_study("variance", out_dir, result, study_readme(
        "variance", preset,
        title="Variance of attention outputs at initialisation (ReLUFormer)",
        claim="(ReLUFormer, docs/mixers.md): the output variance of plain ReLU attention grows with the number of keys "
        "n, softmax's shrinks, and the 1/√(n/2) factor keeps ReLU attention's flat.",
        setting=f"q, k, v ~ N(0, 1), head dim {HEAD_DIM}, n = {', '.join(map(str, lengths))}, {queries} queries × "
        f"{draws} draws per point, the project's kernels (`kernels.relu_attention`, impl \"xla\") and "
        "`jax.nn.dot_product_attention`.",
        table=f"| operator | predicted slope | fitted slope (mean ± std over draws) | Var at n = {lengths[0]} / "
        f"{lengths[-1]} |\n"
        f"|---|---|---|---|\n{rows}",
        verdict=f"{verdict.verdict} under the rule of studies/verdict.py (each fitted log–log slope inside "
        f"±{SLOPE_TOLERANCE} of the prediction by both one-sided t-tests over {draws} draws at α {ALPHA:g}): "
        f"{verdict.reason}.",
    ))  # fmt: skip


CLAIM = "ReLU attention's output variance grows with n, softmax's shrinks, 1/√(n/2) keeps it flat (ReLUFormer)"
PAPER = "slopes +1, −1, 0 (Var ≈ n/2, ≈ e/n, ≈ 1)"


def summary(result: dict) -> str:
    """The README's figures of a committed result.json (studies.table)."""
    kinds = ("relu (no factor)", "softmax", "relu (ReLUFormer factor)")
    if "slope_per_draw" in result:
        slopes = ", ".join(mean_pm_std(result["slope_per_draw"][k], 3, signed=True) for k in kinds)
    else:  # recorded before the slopes were fitted per draw
        slopes = ", ".join(f"{result['fitted_slope'][k]:+.3f}" for k in kinds)
    return f"slopes {slopes} (n {result['lengths'][0]:,}–{result['lengths'][-1]:,}, {result['draws']} draws)"


if __name__ == "__main__":
    study_main("variance", __doc__, run)
