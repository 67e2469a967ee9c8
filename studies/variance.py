"""ReLUFormer's variance claim: at initialisation the output variance of plain ReLU attention grows with the
number of keys n, softmax's shrinks, and ReLU with the 1/√(n/2) factor stays flat (docs/mixers.md).

    python -m studies.variance          # n = 16 … 16,384, about a minute on 2 CPU cores
    python -m studies.variance --gpu    # n = 16 … 65,536, 8 draws, one H100
    python -m studies.variance --tiny   # n = 16 … 256, seconds

q, k, v ~ N(0, 1) per entry (head dim 64, so s = q·k/√64 ~ N(0, 1)), one head, every key visible. Var(out)
is the variance of every output entry, averaged over draws. Predicted log–log slopes against n: plain ReLU
+1 (Var ≈ n/2), softmax −1 (Var ≈ Σ p² ≈ e/n), ReLU with the factor 0 (Var ≈ 1), ReLU/L −1 (Var ≈ 1/(2n)),
ReLA 0 (its RMSNorm output gate rescales every row to unit RMS; taken here per head vector, ε 1e-8).
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import kernels
from studies.common import study_main, study_readme, write_study
from zoo.plots import pyplot, save_figure

HEAD_DIM = 64
PREDICTED_SLOPE = {"softmax": -1.0, "relu (no factor)": 1.0, "relu (ReLUFormer factor)": 0.0, "relu_l": -1.0,
                   "rela": 0.0}  # fmt: skip
SLOPE_TOLERANCE = 0.15
XLA = kernels.ReluAttentionOptions(impl="xla")


def attend(kind: str, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """The attention operator `kind` on `[1, T, 1, D]` inputs, every key visible."""
    if kind == "softmax":
        return jax.nn.dot_product_attention(q, k, v)
    if kind == "rela":
        out = kernels.relu_attention(q, k, v, row_scale="none", options=XLA)
        return out * jax.lax.rsqrt(jnp.mean(out * out, axis=-1, keepdims=True) + 1e-8)
    row_scale = {"relu (no factor)": "none", "relu (ReLUFormer factor)": "sqrt_half", "relu_l": "count"}[kind]
    return kernels.relu_attention(q, k, v, row_scale=row_scale, options=XLA)


def output_variance(kind: str, n: int, *, queries: int, draws: int) -> float:
    """Var(out) over every entry of `queries` query rows attending to n keys, averaged over `draws` draws."""
    total = 0.0
    for draw in range(draws):
        kq, kk, kv = jax.random.split(jax.random.key(1000 * draw + n), 3)
        q = jax.random.normal(kq, (1, queries, 1, HEAD_DIM))
        k = jax.random.normal(kk, (1, n, 1, HEAD_DIM))
        v = jax.random.normal(kv, (1, n, 1, HEAD_DIM))
        total += float(jnp.var(attend(kind, q, k, v)))
    return total / draws


def run(preset: str, out_dir: Path) -> dict:
    tiny = preset == "tiny"
    lengths = {"tiny": [16, 64, 256], "cpu": [16, 64, 256, 1024, 4096, 16384]}.get(preset, [4**i for i in range(2, 9)])
    queries, draws = {"tiny": (16, 1), "cpu": (128, 4)}.get(preset, (128, 8))
    variances = {kind: [output_variance(kind, n, queries=queries, draws=draws) for n in lengths]
                 for kind in PREDICTED_SLOPE}  # fmt: skip
    slopes = {kind: float(np.polyfit(np.log(lengths), np.log(var), 1)[0]) for kind, var in variances.items()}
    off = {kind: abs(slopes[kind] - PREDICTED_SLOPE[kind]) for kind in slopes}
    reproduced = all(x <= SLOPE_TOLERANCE for x in off.values())
    verdict = "reproduced" if reproduced else "not reproduced"
    result = {
        "lengths": lengths, "queries": queries, "draws": draws, "head_dim": HEAD_DIM, "variance": variances,
        "fitted_slope": slopes, "predicted_slope": PREDICTED_SLOPE, "slope_tolerance": SLOPE_TOLERANCE,
        "verdict": verdict, "tiny": tiny, "preset": preset,
    }  # fmt: skip

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for kind, var in variances.items():
        (line,) = ax.loglog(lengths, var, "o-", label=f"{kind}: slope {slopes[kind]:+.2f}")
        predicted = var[0] * (np.asarray(lengths) / lengths[0]) ** PREDICTED_SLOPE[kind]
        ax.loglog(lengths, predicted, "--", color=line.get_color(), alpha=0.5)
    ax.set_xlabel("keys n")
    ax.set_ylabel("Var(attention output) at initialisation")
    ax.set_title("Output variance vs n (dashed: predicted slope)")
    ax.legend(fontsize=8)
    save_figure(fig, out_dir / "variance.png")

    rows = "\n".join(
        f"| {kind} | {PREDICTED_SLOPE[kind]:+.0f} | {slopes[kind]:+.3f} | "
        + " / ".join(f"{x:.3g}" for x in (variances[kind][0], variances[kind][-1]))
        + " |"
        for kind in PREDICTED_SLOPE
    )
    readme = study_readme(
        "variance", preset,
        title="Variance of attention outputs at initialisation (ReLUFormer)",
        claim="(ReLUFormer, docs/mixers.md): the output variance of plain ReLU attention grows with the number of keys "
        "n, softmax's shrinks, and the 1/√(n/2) factor keeps ReLU attention's flat.",
        setting=f"q, k, v ~ N(0, 1), head dim {HEAD_DIM}, n = {', '.join(map(str, lengths))}, {queries} queries × "
        f"{draws} draws per point, the project's kernels (`kernels.relu_attention`, impl \"xla\") and "
        "`jax.nn.dot_product_attention`.",
        table=f"| operator | predicted slope | fitted slope | Var at n = {lengths[0]} / {lengths[-1]} |\n"
        f"|---|---|---|---|\n{rows}",
        verdict=f"{verdict} (every fitted log–log slope within ±{SLOPE_TOLERANCE} of the prediction).",
        figure="variance.png",
    )  # fmt: skip
    write_study(out_dir, result, readme)
    return result


CLAIM = "ReLU attention's output variance grows with n, softmax's shrinks, 1/√(n/2) keeps it flat (ReLUFormer)"
PAPER = "slopes +1, −1, 0 (Var ≈ n/2, ≈ e/n, ≈ 1)"


def summary(result: dict) -> str:
    """The README's figures of a committed result.json (studies.table)."""
    s = result["fitted_slope"]
    return (
        f"slopes {s['relu (no factor)']:+.3f}, {s['softmax']:+.3f}, {s['relu (ReLUFormer factor)']:+.3f} "
        f"(n {result['lengths'][0]:,}–{result['lengths'][-1]:,}, {result['draws']} draws)"
    )


if __name__ == "__main__":
    study_main("variance", __doc__, run)
