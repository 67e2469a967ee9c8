"""Language modelling on the packed text corpora: `config.task` "mlm" — a `MaskedLM` trained with cross-entropy
on the masked tokens only — or "clm" — a `CausalLM` (decoder) trained to predict every next token."""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import ml_collections
import numpy as np

from mlm_flax import input_pipeline as pipeline
from mlm_flax.configs.pretrain import CONFIG_SECTIONS
from zoo.models import CausalLM, MaskedLM, ModelBuilder
from zoo.text import PAD_ID
from zoo.training import Task, flops, token_cross_entropy

TOKENIZER_FILE = "spm.model"  # the tokenizer's name in the workdir (mlm-finetune and mlm-inspect read it)


def check_lengths(config: ml_collections.ConfigDict) -> None:
    """Sequences must fit the encoder: gMLP's W is max_length × max_length, BERT has max_length positions."""
    if config.data.seq_length > config.model.max_length:
        raise ValueError(
            f"data.seq_length={config.data.seq_length} exceeds model.max_length={config.model.max_length}, the "
            f"spatial size of the SGU's W (mixer {config.model.mixer!r}) / the number of positions; "
            "raise model.max_length or lower data.seq_length"
        )


TASKS = ("mlm", "clm")


def mlm_loss(model, batch, rngs, train):
    """Cross-entropy, accuracy and perplexity over the chosen positions (`mask_weights`) of real rows."""
    del train
    logits = model(batch["inputs"], positions=batch["positions"], rngs=rngs)
    weights = batch["mask_weights"] * batch["weights"][:, None]
    return token_cross_entropy(logits, batch["targets"], weights)


def causal_lm_loss(model, batch, rngs, train):
    """Cross-entropy, accuracy and perplexity of each next token (padding excluded) of real rows."""
    del train
    inputs = batch["inputs"]
    logits = model(inputs, rngs=rngs)[:, :-1]
    targets = inputs[:, 1:]
    weights = (targets != PAD_ID) * batch["weights"][:, None]
    return token_cross_entropy(logits, targets, weights)


def make_task(config: ml_collections.ConfigDict) -> Task:
    if config.task not in TASKS:
        raise ValueError(f"config field task={config.task!r} is unknown here; valid: {', '.join(TASKS)}")
    check_lengths(config)
    causal = config.task == "clm"

    @functools.cache
    def tokenizer():
        return pipeline.load_or_train_tokenizer(config)

    @functools.cache
    def spec():
        return None if causal else pipeline.masking_spec(config, tokenizer()[0])

    @functools.cache
    def prepare() -> dict[str, Path]:
        tok, path = tokenizer()
        spec()  # checks the masking fields and the tokenizer's special symbols before anything is written
        return {split: pipeline.cache_split(config, split, tok, path) for split in ("train", "valid", "test")}

    @functools.cache
    def opened() -> dict[str, tuple]:
        """Every split, opened when training starts: files deleted later are still read at evaluation."""
        return {split: pipeline.open_split(path) for split, path in prepare().items()}

    def final_results(results: dict) -> dict:
        scored = pipeline.next_token_ids(tokenizer()[0]) if causal else spec().ordinary_ids
        counts = {split: opened()[split][1] for split in ("train", "test")}
        return {"unigram_perplexity": pipeline.unigram_perplexity(counts["train"], counts["test"], scored)}

    def batch_spec(batch: int):
        spec = {
            "inputs": jax.ShapeDtypeStruct((batch, config.data.seq_length), np.int32),
            "weights": jax.ShapeDtypeStruct((batch,), np.float32),
        }
        if causal:
            return spec
        p = config.data.max_predictions
        return {
            **spec,
            "positions": jax.ShapeDtypeStruct((batch, p), np.int32),
            "targets": jax.ShapeDtypeStruct((batch, p), np.int32),
            "mask_weights": jax.ShapeDtypeStruct((batch, p), np.float32),
        }

    return Task(
        build_model=ModelBuilder(
            CausalLM if causal else MaskedLM, config.model, dict(vocab_size=lambda: tokenizer()[0].vocab_size)
        ),
        train_batches=lambda: pipeline.train_batches(opened()["train"][0], config, spec()),
        eval_batches=lambda split: pipeline.eval_batches(opened()[split][0], config, spec(), split),
        loss_fn=causal_lm_loss if causal else mlm_loss,
        prepare=prepare,
        batch_spec=batch_spec,
        artifacts=lambda: {TOKENIZER_FILE: tokenizer()[1]},
        final_results=final_results,
        scored="tokens",  # the loss is per masked (or, causal, per next) token
        model_flops=lambda batch: flops.language_model_step_flops(
            config.model,
            batch,
            tokenizer()[0].vocab_size,
            causal=causal,
            predicted=None if causal else batch["positions"].shape[1],
        ),
        config_sections=CONFIG_SECTIONS,
    )
