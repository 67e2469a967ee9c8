"""ReLUFormer: "plain ReLU attention without the variance-reduction factor trains unstably; the factor fixes it"
(docs/mixers.md). Measured as the largest learning rate each attention trains at without diverging, in the
paper's kind of block (post-LayerNorm, no gradient clipping), three seeds each.

    python -m studies.stability          # 3 arms × 3 seeds up the learning rates 1e-3 … 6.4e-2: ~3.5 min a run on
                                         # 2 CPU cores, up to 63 runs (~4 h) when nothing diverges
    python -m studies.stability --gpu    # d 256 (MLP 1,024), 300 steps, learning rates 2e-3 … 0.128 ×4 apart,
                                         # one H100
    python -m studies.stability --tiny   # 1 seed, two learning rates of 4 steps on short inputs, seconds

The `lra-train` ListOps demo model (2 layers, d 128, 4 heads) with post-LN blocks (`model.norm="post"`: LN(x +
f(x)), the original Transformer's and fairseq's, whose residual stream is not normalised before the mixer) and
no gradient clipping (`train.grad_clip_norm=0`), AdamW with a cosine schedule, on expressions of 512–1,024 tokens
(the paper's instability is a long-sequence effect: at initialisation plain ReLU attention's output variance grows
with the number of keys n, `studies.variance`). An earlier version trained pre-LN blocks with clipping at one
learning rate (1e-3): no arm diverged, every model stayed near chance, and the claim could not show.

Each (arm, seed) climbs the learning-rate grid ×2 at a time from LEARNING_RATES[0] and stops at the first that
diverges: a non-finite loss (the loop refuses to checkpoint it and stops) or a logged loss above twice the
chance level ln 10 after warm-up. Its measure is the number of grid steps it climbed without diverging (0: only
the first; −1: not even the first; the top of the grid when nothing diverged, a lower bound). Judged by the
studies' rule (`judge`): first the controls — each ReLU arm learned the task at its largest stable learning rate
(a model at chance that does not diverge shows nothing about stability) — then the factor's arm against plain ReLU,
higher is better, Welch's test with one grid step the smallest effect; softmax is the reference, outside the
verdict. The grid must bracket both arms: one that stays stable at the top only gains (its true figure is higher),
but one that diverges at the first learning rate in any seed is below the grid, and the verdict is "not
measurable" until the grid reaches lower. Seeds change the initialisation and the batch order; the data is the
same. Each finished run's summary is recorded in the output folder's runs.jsonl (studies.common.Ledger).
"""

from __future__ import annotations

import math
from pathlib import Path

import ml_collections

from lra_flax.tasks import make_task
from lra_flax.tasks.listops import held_out_majority_rate, train_label_entropy
from studies.common import (
    LEDGER,
    NOT_MEASURABLE,
    Ledger,
    arm_folder,
    listops_config,
    logged_metrics,
    result_preset,
    runs_root,
    study_main,
    study_readme,
    write_study,
)
from studies.verdict import Arm, Verdict, control, decide, failed_controls, judged, learned, mean_pm_std
from zoo.plots import pyplot, save_figure
from zoo.training import train_and_evaluate

ARMS = {"relu, 1/√(n/2)": ("relu", True), "relu, no factor": ("relu", False), "softmax": ("softmax", None)}
CLAIMED, PLAIN = "relu, 1/√(n/2)", "relu, no factor"
LEARNING_RATES = (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2)
# The `gpu` grid: ×4 a step from 2e-3 to twice the CPU grid's top, where nothing diverged on 2 CPU cores.
GRIDS = {"tiny": LEARNING_RATES[:2], "cpu": LEARNING_RATES, "gpu": (2e-3, 8e-3, 3.2e-2, 1.28e-1)}
RUNS = Path("runs/studies/stability-lr")
DIVERGED_LOSS = 2 * math.log(10)  # twice the chance-level loss of 10 balanced classes
STEPS, WARMUP = 150, 15
GPU_STEPS, GPU_WARMUP = 300, 30


def arm_dir(root: Path, arm: str, seed: int, learning_rate: float = LEARNING_RATES[0]) -> Path:
    """The workdir of one run (by default at the `cpu` grid's first learning rate)."""
    return root / arm_folder(*ARMS[arm]) / f"lr{learning_rate:g}" / f"seed{seed}"


def config_for(arm: str, seed: int, preset: str, data_dir: Path, learning_rate: float = LEARNING_RATES[0]):
    config = listops_config(seed, data_dir, *ARMS[arm])
    config.model.norm = "post"
    config.train.grad_clip_norm = 0.0
    config.train.learning_rate = learning_rate
    if preset == "tiny":
        config.data.generator.update(num_train=64, num_valid=16, num_test=16, min_length=20, max_length=64)
        config.model.max_length = 64
        config.train.update(steps=4, log_every=2, eval_every=0, checkpoint_every=4, warmup_steps=1, batch_size=8)
        config.train.eval_batch_size = 8
        return config
    config.data.generator.update(
        num_train=4000, num_valid=200, num_test=500, min_length=512, max_length=1024, max_depth=10, max_args=10
    )
    config.model.max_length = 1024
    config.train.update(
        steps=STEPS, log_every=10, eval_every=0, checkpoint_every=STEPS, warmup_steps=WARMUP, batch_size=16
    )
    config.train.eval_batch_size = 50
    if preset == "gpu":
        config.model.update(d_model=256, mlp_dim=1024)
        config.train.update(steps=GPU_STEPS, checkpoint_every=GPU_STEPS, warmup_steps=GPU_WARMUP)
    return config


def has_diverged(train: list[dict], warmup_steps: int) -> bool:
    """A logged loss after warm-up that is non-finite or above twice the chance level."""
    return any(not math.isfinite(m["loss"]) or m["loss"] > DIVERGED_LOSS for m in train if m["step"] > warmup_steps)


def diverged(run: dict, warmup_steps: int) -> bool:
    """Whether a run's summary (its logged steps and losses, the loop's error) counts as diverged."""
    train = [{"step": step, "loss": loss} for step, loss in zip(run["steps"], run["loss"], strict=True)]
    return run["error"] is not None or has_diverged(train, warmup_steps)


def train_one(arm: str, seed: int, learning_rate: float, preset: str, root: Path) -> dict:
    """One run (resumed if its workdir has one): its logged curves, test accuracy and whether it diverged."""
    workdir = arm_dir(root, arm, seed, learning_rate)
    config = config_for(arm, seed, preset, root / "data", learning_rate)
    try:
        results, error = train_and_evaluate(config, workdir, make_task(config)), None
    except FloatingPointError as e:  # the loop stops at a non-finite loss and keeps the last good state
        results, error = {}, str(e).split(";")[0]
    train = logged_metrics(workdir, "train") if (workdir / "metrics.jsonl").exists() else []
    summary = {
        "learning_rate": learning_rate,
        "steps": [m["step"] for m in train],
        "loss": [m["loss"] for m in train],
        "grad_norm": [m["grad_norm"] for m in train],
        "test_accuracy": results.get("test_accuracy"),
        "test_top_prediction_share": results.get("test_top_prediction_share"),
        # The controls' reference points: the held-out split's majority class, the training labels' entropy.
        "majority_rate": held_out_majority_rate(config),
        "label_entropy": train_label_entropy(config),
        "error": error,
    }
    return {**summary, "diverged": diverged(summary, config.train.warmup_steps)}


def recorded_run(arm: str, seed: int, learning_rate: float, preset: str, root: Path, ledger: Ledger) -> dict:
    """`train_one`'s summary as `ledger` recorded it, else trained and recorded there; judged by the divergence rule
    as it stands, not as it stood when the run was recorded."""
    config = config_for(arm, seed, preset, root / "data", learning_rate)
    workdir = arm_dir(root, arm, seed, learning_rate)
    recorded = ledger.run(workdir, config, lambda: train_one(arm, seed, learning_rate, preset, root))
    return {**recorded, "diverged": diverged(recorded, config.train.warmup_steps)}


def climb(arm: str, seed: int, preset: str, root: Path, ledger: Ledger) -> list[dict]:
    """The runs of one (arm, seed) up the grid, ending with the first that diverged (or at the top)."""
    runs = []
    for learning_rate in GRIDS[preset]:
        runs.append(recorded_run(arm, seed, learning_rate, preset, root, ledger))
        if runs[-1]["diverged"]:
            break
    return runs


def stable_steps(runs: list[dict]) -> int:
    """Grid steps climbed without diverging: the index of the last stable learning rate (−1: none was)."""
    return sum(not r["diverged"] for r in runs) - 1


def grid_steps_climbed(runs: dict[str, list[list[dict]]]) -> dict[str, list[int]]:
    """Each arm's `stable_steps` per seed, from a result's runs (arm → seed → runs up the grid)."""
    return {arm: [stable_steps(r) for r in per_seed] for arm, per_seed in runs.items()}


def seeds_of(preset: str) -> list[int]:
    return list(range(1) if preset == "tiny" else range(3))


def planned_runs(preset: str, root: Path) -> list[ml_collections.ConfigDict]:
    """The config of every run the preset may train: the whole grid for every (arm, seed) — the most it takes,
    when nothing diverges."""
    return [
        config_for(arm, seed, preset, root / "data", learning_rate)
        for arm in ARMS
        for seed in seeds_of(preset)
        for learning_rate in GRIDS[preset]
    ]


def run(preset: str, out_dir: Path) -> dict:
    root = runs_root(preset, out_dir, RUNS)
    ledger = Ledger(out_dir / LEDGER, root)
    runs = {arm: [climb(arm, seed, preset, root, ledger) for seed in seeds_of(preset)] for arm in ARMS}
    recorded = [r for per_arm in runs.values() for per_seed in per_arm for r in per_seed]
    first = next((r for r in recorded if "label_entropy" in r), None)
    if first is None:  # every run recorded before its summary held them: the data every run reads
        config = config_for(CLAIMED, 0, preset, root / "data")
        first = {"majority_rate": held_out_majority_rate(config), "label_entropy": train_label_entropy(config)}
    result = {
        "seeds": seeds_of(preset), "learning_rates": list(GRIDS[preset]), "runs": runs,
        "majority_rate": first["majority_rate"], "label_entropy": first["label_entropy"], "tiny": preset == "tiny",
        "preset": preset,
    }  # fmt: skip
    return report(result, out_dir)


def at_largest_stable_rate(per_seed: list[list[dict]]) -> list[dict]:
    """Each seed's run at the largest learning rate it trained at without diverging (none for a seed below the grid)."""
    return [stable[-1] for runs in per_seed if (stable := [r for r in runs if not r["diverged"]])]


def judge(result: dict) -> tuple[Verdict, dict[str, Verdict]]:
    """The verdict and its parts (module docstring): the controls first, then the factor's arm climbing more grid
    steps than plain ReLU's."""
    learning_rates, runs = result["learning_rates"], result["runs"]
    parts = {}
    for arm in (CLAIMED, PLAIN):
        stable = at_largest_stable_rate(runs[arm])
        if len(stable) < len(runs[arm]):  # a seed below the grid has no stable model whose accuracy could be read
            below = len(runs[arm]) - len(stable)
            why = f"{below} seed(s) of {arm} diverged at the grid's first learning rate {learning_rates[0]:g}"
            part = control(Verdict(NOT_MEASURABLE, f"{why}: the grid must reach lower"))
        else:
            accuracies, losses = [r["test_accuracy"] for r in stable], [r["loss"][-1] for r in stable]
            shares = [r.get("test_top_prediction_share") for r in stable]  # absent from runs recorded before it
            part = learned(arm, accuracies, result["majority_rate"], None if None in shares else shares,
                           last_losses=losses, label_entropy=result["label_entropy"])  # fmt: skip
        parts[f"{arm} learned the task at its largest stable learning rate (control)"] = part
    climbed = grid_steps_climbed(runs)
    top = len(learning_rates) - 1
    # Both arms at the top in every seed: two lower bounds, whose gap (0) says nothing; the reason says why. (Plain
    # ReLU at the top with the factor's arm below it is a real gap: plain's true figure is only higher.)
    if all(c == top for c in climbed[PLAIN] + climbed[CLAIMED]):
        beyond = f"{learning_rates[-1] * 2:g}, {learning_rates[-1] * 4:g}, …"
        gpu = (f" (the `gpu` preset: d 256, {GPU_STEPS} steps, learning rates up to {GRIDS['gpu'][-1]:g})"
               if result_preset(result) == "cpu" else "")  # fmt: skip
        comparison = Verdict(
            NOT_MEASURABLE,
            f"no seed of either ReLU arm diverged up to the grid's top learning rate {learning_rates[-1]:g}: the grid "
            "brackets neither (both figures are lower bounds), so plain ReLU showed no instability for the factor to "
            f"fix at this budget; budget: the grid continued beyond its top ({beyond}), or a setting in which plain "
            f"ReLU diverges{gpu}",
        )
    else:
        arms = {arm: Arm(arm, tuple(map(float, c))) for arm, c in climbed.items()}
        # One grid step (×2 the learning rate) is the smallest difference the grid can show; a largest stable rate
        # is read once per run, not along it.
        comparison = decide(arms[CLAIMED], arms[PLAIN], higher_is_better=True, smallest_effect=1.0, trained=False)
    parts["the factor raises the largest stable learning rate"] = comparison
    controls = {name: part for name, part in parts.items() if part.control}
    if (failed := failed_controls(controls)) is None:
        return comparison, parts
    # The comparison is said too (what the grid showed), but cannot carry the verdict.
    return Verdict(failed.verdict, f"{failed.reason}; the comparison: {comparison.reason}"), parts


def report(result: dict, out_dir: Path) -> dict:
    """The verdict, the figure and README.md from the runs in `result`."""
    if "learning_rates" not in result:
        raise ValueError("this result.json was recorded at one learning rate, before the sweep: run the study again")
    if "majority_rate" not in result or "label_entropy" not in result:
        raise ValueError(
            "this result.json has no majority_rate or label_entropy (the controls' reference points): run the study "
            "again"
        )
    seeds, learning_rates, runs = result["seeds"], result["learning_rates"], result["runs"]
    preset = result_preset(result)
    climbed = grid_steps_climbed(runs)
    verdict, parts = judge(result)
    measured = ("seeds", "learning_rates", "runs", "majority_rate", "label_entropy", "tiny", "preset")
    result = judged(result, measured, parts, verdict)
    result["grid_steps_climbed"] = climbed
    top = len(learning_rates) - 1

    def lr_at(steps: int) -> str:
        bound = " (top: a lower bound)" if steps == top else ""
        return "none" if steps < 0 else f"{learning_rates[steps]:g}{bound}"

    def last_loss(r: dict) -> float:  # a diverged run's loss, drawn at the top of the plot
        loss = r["loss"][-1] if r["loss"] else math.inf
        return min(loss, 2 * DIVERGED_LOSS) if math.isfinite(loss) else 2 * DIVERGED_LOSS

    def accuracy(run: dict) -> str:
        return f"{100 * run['test_accuracy']:.1f}%"

    def diverged_at(per_seed: list[dict]) -> str:
        return f"{per_seed[-1]['learning_rate']:g}" if per_seed[-1]["diverged"] else "—"

    inputs = "short" if preset == "tiny" else "512–1,024-token"
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.8, 4.2))
    for colour, arm in zip(("C0", "C3", "C2"), ARMS, strict=True):
        for i, per_seed in enumerate(runs[arm]):
            xs = [r["learning_rate"] for r in per_seed]
            ys = [last_loss(r) for r in per_seed]
            ax.plot(xs, ys, "-o", color=colour, alpha=0.7, label=arm if i == 0 else None)
            for x, y, r in zip(xs, ys, per_seed, strict=True):
                if r["diverged"]:
                    ax.plot([x], [y], "x", color=colour, markersize=10)
    ax.axhline(DIVERGED_LOSS, color="grey", linestyle=":", label="diverged above (2 ln 10)")
    ax.set(xscale="log", xlabel="learning rate", ylabel="last logged training loss (× : diverged)",
           title=f"Post-LN, no clipping, {inputs} ListOps: one line per seed")  # fmt: skip
    ax.legend(fontsize=8)
    save_figure(fig, out_dir / "stability.png")

    rows = "\n".join(
        f"| {arm} | {', '.join(lr_at(c) for c in climbed[arm])} | "
        f"{mean_pm_std(climbed[arm], 2)} | "
        f"{', '.join(diverged_at(r) for r in runs[arm])} | "
        f"{', '.join(accuracy(r) for r in at_largest_stable_rate(runs[arm])) or '—'} |"
        for arm in ARMS
    )
    config = config_for("softmax", 0, preset, Path("data"))
    model, train = config.model, config.train
    return write_study("stability", out_dir, result, study_readme(
        "stability", preset,
        title="Training stability of ReLU attention with and without the variance-reduction factor",
        claim="(ReLUFormer, docs/mixers.md): plain ReLU attention without the 1/√(n/2) factor trains unstably on long "
        "inputs; the factor fixes it.",
        setting=f"ListOps demo model ({model.num_layers} layers, d {model.d_model}, MLP {model.mlp_dim}, "
        f"{model.num_heads} heads) with post-LN blocks and no gradient clipping, AdamW "
        f"(cosine), {inputs} expressions, batch {train.batch_size}, {train.steps} steps per run, learning rates "
        f"{', '.join(f'{x:g}' for x in learning_rates)} climbed until the first divergence, seeds "
        f"{', '.join(map(str, seeds))}. Diverged: a non-finite loss, or a loss above 2 ln 10 after warm-up. "
        "The measure: grid steps climbed without diverging (−1: none), mean ± std over seeds (n − 1).",
        table="| attention | largest stable learning rate (per seed) | grid steps climbed | diverged at | test "
        f"accuracy there (majority class {100 * result['majority_rate']:.1f}%) |\n|---|---|---|---|---|\n" + rows,
        verdict=f"{verdict.verdict} — {verdict.reason}. Softmax is the reference, outside the verdict.",
    ))  # fmt: skip


CLAIM = "plain ReLU attention trains unstably; the 1/√(n/2) factor fixes it (ReLUFormer)"
PAPER = "qualitative (divergence without the factor)"


def summary(result: dict) -> str:
    """The README's figures of a committed result.json (studies.table), also of one recorded before the sweep."""
    if "learning_rates" not in result:
        runs = sum(len(arm["final_loss"]) for arm in result["summary"].values())
        diverged = sum(arm["divergences"] for arm in result["summary"].values())
        return f"{diverged} divergences in {runs} pre-LN runs at one learning rate (recorded before the sweep)"
    climbed = grid_steps_climbed(result["runs"])
    return (
        "grid steps climbed: "
        + ", ".join(f"{arm} {mean_pm_std(c, 1)}" for arm, c in climbed.items())
        + f", {len(result['seeds'])} seeds"
    )


if __name__ == "__main__":
    study_main("stability", __doc__, run, report, runs=RUNS)
