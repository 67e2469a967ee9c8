"""`lra-compare` sweeps: which LRA tasks, which mixer variants, which seeds (lra_flax/compare.py runs them).

Presets (after the colon):

  demo          Every LRA task's CPU demo model and data × softmax, relu, relu_l, linear (elu1, favor, glu),
                gmlp × 2 seeds: 70 cells, each trained for fewer steps than `make demo-*` and evaluated on at
                most 1,024 examples per split (DEMO_CUTS), so that the sweep and its 1K–4K efficiency table
                finish in about two hours on 2 CPU cores.
                  lra-compare --config=lra_flax/configs/compare.py:demo --workdir=runs/compare
                Expected: every task but Pathfinder above its majority rate for every mixer; Pathfinder at
                chance (50%) for all — it needs far longer training than any CPU sweep gives it.
  kernel_paper  The kernel paper's rows (linear kernel, 1×/2× GLU, orthogonal linear, 1×/2× OGLU, 3× AOGLU,
                and softmax) on Text, Retrieval and ListOps with the LRA code's settings, 5 seeds.
                Hardware: GPU or TPU hosts; split with --shard=i/n.
  lra           The LRA code's settings on all six tasks for softmax, relu, linear (elu1, favor) and gmlp.
  efficiency    The efficiency table alone: Text `lra_code` (batch 32) at 1K–16K for every main variant.
  efficiency_cpu  The demo's efficiency table for softmax, relu and linear only (2 CPU cores, ~5 minutes):
                  lra-compare --config=lra_flax/configs/compare.py:efficiency_cpu --workdir=runs/efficiency-cpu
                  Expected at 4K: linear ≥ 3× softmax's steps/s at ≤ 0.25× its memory; relu faster than softmax.

Efficiency: `efficiency.task` at each of `efficiency.lengths`, every variant, `efficiency.steps` timed train
steps in a process of its own (out of memory there is recorded as such); demo: the Text demo model at 1K–4K.

A task entry is `label: "config_module:preset"` (Path-X is `pathfinder:pathx`); a variant is a mixer name and
its option overrides; `overrides` apply to every cell and `task_overrides.<task>` to that task's cells,
nested as the task config is ({"train": {"steps": 10}} is --config.train.steps=10 on lra-train).
"""

from __future__ import annotations

import ml_collections

from lra_flax.tasks import REGISTRY, reported_by, with_demo
from zoo.config_fields import (
    SECTION,
    TEXT,
    Field,
    Rule,
    above,
    integer,
    integers,
    is_section,
    mapping_of,
    nested,
    section,
)
from zoo.mixers.registry import MAX_LENGTH

PRESETS = ("demo", "kernel_paper", "lra", "efficiency", "efficiency_cpu")

DEMO_TASKS = {name: REGISTRY[name].config_spec("demo") for name in with_demo()}
LRA_TASKS = {name: spec.config_spec() for name, spec in REGISTRY.items()}

# The `demo` sweep cuts each task's demo preset (`TaskSpec.demo_cut`: train steps, evaluated batches per split):
# 70 cells at ~75 s each on 2 CPU cores. Softmax at 1,024 tokens (Image, Pathfinder) runs 0.3–0.7 steps/s there
# and evaluation of a full split can cost more than the training, hence the caps (Image: 512 of the 10,000
# test images; Retrieval: 1,024 of 1,492; Pathfinder: 256 of 400; ListOps and Text: every example). A cap reads
# the first batches of a split, which is fair only where the split is in random order (checked for these).
DEMO_CUTS = {name: dict(REGISTRY[name].demo_cut) for name in with_demo()}


def variant(mixer: str, **options) -> dict:
    return {"mixer": mixer, "options": options}


MAIN_VARIANTS = {
    "softmax": variant("softmax"),
    "relu": variant("relu"),
    "relu_l": variant("relu_l"),
    "linear_elu1": variant("linear", feature_map="elu1"),
    "linear_favor": variant("linear", feature_map="favor"),
    "linear_glu": variant("linear", feature_map="glu"),
    "gmlp": variant("gmlp"),
}
KERNEL_PAPER_VARIANTS = {
    "softmax": variant("softmax"),
    "linear_kernel": variant("linear", feature_map="softplus", kernel_depth=1),
    "glu_1x": variant("linear", feature_map="glu", kernel_depth=1),
    "glu_2x": variant("linear", feature_map="glu", kernel_depth=2),
    "orth_linear": variant("linear", feature_map="orth_softplus", kernel_depth=1),
    "oglu_1x": variant("linear", feature_map="oglu", kernel_depth=1),
    "oglu_2x": variant("linear", feature_map="oglu", kernel_depth=2),
    "aoglu_3x": variant("linear", feature_map="aoglu", kernel_depth=3),
}


# "config_module:preset" of a task config under lra_flax/configs; whether that module and preset exist is the
# cell's check (lra_flax/compare.py), the efficiency task's is the sweep's.
PRESET_SPEC = Rule(
    lambda x: isinstance(x, str) and all(x.partition(":")[::2]),
    "must be 'config_module:preset' (a file under lra_flax/configs and one of its presets, e.g. 'listops:demo')",
    "'module:preset'",
)
VARIANT = Rule(
    lambda x: (
        is_section(x)
        and isinstance(x.get("mixer"), str)
        and set(x.keys()) <= {"mixer", "options"}
        and (x.get("options") is None or is_section(x["options"]))
    ),
    "must be {'mixer': MIXER, 'options': {OPTION: value}}: a mixer name and its option overrides",
    "{'mixer', 'options'}",
)

# The sweep config's own fields: the defaults `get_config` starts from and what lra-compare validates before any
# cell runs (the mixers and fields the cells set are each cell's check).
SWEEP_FIELDS = (
    Field(
        "tasks", {}, mapping_of(PRESET_SPEC, "must map task labels to 'config_module:preset'"), "task label: its preset"
    ),
    Field(
        "variants",
        {},
        mapping_of(VARIANT, "must map at least one variant name to {'mixer': MIXER, 'options': {...}}", empty=False),
        "variant name: {'mixer': MIXER, 'options': {OPTION: value}}, each run on every task and seed",
    ),
    Field("seeds", [], integers(0, empty=True, distinct=True), "the seeds of every (task, variant) cell"),
    Field("overrides", {}, SECTION, "fields set on every cell, nested as the task config is"),
    Field("task_overrides", {}, mapping_of(SECTION, "must map task labels to sections"), "task label: its fields"),
    Field("preset", "sweep", TEXT, "the sweep's name, the reports' title"),
    nested(
        "efficiency",
        (
            Field("task", "text:lra_code", PRESET_SPEC, "the task config whose train step is timed"),
            Field("lengths", [], integers(1, MAX_LENGTH, empty=True, distinct=True), "lengths timed (empty: none)"),
            Field("steps", 3, integer(1), "timed train steps after compilation and warm-up"),
            Field("warmup", 1, integer(0), "untimed train steps after compilation"),
            Field("timeout_s", 1800, above(0), "seconds an entry may take before it is recorded as timed out"),
            Field("overrides", {}, SECTION, "fields set on the efficiency task's config, nested as it is"),
        ),
        "the efficiency table: every variant's train steps/s and memory at each length",
    ),
)


def get_config(preset: str = "demo") -> ml_collections.ConfigDict:
    if preset not in PRESETS:
        raise ValueError(f"unknown compare preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    efficiency = {}  # the efficiency table's changes from its declared defaults (empty lengths: no table)
    if preset == "demo":
        tasks, variants, seeds = DEMO_TASKS, MAIN_VARIANTS, [0, 1]
        # 2 CPU cores: the Text demo model (2 layers, d 64) at 1K–4K bytes, batch 4.
        efficiency.update(task="text:demo", lengths=[1000, 2000, 3000, 4000], overrides={"train": {"batch_size": 4}})
    elif preset == "efficiency":
        tasks, variants, seeds = {}, MAIN_VARIANTS, []
        efficiency.update(lengths=[1000, 2000, 3000, 4000, 8000, 16000])
    elif preset == "efficiency_cpu":
        tasks, seeds = {}, []
        variants = {k: MAIN_VARIANTS[k] for k in ("softmax", "relu", "linear_elu1")}
        efficiency.update(task="text:demo", lengths=[1000, 2000, 3000, 4000], overrides={"train": {"batch_size": 4}})
    elif preset == "kernel_paper":
        tasks = {name: LRA_TASKS[name] for name in reported_by("kernel paper")}
        variants, seeds = KERNEL_PAPER_VARIANTS, [0, 1, 2, 3, 4]
    else:
        tasks = LRA_TASKS
        variants = {k: MAIN_VARIANTS[k] for k in ("softmax", "relu", "linear_elu1", "linear_favor", "gmlp")}
        seeds = [0]
    variants = {name: dict(v) for name, v in variants.items()}
    config = section(SWEEP_FIELDS, preset=preset, tasks=dict(tasks), variants=variants, seeds=list(seeds))
    config.task_overrides = {name: {} for name in tasks}
    if preset == "demo":
        for name, cut in DEMO_CUTS.items():
            # Warm-up stays 10% of training; one checkpoint half-way (resume) and one at the end.
            steps = cut["steps"]
            config.task_overrides[name] = {
                "train": {**cut, "warmup_steps": steps // 10, "checkpoint_every": steps // 2, "eval_every": 0}
            }
    config.efficiency.update(efficiency)
    return config
