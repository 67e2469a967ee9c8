"""The `lra_code` presets build the LRA code's models, layer by layer, and carry its settings field by field.

The reference is google-research/long-range-arena at commit cd31e5c (lra_flax.configs.common.LRA_CODE_COMMIT);
every number below is read from its files, cited as path:line under lra_benchmarks/.
"""

import math

import jax
import pytest
from flax import nnx

from lra_flax.configs import common
from lra_flax.tasks import REGISTRY
from zoo.models import DualEncoder, SequenceClassifier


def lra_layer_counts(*, vocab, d, qkv, mlp, layers, classes, cls_token, positions, dual=False) -> dict[str, int]:
    """Parameters per layer of the LRA code's TransformerEncoder / TransformerDualEncoder, from its layer list:
    - nn.Embed(vocab, d) (models/transformer/transformer.py:152-155);
    - the [CLS] vector, d zeros (transformer.py:162), when classifier_pool is CLS;
    - learned positions (positions × d, common_layers.py:116) or sinusoidal (none);
    - per block (transformer.py:59-88): LayerNorm (scale, bias: 2d), MultiHeadDotProductAttention with
      qkv_features=qkv_dim and bias=False (transformer.py:64,71): q, k, v kernels d×qkv and the out kernel qkv×d;
      LayerNorm; MlpBlock (common_layers.py:155-161): Dense d→mlp and mlp→d with biases;
    - encoder_norm, a LayerNorm (transformer.py:214);
    - classifier_head (common_layers.py:191-193): Dense d→mlp, Dense mlp→classes; or classifier_head_dual
      (common_layers.py:237-241) on [x1, x2] (interaction None): Dense 2d→mlp, mlp→mlp/2, mlp/2→classes."""
    counts = {"embed": vocab * d, "cls": d if cls_token else 0, "positions": positions * d}
    for i in range(layers):
        counts[f"block{i}.norms"] = 2 * (2 * d)
        counts[f"block{i}.attention"] = 4 * d * qkv
        counts[f"block{i}.mlp"] = d * mlp + mlp + mlp * d + d
    counts["final_norm"] = 2 * d
    if dual:
        half = mlp // 2
        counts["head"] = 2 * d * mlp + mlp + mlp * half + half + half * classes + classes
    else:
        counts["head"] = d * mlp + mlp + mlp * classes + classes
    return counts


def our_layer_counts(model) -> dict[str, int]:
    """The same grouping of our model's parameters."""
    counts: dict[str, int] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param)):
        keys = [str(getattr(p, "key", getattr(p, "idx", p))) for p in path]
        if keys[0] == "head":
            group = "head"
        elif keys[1] in ("embed", "cls", "positions"):
            group = keys[1]
        elif keys[2] == "final_norm":
            group = "final_norm"
        else:  # encoder.encoder.blocks.<i>.<part>
            part = {"mixer_norm": "norms", "ffn_norm": "norms", "mixer": "attention", "ffn": "mlp"}[keys[4]]
            group = f"block{keys[3]}.{part}"
        counts[group] = counts.get(group, 0) + math.prod(leaf.shape)
    return {k: v for k, v in counts.items()}


# task: (the LRA vocabulary, dual encoder); our vocabulary and classes are the registry's (lra_flax.tasks).
LRA_VOCAB = {
    # ListOps: the LRA vocabulary has an OOV id beside the 15 tokens and padding (listops/input_pipeline.py:75-93);
    # ours has no OOV id (an unknown token is an error naming it): one row of embeddings less.
    "listops": (17, False),
    "text": (257, False),  # tfds' ByteTextEncoder: 256 bytes and padding (text_classification/input_pipeline.py:134)
    "retrieval": (257, True),
    "image": (256, False),  # the pipelines' vocab_size 256, pixel values (image/input_pipeline.py:92 CIFAR-10,
    # :205 Pathfinder)
    "pathfinder": (256, False),
    "pathx": (256, False),
}
TASKS = list(LRA_VOCAB)
# The LRA configs' sizes: (layers, emb_dim, qkv_dim, num_heads, mlp_dim, max_length, dropout, attention dropout)
LRA_MODEL = {
    "listops": (4, 512, 512, 8, 1024, 2000, 0.1, 0.1),  # listops/configs/base_listops_config.py:40,45-49; the
    # dropout rates are transformer.py:109-110's defaults (listops/train.py passes neither)
    "text": (4, 256, 256, 4, 1024, 1000, 0.1, 0.1),  # text_classification/configs/base_tc_config.py:43,45-49
    "retrieval": (4, 128, 128, 4, 512, 4000, 0.1, 0.1),  # matching/configs/base_match_config.py:41,46-50
    "image": (1, 128, 64, 8, 128, 1024, 0.3, 0.2),  # image/configs/cifar10/transformer_base.py:24-29, base:52-53
    "pathfinder": (4, 32, 16, 4, 32, 1024, 0.2, 0.1),  # image/configs/pathfinder32/transformer_base.py:24-29, base:53
    "pathx": (1, 32, 16, 2, 32, 16384, 0.1, 0.1),  # image/configs/pathfinder128/base_pathfinder128_config.py:46-53
}
# (batch, steps, learning rate, schedule, warm-up, weight decay, gradient clipping)
LRA_TRAIN = {
    "listops": (32, 5000, 0.05, "rsqrt", 1000, 0.1, 0.0),  # base_listops_config.py:22-28,38-39; no clipping in train.py
    "text": (32, 20000, 0.05, "rsqrt", 8000, 0.1, 0.0),  # base_tc_config.py:23-28,40
    "retrieval": (32, 5000, 0.05, "rsqrt", 8000, 0.1, 0.0),  # base_match_config.py:23-28,40
    "image": (256, 35000, 5e-4, "cosine", 175, 0.0, 0.0),  # base_cifar10_config.py:27-32,40-43 (clipping None)
    "pathfinder": (512, 62400, 1e-3, "cosine", 312, 0.0, 0.0),  # base_pathfinder32_config.py:26-31,39-42
    "pathx": (64, 500000, 1e-3, "cosine", 2500, 0.0, 1.0),  # base_pathfinder128_config.py:26-31,39-42
}
# (pooling, positions, [CLS] token, pixel value 0 is padding (transformer.py:148 `inputs > 0`))
LRA_INPUT = {
    "listops": ("cls", "sinusoidal", True, False),  # transformer.py:111,113
    "text": ("cls", "sinusoidal", True, False),  # base_tc_config.py:41
    "retrieval": ("first", "sinusoidal", False, False),  # transformer.py:280-292: classifier=False, no [CLS]
    "image": ("cls", "learned", True, True),  # transformer_base.py:25, base_cifar10_config.py:55
    "pathfinder": ("mean", "sinusoidal", False, True),  # base_pathfinder32_config.py:54-55
    "pathx": ("mean", "learned", False, True),  # base_pathfinder128_config.py:54-55
}


def _config(task):
    return REGISTRY[task].get_config()


def test_every_registered_task_is_checked_against_the_lra_code():
    assert set(REGISTRY) == set(TASKS) == set(LRA_MODEL) == set(LRA_TRAIN) == set(LRA_INPUT)


@pytest.mark.parametrize("task", TASKS)
def test_the_softmax_model_has_the_lra_models_parameters_layer_by_layer(task):
    vocab, classes = REGISTRY[task].vocab_size, REGISTRY[task].num_classes
    lra_vocab, dual = LRA_VOCAB[task]
    config = _config(task)
    assert config.model.mixer == "softmax"  # lra_code means the LRA Transformer; other mixers by override
    cls_model = DualEncoder if dual else SequenceClassifier
    model = nnx.eval_shape(lambda: cls_model(config.model, vocab_size=vocab, num_classes=classes, rngs=nnx.Rngs(0)))
    layers, d, qkv, _, mlp, length, _, _ = LRA_MODEL[task]
    _, positional, cls_token, _ = LRA_INPUT[task]
    positions = (length + cls_token) if positional == "learned" else 0
    want = lra_layer_counts(
        vocab=lra_vocab, d=d, qkv=qkv, mlp=mlp, layers=layers, classes=classes, cls_token=cls_token,
        positions=positions, dual=dual,
    )  # fmt: skip
    got = our_layer_counts(model)
    got.setdefault("cls", 0)
    got.setdefault("positions", 0)
    # The vocabulary is the LRA code's (LRA_VOCAB's citations), ListOps' one row less (no OOV id).
    assert vocab == lra_vocab - (task == "listops")
    assert got.pop("embed") == vocab * d and want.pop("embed") == lra_vocab * d
    assert got == want


@pytest.mark.parametrize("task", TASKS)
def test_the_presets_carry_the_lra_configs_fields(task):
    config = _config(task)
    model, train = config.model, config.train
    layers, d, qkv, heads, mlp, length, dropout, attention_dropout = LRA_MODEL[task]
    assert (model.num_layers, model.d_model, model.qkv_dim or model.d_model, model.num_heads, model.mlp_dim) == (
        layers, d, qkv, heads, mlp,
    )  # fmt: skip
    assert (model.max_length, model.dropout, model.attention_dropout) == (length, dropout, attention_dropout)
    pooling, positional, _, zero_is_padding = LRA_INPUT[task]
    assert (model.pooling, model.positional, model.pixel_zero_is_padding) == (pooling, positional, zero_is_padding)
    # The block: transformer.py:59-88 (pre-LN), :71 (no q/k/v/out biases); common_layers.py:151-157 (MlpBlock:
    # xavier_uniform kernels, N(0, 1e-6) biases, GELU — flax's tanh approximation); LayerNorm ε 1e-6 (flax).
    assert (model.norm, model.attention_bias, model.ffn, model.ffn_init, model.ffn_dropout) == (
        "pre", False, "gelu", "xavier_uniform", -1.0,
    )  # fmt: skip
    assert model.gelu_approximate and model.layer_norm_eps == 1e-6 and model.position_init_stddev == 0.02
    # Attention kernels xavier_uniform (transformer.py:69); token embeddings N(0, 1), not scaled by √d
    # (transformer.py:152-155); a classifier: no output embedding to tie.
    assert (model.attention_init, model.embed_scale, model.tie_embeddings) == ("xavier_uniform", "none", "none")
    # The loss is the plain weighted cross-entropy (utils/train_utils.py:152-171, listops/train.py:85): no label
    # smoothing.
    assert train.label_smoothing == 0.0
    batch, steps, lr, schedule, warmup, weight_decay, clip = LRA_TRAIN[task]
    assert (train.batch_size, train.steps, train.learning_rate, train.schedule, train.warmup_steps) == (
        batch, steps, lr, schedule, warmup,
    )  # fmt: skip
    assert (train.weight_decay, train.grad_clip_norm, train.weight_decay_mask) == (weight_decay, clip, "all")
    # Adam β (0.9, 0.98), ε 1e-9: listops/train.py:73-78 and the other train.py files.
    assert (train.b1, train.b2, train.eps) == (0.9, 0.98, 1e-9)
    if task == "retrieval":  # classifier_head_dual with interaction None (transformer.py:246; common_layers.py:236)
        assert (model.pair_features, model.head_layers) == ("concat", 2)
    else:
        assert model.head_layers == 1
    assert common.LRA_CODE_COMMIT.startswith("cd31e5c")


def test_the_listops_preset_generates_the_lra_codes_data():
    """lra_benchmarks/data/listops.py:27-47: 96,000 / 2,000 / 2,000 expressions of 500 to 2,000 tokens, depth ≤ 10,
    ≤ 10 arguments an operator."""
    generator = _config("listops").data.generator
    assert (generator.num_train, generator.num_valid, generator.num_test) == (96000, 2000, 2000)
    assert (generator.min_length, generator.max_length, generator.max_depth, generator.max_args) == (500, 2000, 10, 10)


def test_the_published_rows_are_the_tables_they_cite():
    """The accuracies beside every results table, as the sources print them (None: FAIL)."""
    from lra_flax.tasks import published_rows

    # google-research/long-range-arena README.md at cd31e5c, "Our experiments" (the LRA paper's Table 1), lines
    # 38, 43, 46: ListOps | Text | Retrieval | Image | Path | Path-X.
    lra = {
        "LRA paper: Linear Trans.": (16.13, 65.90, 53.09, 42.34, 75.30),
        "LRA paper: Performer": (18.01, 65.40, 53.82, 42.77, 77.05),
        "LRA paper: Transformer": (36.37, 64.27, 57.46, 42.44, 71.40, None),
    }
    # "Linear Self-Attention Approximation via Trainable Feedforward Kernel", Table 1 (mean of five runs): Text |
    # Matching | ListOps, rows "Linear kernel", "2× GLU", "3× AOGLU".
    kernel = {
        "kernel paper: linear kernel": (65.77, 73.51, 18.54),
        "kernel paper: 2×GLU": (65.99, 73.36, 18.42),
        "kernel paper: 3×AOGLU": (66.06, 72.57, 18.45),
    }
    expected = {row: dict(zip(TASKS, values, strict=False)) for row, values in lra.items()}
    expected |= {
        row: dict(zip(("text", "retrieval", "listops"), values, strict=True)) for row, values in kernel.items()
    }
    assert published_rows() == expected
