"""The model section every task config shares, and the mixer configs derived from it."""

from __future__ import annotations

import operator
from collections.abc import Mapping

import ml_collections

from zoo import mixers
from zoo.config_fields import BOOLEAN, Field, Rule, at_least, in_range, integer, one_of, section
from zoo.config_fields import problems as field_problems
from zoo.layers.embeddings import EMBED_SCALES, POSITIONAL
from zoo.layers.ffn import FFN_INITS, FFN_KINDS
from zoo.layers.heads import POOLINGS
from zoo.mixers.registry import MAX_WIDTH, SHARED_FIELDS, SHARED_RULES

NORMS = ("pre", "post")
REMAT = ("none", "full", "dots")  # zoo.models.encoder.REMAT_POLICIES has the last two
TIE_EMBEDDINGS = ("none", "decoder", "all")


_FFN_DROPOUT = Rule(lambda x: x == -1 or (isinstance(x, int | float) and 0 <= x < 1), "must be in [0, 1) or -1",
                    "[0, 1) or -1")  # fmt: skip

# Fields that reproduce a reference implementation's block (the `lra_code` presets, fairseq's `iwslt_de_en`)
# default to this project's own choice. The size bounds are far above any model this code is for (Path-X is 16K
# tokens), low enough that a typo is refused in one line instead of a model that hangs or exhausts memory; the
# fields every mixer takes too (d_model, num_heads, ...) have the rules mixers.build checks (SHARED_RULES).
MAX_LAYERS = 1024
_SHARED = SHARED_RULES

MODEL_FIELDS: tuple[Field, ...] = (
    # Mixer names are checked against the registry by `mixer_name_problems` (its message lists them).
    Field("mixer", "relu", None, "self-attention / token mixer of every block (docs/mixers.md)"),
    Field("cross_mixer", "softmax", None, "encoder-decoder cross-attention (attention-type mixers only)"),
    Field("num_layers", 2, integer(1, MAX_LAYERS), "blocks in the encoder (and the decoder unless num_decoder_layers)"),
    Field("num_decoder_layers", 0, integer(0, MAX_LAYERS), "encoder-decoder: decoder blocks; 0: num_layers"),
    Field("d_model", 128, _SHARED["d_model"], "model width"),
    Field("num_heads", 4, _SHARED["num_heads"], "attention heads"),
    Field("mlp_dim", 256, integer(1, 4 * MAX_WIDTH), "FFN hidden width"),
    Field("qkv_dim", 0, _SHARED["qkv_dim"], "width of the q/k/v projections (heads × head dim) of "
          "attention-type mixers; 0: d_model. The LRA code sets it apart on Image (64 for d 128) and "
          "Pathfinder (16 for d 32)"),
    Field("attention_bias", True, _SHARED["attention_bias"], "biases on the q/k/v/out projections (the LRA code "
          "has none; fairseq and BERT have them)"),
    Field("max_length", 512, _SHARED["max_length"], "longest input in tokens (positions, masks, kernels' blocks)"),
    Field("dropout", 0.1, in_range(0, 1), "dropout on embeddings and every residual branch"),
    Field("attention_dropout", 0.0, _SHARED["attention_dropout"], "dropout on the attention probabilities of "
          "mixers that form them (softmax, sparsemax, entmax): the LRA code's attention_dropout_rate. ReLU "
          "attention's kernels, linear attention and SGU never form them: there it does not apply (a warning says so)"),
    Field("ffn_dropout", -1.0, _FFN_DROPOUT, "dropout on the FFN's hidden activations; -1: `dropout` (the LRA "
          "code's MlpBlock); fairseq's activation_dropout is 0"),
    Field("ffn_init", "lecun_normal", one_of(*FFN_INITS), "FFN initialisers: lecun_normal (flax's Dense, biases "
          "0), xavier_uniform (the LRA code's MlpBlock, biases N(0, 1e-6²)), torch (PyTorch's nn.Linear, fairseq: "
          "kernels and biases U(±1/√fan_in)), softmax_matched (softmax memories: V with variance n/(2e), a ReLU "
          "FFN's output variance at init; zoo/layers/ffn.py)"),
    Field("embed_scale", "none", one_of(*EMBED_SCALES), "token embeddings: none (N(0, 1), tied logits ÷ √d) or "
          "sqrt_d (N(0, 1/d), inputs × √d: fairseq)"),
    Field("attention_init", "xavier_uniform", _SHARED["attention_init"], "q/k/v/out initialisers: xavier_uniform "
          "(flax, the LRA code; biases 0) or fairseq (q/k/v xavier_uniform with gain 1/√2 and PyTorch's U(±1/√d) "
          "biases; out as xavier)"),
    Field("norm", "pre", one_of(*NORMS), "LayerNorm placement: pre (x + f(LN x), a final LN after the stack; the "
          "LRA code, BERT-style stacks here) or post (LN(x + f(x)), no final LN; fairseq, the original "
          "Transformer)"),
    Field("ffn", "relu", one_of(*FFN_KINDS), "the block's FFN (zoo/layers/ffn.py); none for gMLP-style blocks"),
    Field("positional", "sinusoidal", one_of(*POSITIONAL), "position information added to the token embeddings"),
    Field("position_init_stddev", 0.02, at_least(0), "σ of learned positions beside N(0, 1) token embeddings: the "
          "LRA code's 0.02 (50× smaller than its tokens); BERT draws both tables alike (its presets: 1.0)"),
    Field("pooling", "cls", one_of(*POOLINGS), "classifiers' pooling: cls, first or mean "
          "(zoo.models.classifiers.SequenceEncoder)"),
    Field("head_layers", 1, integer(1, 64), "hidden Dense → ReLU layers of a classifier's head, each half as wide as "
          "the one before (the first mlp_dim wide): 1 the LRA classifier head, 2 the LRA matching (Retrieval) head"),
    Field("pixel_zero_is_padding", False, BOOLEAN, "the LRA code's padding mask on pixel tasks, `inputs > 0`: "
          "black pixels hidden from attention as keys"),
    Field("pad_id", 0, integer(-1), "the token id that is padding (masked out); -1: none (pixel tasks, every id "
          "is real)"),
    Field("dtype", "float32", _SHARED["dtype"], "compute dtype; parameters stay float32"),
    Field("remat", "none", one_of(*REMAT), "rematerialisation of each block in the backward pass: none, full "
          "(keep only block inputs) or dots (keep matmul outputs without batch dims: "
          "jax's dots_with_no_batch_dims)"),
    Field("scan_layers", False, BOOLEAN, "one block traced once and run by a scan over stacked [num_layers, ...] "
          "parameters: compile time stops growing with depth (checkpoints are laid out differently)"),
    Field("layer_norm_eps", 1e-6, _SHARED["layer_norm_eps"], "LayerNorm ε: flax's and the LRA code's 1e-6 "
          "(PyTorch 1e-5, BERT 1e-12; docs/conventions.md)"),
    Field("gelu_approximate", True, _SHARED["gelu_approximate"], "GELU's tanh form (jax's and BERT's); False: "
          "the exact erf form (PyTorch's nn.GELU, g-mlp-pytorch)"),
    Field("tie_embeddings", "none", one_of(*TIE_EMBEDDINGS), "generative models: none, decoder (output "
          "projection = target embedding) or all (+ source)"),
    Field("mixer_options", None, None, "each mixer's own fields, model.mixer_options.NAME.* (docs/mixers.md); "
          "every mixer's are checked, the inactive ones' too"),
)  # fmt: skip


def model_config(**overrides) -> ml_collections.ConfigDict:
    """`MODEL_FIELDS`' defaults, with `overrides`; `mixer_options.<name>` holds each mixer's own fields."""
    cfg = section(MODEL_FIELDS)
    cfg.mixer_options = mixers.options_config()
    unknown = sorted(set(overrides) - set(cfg.keys()))
    if unknown:  # a misspelt field would otherwise be kept beside the real one, which keeps its default
        raise ValueError(f"model_config: unknown field(s) {', '.join(unknown)}; valid: {', '.join(sorted(cfg.keys()))}")
    options = overrides.get("mixer_options")
    if isinstance(options, Mapping | ml_collections.ConfigDict):  # the same: a misspelt mixer or option
        if problems := [p for name in options.keys() for p in mixer_option_problems(name, options[name], values=False)]:
            raise ValueError("model_config: " + "; ".join(problems))
    cfg.update(overrides)
    return cfg


def mixer_config(
    model: ml_collections.ConfigDict, *, name: str | None = None, max_length: int | None = None
) -> ml_collections.ConfigDict:
    """Mixer `name` (default `model.mixer`): shared fields from `model`, options from `model.mixer_options`."""
    name = model.mixer if name is None else name
    cfg = mixers.default_config(name)  # raises, listing valid names, for an unknown mixer
    cfg.update(model.mixer_options[name])
    cfg.update({field: model[field] for field in SHARED_FIELDS if field != "max_length"})
    cfg.max_length = model.max_length if max_length is None else max_length
    return cfg


def stored_model_config(stored: dict) -> ml_collections.ConfigDict:
    """The model section of a workdir's config.json, with fields added since it was written at their defaults (the
    computation older runs did), so a checkpoint made before them still loads."""
    cfg = model_config()
    cfg.update(stored)
    return cfg


def check_tie_embeddings(cfg: ml_collections.ConfigDict, choices: tuple[str, ...], model: str = "this model") -> str:
    """model.tie_embeddings when `model` supports it (one of `choices`), else a one-line error (a classifier
    refuses anything but "none" rather than ignore it)."""
    tie = cfg.get("tie_embeddings", "none")
    if tie not in choices:
        raise ValueError(f"model.tie_embeddings={tie!r} is not valid for {model}; valid: {', '.join(choices)}")
    return tie


def mixer_option_problems(name: str, options, *, values: bool = True) -> list[str]:
    """model.mixer_options.<name> by mixer `name`'s declared options: an unknown mixer, an unknown field and, with
    `values`, a value its rule refuses; one line each, naming the field."""
    prefix = f"model.mixer_options.{name}"
    if name not in mixers.names():
        return [f"{prefix}: unknown mixer {name!r}; valid mixers: {', '.join(mixers.names())}"]
    fields = mixers.option_fields(name)
    valid = ", ".join(f.name for f in fields) or "none (it has no options)"
    if not isinstance(options, Mapping | ml_collections.ConfigDict):
        return [f"{prefix}={options!r} must be a section of its options: {valid}"]
    unknown = sorted(set(options.keys()) - {f.name for f in fields})
    problems = [f"{prefix} has no field {key!r}; valid: {valid}" for key in unknown]
    return problems + (field_problems(options, fields, prefix) if values else [])


def mixer_name_problems(cfg: ml_collections.ConfigDict) -> list[str]:
    """model.mixer and model.cross_mixer against the registry (its names listed)."""
    return [
        f"model.{field}: unknown mixer {cfg[field]!r}; valid mixers: {', '.join(mixers.names())}"
        for field in ("mixer", "cross_mixer")
        if field in cfg and cfg[field] not in mixers.names()
    ]


def check_model_fields(cfg: ml_collections.ConfigDict) -> None:
    """The model fields' declared rules, the mixers' names and every mixer's options' (the inactive mixers' too, as
    the commands' validation), for models built from Python (the commands validate before building)."""
    problems = field_problems(cfg, MODEL_FIELDS, "model") or mixer_name_problems(cfg)
    options = cfg.get("mixer_options") or {}
    problems += [p for name in sorted(options.keys()) for p in mixer_option_problems(name, options[name])]
    if problems:
        raise ValueError("config field " + "; ".join(problems))


def check_model(cfg: ml_collections.ConfigDict, model: str, **sizes: int) -> None:
    """A public model's entry, before any array is made: its `sizes` arguments (vocab_size, num_classes: integers
    ≥ 1) and `check_model_fields`. The layers it builds are told `checked=True`, so nothing is checked twice."""
    rule = integer(1)
    for argument, value in sizes.items():  # numpy's and a concrete jax scalar's integers (a data set's count) too
        try:
            ok = not isinstance(value, bool) and rule.check(operator.index(value))
        except TypeError:
            ok = False
        if not ok:
            raise ValueError(f"{model}: {argument}={value!r} {rule.what}")
    check_model_fields(cfg)
