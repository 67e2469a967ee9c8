"""gMLP paper: aMLP's tiny attention helps where alignment across positions matters (docs/mixers.md). gMLP, aMLP and
a Transformer of matched size on a task that needs it and on one that does not, both masked LM.

    python -m studies.amlp_alignment          # 3 encoders × 2 tasks × 3 seeds, ~4–5 h on 2 CPU cores
    python -m studies.amlp_alignment --gpu    # copy 2,500 steps of batch 128 (the CPU preset's 320,000 sequences),
                                              # KJV 5,000 of batch 64, one H100
    python -m studies.amlp_alignment --tiny   # 3 encoders × 2 tasks × 1 seed of 4 steps, seconds

Needs alignment — *copy*: every document is a random sequence of m words (m uniform in 5 … 25, 200 made-up
words) written twice. A masked word in the second copy is known from the same position of the first, but that
position is m tokens back and m changes from document to document (documents are packed into 64-token
sequences), so a fixed token-mixing matrix W cannot point at it; content-based attention can. Does not —
*KJV*: the shared small MLM setting (`studies.mlm_setting`), where local, position-relative context is what
predicts. Encoders: the `mlm_flax` demo presets (gMLP 4 layers, aMLP 3 layers with a 64-wide one-head
attention in the gate, BERT 3 layers; d 128, matched in size as in the paper). Measured: held-out perplexity,
judged in three parts (`judge`). Each finished run's perplexities are recorded in the output folder's runs.jsonl
(studies.common.Ledger).
"""

from __future__ import annotations

import functools
import math
import random
from pathlib import Path

import ml_collections
import numpy as np

from studies.common import (
    LEDGER,
    NOT_MEASURABLE,
    Ledger,
    left_the_plateau,
    plateau_line,
    result_preset,
    runs_root,
    study_main,
    study_readme,
    write_study,
)
from studies.mlm_setting import RUNS, SEEDS, budget, held_out_at, mlm_config, train
from studies.verdict import (
    MIN_SEEDS,
    REPRODUCED,
    Arm,
    Verdict,
    combine,
    control,
    decide,
    decide_threshold,
    failed_controls,
    gap_budget,
    judged,
    mean_pm_std,
    mean_std,
    with_budget,
)
from zoo.parameter_counts import parameter_counts, total
from zoo.plots import pyplot, save_figure

TRANSFORMER = "Transformer (BERT)"
SMALLEST_EFFECT = 0.02  # of gMLP's perplexity (and of log perplexity for the gains): a gap smaller does not matter
ARCHS = {"gMLP": "gmlp", "aMLP": "amlp", TRANSFORMER: "bert"}
# The Transformer starts to copy after ~4,000 steps of batch 32 (held-out perplexity 145 → 119 by step 4,000, then
# 101, 72, 44 at 5k, 6k, 8k; 36 at 10k, on a corpus of 60,000 documents): 1,000 steps could not carry the control.
COPY_STEPS = {"tiny": 4, "cpu": 10_000, "gpu": 2500}
# The copy runs' batch where it is not the setting's (studies/mlm_setting.py): the `gpu` preset trains on as many
# sequences as the CPU preset's (2,500 × 128 = 10,000 × 32) in fewer, larger steps, to fit its 8 minutes.
COPY_BATCH = {"tiny": None, "cpu": None, "gpu": 128}
# Training documents of the copy corpus: enough that 10,000 steps do not see one twice.
COPY_DOCUMENTS = {"tiny": 200, "cpu": 60_000, "gpu": 60_000}


def copy_corpus(d: Path, docs: tuple[tuple[str, int], ...], words: int = 200, seed: int = 0):
    """`d/{split}.txt`: documents "w1 … wm w1 … wm", m uniform in 5 … 25 (the `text` source's layout)."""
    rng = random.Random(seed)
    syllables = ["ba", "ke", "lo", "mi", "nu", "pa", "ri", "so", "tu", "ve", "xa", "zo"]
    vocab = sorted({"".join(rng.choice(syllables) for _ in range(3)) for _ in range(3 * words)})[:words]
    d.mkdir(parents=True, exist_ok=True)
    for split, n in docs:
        lines = []
        for _ in range(n):
            seq = [rng.choice(vocab) for _ in range(rng.randint(5, 25))]
            lines.append(" ".join(seq + seq) + "\n\n")
        (d / f"{split}.txt").write_text("".join(lines))


def copy_dir(preset: str, root: Path) -> Path:
    """Where the preset's copy corpus is written (named by its size, so that a smaller one is never reused)."""
    return root / f"copy-corpus-{COPY_DOCUMENTS[preset]}"


def config_for(task: str, arch: str, seed: int, preset: str, root: Path):
    tiny = preset == "tiny"
    if task == "KJV":
        return mlm_config(arch, seed, preset, root)
    config = mlm_config(arch, seed, preset, root, steps=COPY_STEPS[preset])
    if COPY_BATCH[preset]:
        config.train.batch_size = COPY_BATCH[preset]
    corpus = copy_dir(preset, root)
    config.data.update(
        source="text", dir=str(corpus), cache_dir=str(corpus.with_name(f"{corpus.name}-cache")),
        vocab_size=120 if tiny else 300,
    )  # fmt: skip
    return config


def judge(
    perplexity: dict[str, dict[str, list[float]]], unigram: dict[str, float], half: dict | None = None
) -> tuple[Verdict, dict, str]:
    """(verdict, each part's, what may explain it) from the held-out perplexities per task, encoder and seed.

    The parts: (1) the control — the Transformer learns to copy, its perplexity measurably below half the unigram
    (an encoder that copies predicts a masked word from its other occurrence: far below the unigram, a lenient bar).
    (2) aMLP beats gMLP on copy — gMLP may stay at chance there (that is the claim); part 1 stands for the task being
    learnable. (3) The gain is about alignment: aMLP's per-seed log perplexity ratio to gMLP larger on copy than on
    KJV, where both must be past the unigram. `half`: the held-out perplexities at each run's half-way checkpoint
    (None where it was not there to read) and "steps": the half-way step per task, for part 2's budget."""
    arm = lambda task, name: Arm(f"{name} on {task}", tuple(perplexity[task][name]))
    level = dict(higher_is_better=False, trained=False)
    learned = control(decide_threshold(arm("copy", TRANSFORMER), plateau_line(unigram["copy"]), **level))
    parts = {"the Transformer learns to copy (control)": learned}
    if learned.verdict != REPRODUCED:
        means = {name: float(np.mean(p)) for name, p in perplexity["copy"].items()}
        copied = [name for name, m in means.items() if left_the_plateau(m, unigram["copy"])]
        if len(perplexity["copy"][TRANSFORMER]) < MIN_SEEDS:
            note = f"the rule needs {MIN_SEEDS} seeds per arm; this result has {len(perplexity['copy'][TRANSFORMER])}."
        elif not copied:
            note = (
                f"no encoder learned to copy (best mean {min(means.values()):.1f} against a unigram "
                f"{unigram['copy']:.1f}; copying would give about {unigram['copy'] ** 0.5:.0f}), the Transformer "
                f"included, so the copy task cannot show what aMLP's attention adds. It would take longer copy "
                f"training (or shorter documents, or a smaller vocabulary) until the Transformer copies, then the "
                f"same comparison."
            )
        else:
            note = (
                f"{', '.join(copied)} learned to copy (mean below half the unigram {unigram['copy']:.1f}) but not "
                f"measurably the Transformer, the control: {learned.reason}."
            )
        return failed_controls(parts), parts, note + _kjv_note(perplexity["KJV"], unigram["KJV"])
    copy_half = half and None not in half["copy"]["aMLP"] + half["copy"]["gMLP"]  # the budgets' half-way points
    gmlp_copy = float(np.mean(perplexity["copy"]["gMLP"]))
    lower = dict(higher_is_better=False, smallest_effect=SMALLEST_EFFECT * gmlp_copy)
    beats = decide(arm("copy", "aMLP"), arm("copy", "gMLP"), **lower)
    if beats.verdict == NOT_MEASURABLE and copy_half:
        # The budget, from the gap's curve: each encoder's mean at the half-way checkpoint and at the end.
        curve = {name: [float(np.mean(half["copy"][name])), float(np.mean(perplexity["copy"][name]))]
                 for name in ("aMLP", "gMLP")}  # fmt: skip
        steps = [half["steps"]["copy"], 2 * half["steps"]["copy"]]
        beats = with_budget(beats, gap_budget(arm("copy", "aMLP"), arm("copy", "gMLP"), steps, curve["aMLP"],
                                              curve["gMLP"], **lower))  # fmt: skip
    parts["aMLP beats gMLP on copy"] = beats
    gains = {
        task: tuple(math.log(g / a) for g, a in zip(perplexity[task]["gMLP"], perplexity[task]["aMLP"], strict=True))
        for task in ("copy", "KJV")
    }
    off_chance = [
        v for name in ("gMLP", "aMLP")
        if (v := decide_threshold(arm("KJV", name), unigram["KJV"], **level)).verdict != REPRODUCED
    ]  # fmt: skip
    gain_arms = [Arm(f"log(gMLP / aMLP) on {task}", gains[task]) for task in ("copy", "KJV")]
    more = off_chance[0] if off_chance else decide(*gain_arms, higher_is_better=True, smallest_effect=SMALLEST_EFFECT)
    if more.verdict == NOT_MEASURABLE and not off_chance and copy_half:
        # The budget, from copy's gain at its half-way checkpoint and at the end; KJV's gain is held at its end value
        # (`measure` reads the half-way checkpoint of the copy runs only).
        half_gain = float(np.mean([math.log(g / a) for g, a in zip(half["copy"]["gMLP"], half["copy"]["aMLP"],
                                                                   strict=True)]))  # fmt: skip
        kjv = float(np.mean(gains["KJV"]))
        steps = [half["steps"]["copy"], 2 * half["steps"]["copy"]]
        note = gap_budget(*gain_arms, steps, [half_gain, float(np.mean(gains["copy"]))], [kjv, kjv],
                          higher_is_better=True, smallest_effect=SMALLEST_EFFECT)  # fmt: skip
        if note is not None:
            more = with_budget(more, f"{note}, in copy's steps (KJV's gain held at its end value)")
    parts["aMLP gains more over gMLP on copy than on KJV"] = more
    verdict = combine(parts)
    return verdict, parts, "" if verdict.verdict == REPRODUCED else _kjv_note(perplexity["KJV"], unigram["KJV"])


def _kjv_note(perplexity: dict[str, list[float]], unigram: float) -> str:
    """A note when the Transformer is not yet a reference on KJV (mean perplexities over seeds): on the plateau, or
    over twice the perplexity of the better gMLP-type encoder (a masked-LM Transformer here spends ~1,300 steps on
    the unigram plateau, `studies.ffn_memory`'s docstring)."""
    kjv = {name: float(np.mean(p)) for name, p in perplexity.items()}
    transformer, best_mlp = kjv[TRANSFORMER], min(kjv["gMLP"], kjv["aMLP"])
    if left_the_plateau(transformer, unigram) and transformer <= 2 * best_mlp:
        return ""
    return (
        f" On KJV the Transformer is far behind ({transformer:.1f} against a unigram {unigram:.1f}) where gMLP "
        f"and aMLP reach {kjv['gMLP']:.1f} and {kjv['aMLP']:.1f}: a masked-LM Transformer of this size spends "
        f"most of its budget on the unigram plateau here, so it is not yet the reference the claim compares with."
    )


def planned_runs(preset: str, root: Path) -> list[tuple[str, str, Path, ml_collections.ConfigDict]]:
    """(task, encoder, workdir, config) of every run of the preset, in order."""
    runs = []
    for task in ("copy", "KJV"):
        for name, arch in ARCHS.items():
            for seed in SEEDS[preset]:
                # KJV's gMLP is studies.sgu_ablation's default-gating run: the same workdir, trained once.
                suffix = "-split_multiplicative" if arch == "gmlp" and task == "KJV" else ""
                workdir = root / (f"{arch}{suffix}-seed{seed}" if task == "KJV" else f"copy-{arch}-seed{seed}")
                runs.append((task, name, workdir, config_for(task, arch, seed, preset, root)))
    return runs


def measure(config: ml_collections.ConfigDict, workdir: Path, task: str) -> dict:
    """What the study reads of a run (trained, or resumed, unless finished): its held-out and unigram perplexity,
    and on copy (the comparison a budget is read for) the held-out perplexity at its half-way checkpoint."""
    results = train(config, workdir)
    return {"test_perplexity": results["test_perplexity"], "unigram_perplexity": results["unigram_perplexity"],
            **(half_way(config, workdir) if task == "copy" else {})}  # fmt: skip


def half_way(config: ml_collections.ConfigDict, workdir: Path) -> dict:
    """{"test_perplexity_half": the held-out perplexity at the run's checkpoint of half its steps}; empty where that
    checkpoint is not on this machine (a run recorded elsewhere)."""
    step = config.train.steps // 2
    if not (workdir / "checkpoints" / str(step)).exists():
        return {}
    return {"test_perplexity_half": held_out_at(config, workdir, step)["perplexity"]}


def run(preset: str, out_dir: Path) -> dict:
    perplexity: dict[str, dict[str, list[float]]] = {task: {name: [] for name in ARCHS} for task in ("copy", "KJV")}
    unigram, parameters = {}, {}
    root = runs_root(preset, out_dir, RUNS)
    corpus = copy_dir(preset, root)
    if not (corpus / "test.txt").exists():  # written once, before the first copy run reads it
        held_out = 20 if preset == "tiny" else 300
        copy_corpus(corpus, docs=(("train", COPY_DOCUMENTS[preset]), ("valid", held_out), ("test", held_out)))
    ledger = Ledger(out_dir / LEDGER, root)
    half = {task: {name: [] for name in ARCHS} for task in ("copy", "KJV")}
    half_steps = {}
    runs = planned_runs(preset, root)
    for task, name, workdir, config in runs:
        results = ledger.run(workdir, config, functools.partial(measure, config, workdir, task))
        if task == "copy" and "test_perplexity_half" not in results and (amended := half_way(config, workdir)):
            results = ledger.amend(workdir, amended)  # recorded before the study read the half-way checkpoint
        perplexity[task][name].append(results["test_perplexity"])
        half[task][name].append(results.get("test_perplexity_half"))
        half_steps[task] = config.train.steps // 2
        parameters[name] = total(parameter_counts(config.model))
        unigram[task] = results["unigram_perplexity"]
    result = {
        "seeds": SEEDS[preset], "test_perplexity": perplexity, "unigram_perplexity": unigram,
        "test_perplexity_half": {**half, "steps": half_steps},
        "encoder_parameters": parameters, "tiny": preset == "tiny", "preset": preset,
        "copy_steps": COPY_STEPS[preset], "copy_documents": COPY_DOCUMENTS[preset],
        "copy_batch": next(config.train.batch_size for task, _, _, config in runs if task == "copy"),
    }  # fmt: skip
    return report(result, out_dir)


def report(result: dict, out_dir: Path) -> dict:
    """The verdict (`judge`), the figure and README.md from the perplexities in `result`."""
    seeds, preset, unigram = result["seeds"], result_preset(result), result["unigram_perplexity"]
    perplexity, parameters = result["test_perplexity"], result["encoder_parameters"]
    tiny = preset == "tiny"
    mean = {task: {name: float(np.mean(p)) for name, p in per.items()} for task, per in perplexity.items()}
    verdict, parts, notes = judge(perplexity, unigram, result.get("test_perplexity_half"))
    measured = ("seeds", "test_perplexity", "unigram_perplexity", "encoder_parameters", "tiny", "preset", "copy_steps",
                "copy_documents", "copy_batch", "test_perplexity_half")  # fmt: skip
    result = {**judged(result, measured, parts, verdict), "mean_test_perplexity": mean}

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for ax, task in zip(axes, ("copy", "KJV"), strict=True):
        names = list(ARCHS)
        ax.bar(names, [mean[task][n] for n in names], color=["C0", "C1", "C2"])
        ax.errorbar(names, [mean[task][n] for n in names], yerr=[mean_std(perplexity[task][n])[1] for n in names],
                    fmt="none", color="black", capsize=3)  # fmt: skip
        ax.axhline(unigram[task], color="grey", linestyle=":", label="unigram")
        ax.set(yscale="log", title=f"{task}: held-out perplexity")
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out_dir / "amlp_alignment.png")

    cell = lambda p: mean_pm_std(p, 2)
    rows = "\n".join(
        f"| {name} | {parameters[name]:,} | {cell(perplexity['copy'][name])} | {cell(perplexity['KJV'][name])} |"
        for name in ARCHS
    )
    kjv_steps, batch = budget(preset)
    return write_study("amlp_alignment", out_dir, result, study_readme(
        "amlp_alignment", preset,
        title="aMLP's tiny attention where alignment across positions matters",
        claim="(gMLP paper, docs/mixers.md): gMLP's fixed spatial projection falls short where a task needs alignment "
        "across positions; aMLP's single 64-wide attention head in the gate closes the gap to a Transformer.",
        setting=("tiny: Markov and copy corpora, 4 steps" if tiny else f"copy (words repeated at a varying distance, "
        f"{result['copy_steps']:,} steps of batch {result.get('copy_batch', batch)}, {result['copy_documents']:,} "
        f"training documents) and KJV (`studies/mlm_setting.py`, {kjv_steps:,} steps of batch {batch}), "
        "64-token sequences, the `mlm_flax` demo encoders") + f"; seeds {', '.join(map(str, seeds))}; unigram "
        f"perplexity copy {unigram['copy']:.1f}, KJV {unigram['KJV']:.1f}.",
        table="| encoder | encoder parameters | copy: held-out perplexity | KJV: held-out perplexity "
        "(mean ± std over seeds) |\n|---|---|---|---|\n" + rows,
        verdict=f"{verdict.verdict} — {verdict.reason}.",
        notes=notes,
    ))  # fmt: skip


CLAIM = "aMLP's tiny attention helps where alignment across positions matters (gMLP)"
PAPER = "qualitative (aMLP closes the gap to a Transformer)"


def summary(result: dict) -> str:
    """The README's figures of a committed result.json (studies.table)."""
    perplexity, unigram = result["test_perplexity"], result["unigram_perplexity"]
    cell = lambda task: " / ".join(mean_pm_std(perplexity[task][n], 1) for n in ARCHS)
    return (
        f"perplexity gMLP / aMLP / Transformer: copy {cell('copy')} (unigram {unigram['copy']:.0f}), KJV "
        f"{cell('KJV')} (unigram {unigram['KJV']:.0f}), {len(result['seeds'])} seeds"
    )


if __name__ == "__main__":
    study_main("amlp_alignment", __doc__, run, report, runs=RUNS)
