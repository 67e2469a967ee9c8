"""ListOps: generator, tokenizer and task (docs/tasks.md).

The generator follows the LRA generator's distribution (operators MIN MAX MED SM, a node is an
operator with probability 0.25 below `max_depth`, 2..max_args arguments, values 0..9, keep trees with
min_length < length < max_length) but is seeded and keeps generation order, so the same seed gives
byte-identical files. Files use the LRA release format: `basic_{train,val,test}.tsv`, header
`Source\tTarget`, parentheses around pairs. Labels: MED = int(median) (truncates), SM = sum mod 10.
"""

from __future__ import annotations

import itertools
import os
import random
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_collections

from lra_flax import input_pipeline
from lra_flax.configs.listops import CONFIG_SECTIONS
from lra_flax.tasks.spec import DataFlag, TaskSpec
from zoo.progress import WorkProgress
from zoo.training import Task

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
VALUE_P = 0.25  # LRA: a node below max_depth is an operator with probability 0.25
NUM_CLASSES = 10
SPLIT_FILES = {"train": "basic_train.tsv", "valid": "basic_val.tsv", "test": "basic_test.tsv"}

# Fixed vocabulary: padding first, then every token sorted, so ids never depend on data or process.
VOCAB = ("<pad>", *sorted((*OPERATORS, END, *(str(d) for d in range(10)))))
TOKEN_IDS = {tok: i for i, tok in enumerate(VOCAB)}


def _generate_tree(rng: random.Random, depth: int, max_depth: int, max_args: int):
    """A tree as LRA builds it: ((((op, a1), a2), ...), END); returns (tree, token length)."""
    r = rng.random() if depth < max_depth else 1.0
    if r > VALUE_P:
        return rng.randrange(10), 1
    length = 2
    args = []
    for _ in range(rng.randint(2, max_args)):
        sub, sub_len = _generate_tree(rng, depth + 1, max_depth, max_args)
        args.append(sub)
        length += sub_len
    tree = (rng.choice(OPERATORS), args[0])
    for arg in args[1:]:
        tree = (tree, arg)
    return (tree, END), length


def to_string(tree) -> str:
    if isinstance(tree, tuple):
        return f"( {to_string(tree[0])} {to_string(tree[1])} )"
    return str(tree)


def _flatten(tree) -> list:
    if isinstance(tree, tuple):
        return _flatten(tree[0]) + _flatten(tree[1])
    return [tree]


def evaluate_tree(tree) -> int:
    """The label of a generated tree."""
    items = _flatten(tree)

    def parse(pos):
        op, args, pos = items[pos], [], pos + 1
        while items[pos] != END:
            if isinstance(items[pos], str):
                value, pos = parse(pos)
            else:
                value, pos = items[pos], pos + 1
            args.append(value)
        return apply_operator(op, args), pos + 1

    if not isinstance(items[0], str):
        return int(items[0])
    return parse(0)[0]


def apply_operator(op: str, args: list[int]) -> int:
    """`op` is one of OPERATORS: the generator draws no other."""
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[MED":
        return int(statistics.median(args))
    return sum(args) % 10  # [SM


def generate(
    num_examples: int,
    *,
    seed: int,
    min_length: int = 500,
    max_length: int = 2000,
    max_depth: int = 10,
    max_args: int = 10,
    progress: bool = False,
) -> list[tuple[str, int]]:
    """`num_examples` distinct (source, label) pairs with min_length < length < max_length, in generation order."""
    if min_length + 1 >= max_length:
        raise ValueError(f"need min_length + 1 < max_length, got {min_length} and {max_length}")
    if max_args < 2 or max_depth < 1:
        raise ValueError(f"need max_args >= 2 and max_depth >= 1, got {max_args} and {max_depth}")
    rng = random.Random(seed)
    seen: dict[str, int] = {}
    attempts = 0
    bar = WorkProgress("generating ListOps", total=num_examples, unit="examples") if progress else None
    while len(seen) < num_examples:
        attempts += 1
        if attempts > 1000 * num_examples + 100000:
            raise RuntimeError(
                f"ListOps generator found only {len(seen)} of {num_examples} trees with {min_length} < length < "
                f"{max_length} (depth <= {max_depth}, args <= {max_args}); widen the bounds"
            )
        tree, length = _generate_tree(rng, 1, max_depth, max_args)
        if min_length < length < max_length:
            source = to_string(tree)
            if source not in seen:
                seen[source] = evaluate_tree(tree)
                if bar is not None:
                    bar.update()
    if bar is not None:
        bar.close()
    return list(seen.items())


def write_dataset(
    output_dir: str | os.PathLike, *, num_train: int, num_valid: int, num_test: int, **generator
) -> dict[str, Path]:
    """Generates all splits at once (distinct across splits, as LRA) and writes the three TSVs.

    `generator`: `generate`'s keyword arguments (seed, min_length, max_length, max_depth, max_args)."""
    sizes = {"num_train": num_train, "num_valid": num_valid, "num_test": num_test}
    empty = [f"{name}={n}" for name, n in sizes.items() if n < 1]
    if empty:
        raise ValueError(f"ListOps split sizes must be at least 1: {', '.join(empty)}")
    rows = [f"{source}\t{target}\n" for source, target in generate(sum(sizes.values()), progress=True, **generator)]
    cuts = (0, num_train, num_train + num_valid, len(rows))
    lines = {split: rows[lo:hi] for split, (lo, hi) in zip(SPLIT_FILES, itertools.pairwise(cuts), strict=True)}
    return input_pipeline.write_split_files(output_dir, SPLIT_FILES, lines, header="Source\tTarget\n")


def tokenize(source: str) -> list[str]:
    """LRA's pipeline drops parentheses; `]` stays a token of its own."""
    return [tok for tok in source.split() if tok not in ("(", ")")]


def encode(source: str) -> list[int]:
    """Token ids; an unknown token raises KeyError naming it."""
    tokens = tokenize(source)
    if unknown := [tok for tok in tokens if tok not in TOKEN_IDS]:
        raise KeyError(f"unknown ListOps token {unknown[0]!r}")
    return [TOKEN_IDS[tok] for tok in tokens]


def ensure_data(data: ml_collections.ConfigDict) -> Path:
    """data.dir with the three TSVs, generated there first when it has none and data.generate is set."""

    def generate(data_dir):
        g = data.generator
        print(
            f"generating ListOps into {data_dir} ({g.num_train}/{g.num_valid}/{g.num_test}, seed {g.seed})", flush=True
        )
        write_dataset(data_dir, **g.to_dict())  # the generator section's fields are write_dataset's arguments

    return input_pipeline.ensure_split_files(data, SPLIT_FILES, what="ListOps TSVs", generate=generate)


def prepare(config: ml_collections.ConfigDict) -> dict[str, Path]:
    """Generates data.dir if needed and caches every split (the loop runs it on process 0 first)."""
    data_dir = ensure_data(config.data)
    return {
        split: input_pipeline.cache_classification_split(
            data_dir / SPLIT_FILES[split],
            encode=encode,
            vocab=VOCAB,
            num_classes=NUM_CLASSES,
            max_length=config.model.max_length,
            truncate=config.data.truncate,
            cache_dir=config.data.cache_dir or data_dir,
        )
        for split in SPLIT_FILES
    }


def held_out_majority_rate(config: ml_collections.ConfigDict) -> float:
    """The accuracy of always guessing the most frequent class of `config`'s test split (the cache its runs read)."""
    return input_pipeline.majority_rate(prepare(config)["test"])


def train_label_entropy(config: ml_collections.ConfigDict) -> float:
    """The entropy of the classes of `config`'s training split: the training loss of a model that learned only
    how often each class occurs (`input_pipeline.label_entropy`)."""
    return input_pipeline.label_entropy(prepare(config)["train"])


def make_task(config: ml_collections.ConfigDict) -> Task:
    return input_pipeline.classification_task(
        config,
        lambda: prepare(config),
        vocab_size=len(VOCAB),
        num_classes=NUM_CLASSES,
        config_sections=CONFIG_SECTIONS,
    )


def write_data(output_dir: str, flags: Mapping[str, Any]) -> dict[str, Path]:
    """`lra-data listops`: the generator's fields from the command line."""
    names = ("num_train", "num_valid", "num_test", "min_length", "max_length", "max_depth", "max_args", "seed")
    return write_dataset(output_dir, **{name: flags[name] for name in names})


SPECS = (
    TaskSpec(
        "listops",
        make_task,
        len(VOCAB),
        NUM_CLASSES,
        column=1,
        demo_cut={"steps": 200},
        # docs/tasks.md: the LRA paper's Table 1 and the trainable-kernel paper's Table 1.
        published={
            "LRA paper: Transformer": 36.37,
            "LRA paper: Linear Trans.": 16.13,
            "LRA paper: Performer": 18.01,
            "kernel paper: linear kernel": 18.54,
            "kernel paper: 2×GLU": 18.42,
            "kernel paper: 3×AOGLU": 18.45,
        },
        write_data=write_data,
        data_files=input_pipeline.release_files(SPLIT_FILES),
        data_flags=(
            DataFlag("num_train", 96000, "training examples."),
            DataFlag("num_valid", 2000, "validation examples."),
            DataFlag("num_test", 2000, "test examples."),
            DataFlag("min_length", 500, "keep expressions longer than this (tokens)."),
            DataFlag("max_length", 2000, "keep expressions shorter than this (tokens)."),
            DataFlag("max_depth", 10, "maximum nesting depth."),
            DataFlag("max_args", 10, "maximum arguments per operator (at least 2)."),
        ),
    ),
)

__all__ = ["VOCAB", "encode", "evaluate_tree", "generate", "make_task", "write_dataset"]
