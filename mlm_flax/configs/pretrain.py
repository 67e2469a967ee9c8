"""Masked-language-model pretraining of gMLP, aMLP and BERT encoders at matched sizes (gMLP paper; docs/tasks.md).

Presets (after the colon) are ARCH_SIZE; `demo` is gmlp_demo.
  ARCH  gmlp         gMLP blocks (spatial gating unit, no FFN), no positional encodings
        amlp         gMLP blocks with the 64-wide single-head tiny attention in the gate
        bert         softmax attention + ReLU FFN, learned absolute positions
        bert_relpos  bert plus T5's relative position bias (the paper's strongest baseline)
        lm           a causal Transformer language model (task "clm": every next token is predicted) at bert's
                     sizes, sinusoidal positions, output tied to the input embeddings. Not a gMLP-paper model:
                     the ReLUFormer FFN-memory study (`studies.ffn_memory`) uses it.
  SIZE  demo         d 128; gMLP 4 layers / aMLP 3 / BERT 3 (~0.6M parameters each besides the 4k
                     embeddings); sequences of 128 from the offline corpus (Wikipedia sample of the gensim wheel).
                       mlm-train --config=mlm_flax/configs/pretrain.py:demo --workdir=runs/mlm-demo
                     Hardware: 2 CPU cores, about 3 minutes (make demo-mlm). Expected: held-out perplexity
                     far below the unigram perplexity of the corpus (docs/results.md has the measured figures).
        tiny         d 64, 2 layers, sequences of 64: smoke tests (used by the test suite).
        base         the paper's base models: gMLP 48 layers / aMLP 36 layers, d 512, d_ffn 3072; BERT
                     12 layers, d 768, 12 heads, FFN 3072; vocabulary 32k, sequences of 128, batch 2048,
                     125k steps. Data: C4 through TFDS, or a plain-text corpus:
                       mlm-train --config=mlm_flax/configs/pretrain.py:gmlp_base --workdir=runs/gmlp-base \\
                         --config.data.source=tfds --config.data.tfds_name=c4/en
                     Hardware: a TPU pod slice or a multi-GPU node. Expected (paper, C4): perplexity
                     gMLP 4.28, aMLP 3.95, BERT 4.17 (4.26→… with rel. pos, Table 3's ablation: 4.37/4.26).
                     The optimiser settings are RoBERTa-base's; the paper does not publish its own.

Data: --config.data.source=wiki_sample (default, offline) | kjv (the King James Bible, offline) | text
(data.dir/{train,valid,test}.txt) | tfds. Any encoder mixer: --config.model.mixer=NAME (set model.ffn and
model.positional to match). results.json: test_loss, test_perplexity, test_accuracy (masked tokens; lm: every
next token), unigram_perplexity.
"""

from __future__ import annotations

import ml_collections

from zoo.config_fields import BOOLEAN, PATH, TEXT, Field, closed, fraction, integer, one_of, section
from zoo.models import model_config
from zoo.training import small_run_config, task_config, train_config
from zoo.training.data import TFDS_DATA_DIR, WHEEL_CACHE

ENCODERS = ("gmlp", "amlp", "bert", "bert_relpos")  # what mlm-finetune and mlm-inspect take
ARCHS = (*ENCODERS, "lm")
SIZES = ("demo", "tiny", "base")
PRESETS = ("demo", *(f"{a}_{s}" for a in ARCHS for s in SIZES))

# (layers per architecture, d_model, d_ffn of gMLP/aMLP, BERT FFN, heads, max_length)
_SIZES = {
    "demo": dict(layers={"gmlp": 4, "amlp": 3, "bert": 3}, d=128, d_ffn=768, mlp=512, heads=4, length=128),
    "tiny": dict(layers={"gmlp": 2, "amlp": 2, "bert": 2}, d=64, d_ffn=256, mlp=128, heads=4, length=64),
    "base": dict(layers={"gmlp": 48, "amlp": 36, "bert": 12}, d=512, d_ffn=3072, mlp=3072, heads=12, length=128),
}


def encoder_config(arch: str, size: str) -> ml_collections.ConfigDict:
    """The model section of preset ARCH_SIZE (shared with fine-tuning, which must match the checkpoint)."""
    s = _SIZES[size]
    family = "bert" if arch.startswith("bert") or arch == "lm" else arch
    dropout = 0.1 if size == "base" else 0.0
    common = dict(num_layers=s["layers"][family], max_length=s["length"], dropout=dropout, pooling="cls")
    if family == "bert":
        d = 768 if size == "base" else s["d"]
        cfg = model_config(
            mixer="softmax",
            ffn="gelu",
            positional="learned",
            position_init_stddev=1.0,  # as the N(0, 1) token table: BERT draws both from one distribution
            d_model=d,
            num_heads=s["heads"],
            mlp_dim=s["mlp"],
            layer_norm_eps=1e-12,  # BERT's TensorFlow code (and its tanh GELU, the default)
            **common,
        )
        if arch == "lm":  # a decoder: fixed positions (CausalLM), the output projection tied to the embeddings
            cfg.update(positional="sinusoidal", tie_embeddings="decoder")
        if arch == "bert_relpos":
            cfg.mixer_options.softmax.relative_buckets = 32
            cfg.mixer_options.softmax.relative_max_distance = s["length"]
        return cfg
    # The gMLP paper gives neither; these are g-mlp-pytorch's (PyTorch's LayerNorm ε, exact erf GELU).
    cfg = model_config(
        mixer=arch,
        ffn="none",
        positional="none",
        d_model=s["d"],
        num_heads=1,
        mlp_dim=s["d_ffn"],
        layer_norm_eps=1e-5,
        gelu_approximate=False,
        **common,
    )
    cfg.mixer_options[arch].d_ffn = s["d_ffn"]
    if arch == "amlp" and size == "tiny":
        cfg.mixer_options.amlp.tiny_attention_dim = 32
    return cfg


def parse_preset(preset: str) -> tuple[str, str]:
    preset = "gmlp_demo" if preset == "demo" else preset
    arch, _, size = preset.rpartition("_")
    if preset not in PRESETS:
        raise ValueError(f"unknown MLM preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    return arch, size


DATA_FIELDS: tuple[Field, ...] = (
    Field("source", "wiki_sample", one_of("wiki_sample", "kjv", "text", "tfds"), "wiki_sample: the Wikipedia "
          "sample of a wheel (offline); kjv: the King James Bible of a wheel; text: {train,valid,test}.txt in "
          "data.dir; tfds: data.tfds_name"),
    Field("dir", "data/mlm-text", PATH, "source=text: {train,valid,test}.txt (valid and test optional)"),
    Field("documents", "blank_lines", one_of("blank_lines", "lines"), "how text files separate documents: blank "
          "lines, or one document a line"),
    Field("holdout_fraction", 0.05, fraction(), "documents each for valid and test when a corpus has no such files"),
    WHEEL_CACHE,
    Field("cache_dir", "", TEXT, "where the tokenizer and the cached examples go; '': data.dir/cache"),
    Field("tfds_name", "c4/en", TEXT, "source=tfds: the data set, prepared"),
    Field("tfds_text_field", "text", TEXT, "source=tfds: the feature that holds a document's text"),
    TFDS_DATA_DIR,
    Field("tfds_max_documents", 0, integer(0, 10**10), "source=tfds: the first N documents of each split; 0: all"),
    Field("tokenizer_model", "", TEXT, "an existing SentencePiece .model with [MASK] [CLS] [SEP]; '': train one"),
    Field("vocab_size", 4000, integer(8, 10**7), "the SentencePiece vocabulary trained (presets: demo 4,000, tiny "
          "500, base 32,000)"),
    Field("seq_length", 128, integer(2, 2**20), "tokens per example, at most model.max_length (gMLP's spatial size)"),
    Field("mask_rate", 0.15, fraction(), "the share of tokens predicted (BERT: 0.15)"),
    Field("mask_budget", "sequence", one_of("sequence", "maskable"), "what mask_rate is a share of: sequence "
          "(every token but padding, [CLS] and [SEP] included: BERT's count) or maskable (those that may be chosen)"),
    Field("mask_token_fraction", 0.8, closed(0, 1), "of those, the share replaced by [MASK] (BERT: 0.8)"),
    Field("random_token_fraction", 0.1, closed(0, 1), "the share replaced by a random token (BERT: 0.1; "
          "the two sum to at most 1, the rest stays as it is)"),
    Field("whole_word", False, BOOLEAN, "mask whole words (every piece of a word together)"),
    Field("max_predictions", 20, integer(1, 2**20), "predicted tokens per sequence at most (BERT: 20 for 128)"),
)  # fmt: skip
CONFIG_SECTIONS = {"data": DATA_FIELDS}


def get_config(preset: str = "demo") -> ml_collections.ConfigDict:
    arch, size = parse_preset(preset)
    data = section(
        DATA_FIELDS,
        vocab_size={"demo": 4000, "tiny": 500, "base": 32000}[size],
        seq_length=_SIZES[size]["length"],
        max_predictions={"demo": 20, "tiny": 10, "base": 20}[size],
    )
    config = task_config("clm" if arch == "lm" else "mlm", data=data)
    config.model = encoder_config(arch, size)
    if size == "demo":
        config.train = small_run_config(600, learning_rate=2e-3, warmup_steps=40, weight_decay=0.01, eval_every=200)
    elif size == "tiny":
        config.train = small_run_config(200, batch_size=16, learning_rate=3e-3, warmup_steps=20, weight_decay=0.0)
    else:
        config.train = train_config(
            steps=125_000, batch_size=2048, learning_rate=6e-4, schedule="cosine", warmup_steps=10_000,
            weight_decay=0.01, b2=0.98, eps=1e-6, log_every=100, eval_every=5000, checkpoint_every=2500,
        )  # fmt: skip
    # BERT's AdamWeightDecay: no decay of LayerNorm parameters and biases (the gMLP paper follows BERT's recipe).
    config.train.weight_decay_mask = "no_norm_or_bias"
    config.lock()
    return config
