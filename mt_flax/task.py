"""The translation task: an encoder-decoder trained with token-level cross-entropy, scored by decoding."""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from mt_flax import bleu
from mt_flax import data as mt_data
from mt_flax import input_pipeline as pipeline
from mt_flax.configs.translation import CONFIG_SECTIONS, DECODE_FIELDS
from zoo import config_fields
from zoo.files import as_path, atomic_write_bytes
from zoo.models import EncoderDecoder, ModelBuilder
from zoo.models.decoding import compile_translate, translate
from zoo.progress import WorkProgress
from zoo.text import BOS_ID, EOS_ID, PAD_ID, load_tokenizer
from zoo.training import Task, flops, memory, token_cross_entropy
from zoo.training.config import read_run_config
from zoo.training.state import restore_model


def build_model(config: ml_collections.ConfigDict, vocab_size: int, rngs: nnx.Rngs) -> EncoderDecoder:
    return EncoderDecoder(config.model, src_vocab=vocab_size, tgt_vocab=vocab_size, rngs=rngs)


def decode_settings(config: ml_collections.ConfigDict) -> dict:
    """The keywords of `zoo.models.decoding.translate` that the config's decode section sets."""
    dec = config.decode
    return dict(
        beam_size=dec.beam_size, length_penalty=dec.length_penalty, length_penalty_form=dec.length_penalty_form,
        max_length_a=dec.max_length_a, max_length_b=dec.max_length_b, max_length=config.model.max_length,
        bos_id=BOS_ID, eos_id=EOS_ID,
    )  # fmt: skip


def translate_ids(model, config, sources: list[np.ndarray], *, limit_batch: int | None = None) -> list[np.ndarray]:
    """Decodes token-id sources (each ending in EOS) in length-sorted batches; returns ids in input order."""
    rows = limit_batch or config.decode.batch_size
    order = np.argsort([len(s) for s in sources], kind="stable")
    out: list[np.ndarray | None] = [None] * len(sources)
    bar = WorkProgress(f"decoding (beam {config.decode.beam_size})", total=len(sources), unit="sentences")
    for start in range(0, len(order), rows):
        chunk = order[start : start + rows]
        src = np.full((rows, source_bucket(config, max(len(sources[i]) for i in chunk))), PAD_ID, np.int32)
        for r, i in enumerate(chunk):
            src[r, : len(sources[i])] = sources[i]
        tokens = np.asarray(jax.device_get(translate(model, jnp.asarray(src), **decode_settings(config))))
        for r, i in enumerate(chunk):
            out[i] = tokens[r]
        bar.update(len(chunk))
    bar.close()
    return out  # type: ignore[return-value]


def source_bucket(config: ml_collections.ConfigDict, length: int) -> int:
    """The padded source length a batch whose longest source has `length` tokens is decoded at."""
    buckets = pipeline.bucket_lengths(config.model.max_length)
    return buckets[int(np.searchsorted(buckets, length))]


def check_decode_fits(model, config: ml_collections.ConfigDict, longest_source: int) -> None:
    """Refuses decoding that needs more memory than a device has (XLA's memory analysis of the decode step for
    a full batch at the longest source's bucket), before any sentence is decoded."""
    length = source_bucket(config, longest_source)
    src = jax.ShapeDtypeStruct((config.decode.batch_size, length), jnp.int32)
    need = memory.step_bytes(compile_translate(model, src, **decode_settings(config)))
    limit, source = memory.device_memory_limit(config.train)
    if limit is not None and need > limit:
        raise ValueError(
            f"decoding {config.decode.batch_size} sentences of up to {length} tokens with beam "
            f"{config.decode.beam_size} needs {need / 2**30:,.2f} GiB per device (XLA's memory analysis), more than "
            f"the {limit / 2**30:,.2f} GiB of {source}: lower decode.batch_size or the beam size "
            "(train.device_memory_gib overrides the limit). Nothing was decoded."
        )


def check_decode(config: ml_collections.ConfigDict) -> None:
    """The decode section against its declaration (mt_flax/configs/translation.py), every problem named."""
    found = config_fields.problems(config.decode, DECODE_FIELDS, "decode")
    if found:
        raise ValueError("invalid config: " + "; ".join(found))


def make_task(config: ml_collections.ConfigDict) -> Task:
    @functools.cache
    def tokenizer():
        return pipeline.load_or_train_tokenizer(config)

    @functools.cache
    def prepare() -> dict[str, Path]:
        pipeline.check_data(config)  # before the tokenizer is trained and train is cached
        tok, path = tokenizer()
        return {split: pipeline.cache_split(config, split, tok, path) for split in mt_data.SPLITS}

    @functools.cache
    def opened() -> dict[str, pipeline.CachedSplit]:
        """Every split, opened when training starts: files deleted later are still read at evaluation."""
        return {split: pipeline.open_split(path, scored=split != "train") for split, path in prepare().items()}

    def loss_fn(model, batch, rngs, train):
        logits = model(batch["src"], batch["tgt_in"], rngs=rngs)
        weights = (batch["tgt_out"] != PAD_ID) * batch["weights"][:, None]
        smoothing = config.train.label_smoothing if train else 0.0
        return token_cross_entropy(logits, batch["tgt_out"], weights, label_smoothing=smoothing)

    def generate_eval(model, split: str, workdir: Path | None) -> dict[str, float | str]:
        """BLEU/chrF of beam-search output with sacreBLEU's signatures; at the end, also {split}.{hyp,ref}.txt."""
        held_out = opened()[split]
        records, refs, pairs = held_out.records, held_out.references, held_out.pairs
        count = len(refs) if workdir is not None or not config.decode.valid_examples else config.decode.valid_examples
        count = min(count, len(refs))
        tok = tokenizer()[0]
        ids = translate_ids(model, config, [records[i]["src"] for i in range(count)])
        hyps = [tok.decode(x) for x in ids]
        scores = bleu.score(hyps, refs[:count])
        if workdir is not None and jax.process_index() == 0:
            for name, lines in (("hyp", hyps), ("ref", refs[:count])):
                atomic_write_bytes(workdir / f"{split}.{name}.txt", "".join(x + "\n" for x in lines).encode("utf-8"))
            if pairs["dropped"]:  # a score of part of the split: said where the score is read
                print(
                    f"{split}: BLEU and chrF of {count} of {pairs['pairs']} sentence pairs; {pairs['dropped']} longer "
                    "than model.max_length were left out (data.too_long='filter')",
                    flush=True,
                )
        # Documents (data.doc_length) score whole examples; "pairs" counts the corpus's sentence pairs.
        return {**scores, "examples_scored": count, "pairs_dropped": pairs["dropped"]}

    def batch_spec(batch: int):
        # A token-sized batch: at max_length it holds the fewest rows and the most tokens per row.
        rows = batch or pipeline.rows_for(
            config.model.max_length, max_tokens=config.data.max_tokens, row_multiple=config.data.row_multiple
        )
        shape = (rows, config.model.max_length)
        spec = {k: jax.ShapeDtypeStruct(shape, np.int32) for k in ("src", "tgt_in", "tgt_out")}
        return {**spec, "weights": jax.ShapeDtypeStruct((rows,), np.float32)}

    def vocab_size() -> int:  # read when the model is built, after the data is prepared
        return tokenizer()[0].vocab_size

    return Task(
        build_model=ModelBuilder(EncoderDecoder, config.model, dict(src_vocab=vocab_size, tgt_vocab=vocab_size)),
        train_batches=lambda: pipeline.train_batches(opened()["train"], config),
        eval_batches=lambda split: pipeline.eval_batches(opened()[split], config),
        loss_fn=loss_fn,
        count_tokens=lambda b: int(np.count_nonzero(b["src"]) + np.count_nonzero(b["tgt_out"])),
        model_flops=lambda b: flops.encoder_decoder_step_flops(config.model, b, tokenizer()[0].vocab_size),
        prepare=prepare,
        batch_spec=batch_spec,
        # The tokenizer's name in the workdir, where `load_run` looks for it.
        artifacts=lambda: {"spm.model" if tokenizer()[1].suffix == ".model" else "vocab.txt": tokenizer()[1]},
        generate_eval=generate_eval,
        final_results=final_results,
        row_multiple=config.data.row_multiple,
        scored="tokens",  # the loss is per target token
        config_sections=CONFIG_SECTIONS,
    )


def final_results(results: dict) -> dict:
    """The test split's scores under the plain names results.json promises (bleu, chrf, …)."""
    keys = ("bleu", "chrf", "bleu_tokenized", "sacrebleu_signature", "examples_scored", "pairs_dropped")
    return {k: results[f"test_{k}"] for k in keys if f"test_{k}" in results}


def load_run(workdir: str | Path, step: int | None = None):
    """(config, tokenizer, model in eval mode, step) of an mt-train workdir."""
    workdir = as_path(workdir)
    config = read_run_config(workdir, reader="mt-translate reads mt-train runs", tasks=("translation",))
    # Decoding fields added since a run was written take the value older runs decoded with.
    config.decode = ml_collections.ConfigDict({"length_penalty_form": "gnmt", **config.decode.to_dict()})
    tok_path = next((workdir / n for n in ("spm.model", "vocab.txt") if (workdir / n).exists()), None)
    if tok_path is None:
        raise FileNotFoundError(f"{workdir} has no tokenizer (spm.model or vocab.txt)")
    tokenizer = load_tokenizer(tok_path)
    build = lambda rngs: build_model(config, tokenizer.vocab_size, rngs)
    model, step = restore_model(build, config.train, workdir / "checkpoints", step=step, model_config=config.model)
    model.eval()
    return config, tokenizer, model, step
