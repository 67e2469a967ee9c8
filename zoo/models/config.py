"""The model section every task config shares, and the mixer configs derived from it."""

from __future__ import annotations

import ml_collections

from zoo import mixers


def model_config(**overrides) -> ml_collections.ConfigDict:
    """Defaults for the models every task builds; `mixer_options.<name>` holds each mixer's own fields.

    Fields that reproduce a reference implementation's block (the LRA code's `lra_code` presets, fairseq's
    `iwslt_de_en`) default to this project's own choice: pre-LN, q/k/v as wide as the model, projections with
    biases, no dropout on attention weights, the FFN's dropout = `dropout`, flax's lecun_normal FFN init."""
    cfg = ml_collections.ConfigDict(
        {
            "mixer": "relu",  # self-attention / token mixer of every block
            "cross_mixer": "softmax",  # encoder-decoder cross-attention (attention types only)
            "num_layers": 2,
            "num_decoder_layers": 0,  # encoder-decoder: 0 means num_layers
            "d_model": 128,
            "num_heads": 4,
            "mlp_dim": 256,
            # Width of the q/k/v projections (heads × head dim) of attention-type mixers; 0: d_model. The LRA
            # code sets it apart on Image (64 for d 128) and Pathfinder (16 for d 32).
            "qkv_dim": 0,
            # Biases on the q/k/v/out projections (the LRA code has none; fairseq and BERT have them).
            "attention_bias": True,
            "max_length": 512,
            "dropout": 0.1,
            # Dropout on the attention probabilities of mixers that form them (softmax, sparsemax, entmax):
            # the LRA code's attention_dropout_rate (flax, per element). ReLU attention's kernels and linear
            # attention never form the T×T weights, and SGU has none: for them it does not apply (a warning).
            "attention_dropout": 0.0,
            # Dropout on the FFN's hidden activations; -1: `dropout` (the LRA code's MlpBlock); fairseq's
            # activation_dropout is 0.
            "ffn_dropout": -1.0,
            # FFN initialisers: lecun_normal (flax's Dense: kernels lecun_normal, biases 0), xavier_uniform
            # (the LRA code's MlpBlock: kernels xavier_uniform, biases N(0, 1e-6²)), torch (PyTorch's nn.Linear,
            # fairseq: kernels and biases U(±1/√fan_in)).
            "ffn_init": "lecun_normal",
            # Token embeddings: none (N(0, 1), tied logits ÷ √d) or sqrt_d (N(0, 1/d), inputs × √d: fairseq).
            "embed_scale": "none",
            # q/k/v/out initialisers: xavier_uniform (flax, the LRA code: kernels xavier_uniform, biases 0) or
            # fairseq (q/k/v kernels xavier_uniform with gain 1/√2 and PyTorch's U(±1/√d) biases; out as xavier).
            "attention_init": "xavier_uniform",
            # LayerNorm placement of every block: pre (x + f(LN x), one final LN after the stack; the LRA code,
            # BERT-style stacks here) or post (LN(x + f(x)), no final LN; fairseq's transformer, the original
            # Transformer).
            "norm": "pre",
            "ffn": "relu",  # see zoo.layers.ffn.FFN_KINDS; "none" for gMLP-style blocks
            "positional": "sinusoidal",
            # Learned positions ~ N(0, σ²) beside N(0, 1) token embeddings: the LRA code's σ 0.02 (50× smaller
            # than its tokens); BERT draws both tables alike (its presets: 1.0).
            "position_init_stddev": 0.02,
            "pooling": "cls",  # cls | first | mean (zoo.models.classifiers.SequenceEncoder)
            # Hidden Dense → ReLU layers of a classifier's head, each half as wide as the one before (the first
            # mlp_dim wide): 1 the LRA classifier head, 2 the LRA matching (Retrieval) head.
            "head_layers": 1,
            # The LRA code's padding mask on pixel tasks, `inputs > 0`: black pixels hidden from attention as keys.
            "pixel_zero_is_padding": False,
            "pad_id": 0,  # the token id that is padding (masked out); -1: none (pixel tasks, every id is real)
            "dtype": "float32",  # compute dtype; parameters stay float32
            # Rematerialisation of each block in the backward pass: none | full (keep only block inputs) |
            # dots (keep matmul outputs without batch dims, recompute the rest: jax's dots_with_no_batch_dims).
            "remat": "none",
            # One block traced once and run by a scan over stacked [num_layers, ...] parameters: compile time
            # stops growing with depth. Checkpoints are laid out differently from the unrolled model's.
            "scan_layers": False,
            # Conventions that differ between reference implementations (docs/conventions.md): flax's and
            # the LRA code's LayerNorm ε 1e-6 (PyTorch's is 1e-5, BERT's 1e-12), and GELU's tanh form (jax's
            # and BERT's; PyTorch's nn.GELU and g-mlp-pytorch use the exact erf form: False).
            "layer_norm_eps": 1e-6,
            "gelu_approximate": True,
            # Generative models: none | decoder (output projection = target embedding) | all (+ source).
            "tie_embeddings": "none",
            "mixer_options": mixers.options_config(),
        }
    )
    cfg.update(overrides)
    return cfg


def mixer_config(
    model: ml_collections.ConfigDict, *, name: str | None = None, max_length: int | None = None
) -> ml_collections.ConfigDict:
    """Mixer `name` (default `model.mixer`): shared fields from `model`, options from `model.mixer_options`."""
    name = model.mixer if name is None else name
    cfg = mixers.default_config(name)  # raises, listing valid names, for an unknown mixer
    cfg.update(model.mixer_options[name])
    cfg.d_model, cfg.num_heads, cfg.dtype = model.d_model, model.num_heads, model.dtype
    for field in ("qkv_dim", "attention_bias", "attention_dropout", "attention_init"):  # attention-type mixers
        cfg[field] = model[field]
    cfg.layer_norm_eps, cfg.gelu_approximate = model.layer_norm_eps, model.gelu_approximate
    cfg.max_length = model.max_length if max_length is None else max_length
    return cfg


def stored_model_config(stored: dict) -> ml_collections.ConfigDict:
    """The model section of a workdir's config.json, with fields added since it was written at their defaults.

    New model fields default to the computation older runs did (e.g. `remat="none"`), so a checkpoint made
    before them still loads (`mt-translate`, `mlm-inspect`, `mlm-finetune`)."""
    cfg = model_config()
    cfg.update(stored)
    return cfg
