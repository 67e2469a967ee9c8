"""Config fields declared once: name, default, allowed values and help.

The shared config sections (`train`, `mesh` in zoo/training/config.py, `model` in zoo/models/config.py) are
tuples of `Field`s. Their defaults build the sections, their rules validate them (zoo/training/validate.py),
and their help is what the training commands' `--help` and docs/config.md print:

    python -m zoo.config_fields > docs/config.md     # the field tables (a test keeps the file current)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import ml_collections


@dataclasses.dataclass(frozen=True)
class Rule:
    """What values a field takes: `check(value)` is True for them; `what` completes "x=v must ...".
    `kind` says it in a word for tables ("int ≥ 0", "one of ...")."""

    check: Callable[[Any], bool]
    what: str
    kind: str


def _number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def integer(low: int, high: int | None = None) -> Rule:
    """An integer ≥ low and, when `high` is given, ≤ high: a size's upper bound refuses, in one line, a value
    that would otherwise hang the model's construction or exhaust memory before any other check could run."""
    if high is None:
        ok = lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= low
        return Rule(ok, f"must be an integer ≥ {low}", f"int ≥ {low}")
    ok = lambda x: isinstance(x, int) and not isinstance(x, bool) and low <= x <= high
    return Rule(ok, f"must be an integer in [{low}, {high:,}]", f"int in [{low}, {high:,}]")


def at_least(low: float) -> Rule:
    return Rule(lambda x: _number(x) and x >= low, f"must be a number ≥ {low}", f"number ≥ {low}")


def above(low: float) -> Rule:
    return Rule(lambda x: _number(x) and x > low, f"must be a number > {low}", f"number > {low}")


def in_range(low: float, high: float) -> Rule:
    """[low, high)"""
    return Rule(lambda x: _number(x) and low <= x < high, f"must be in [{low}, {high})", f"[{low}, {high})")


FINITE = Rule(_number, "must be a finite number", "number")


def one_of(*values) -> Rule:
    listed = ", ".join(map(str, values))
    return Rule(lambda x: x in values, f"must be one of {listed}", f"one of {listed}")


BOOLEAN = Rule(lambda x: isinstance(x, bool), "must be True or False", "bool")


@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    default: Any
    rule: Rule | None  # None: checked elsewhere (a mixer name against the registry, a nested section)
    help: str


def section(fields: Iterable[Field], **overrides) -> ml_collections.ConfigDict:
    """A config section of the fields' defaults, with `overrides` (which must name declared fields)."""
    fields = tuple(fields)
    cfg = ml_collections.ConfigDict({f.name: f.default for f in fields})
    unknown = sorted(set(overrides) - set(cfg.keys()))
    if unknown:
        raise ValueError(f"unknown config field(s) {', '.join(unknown)}; valid: {', '.join(f.name for f in fields)}")
    cfg.update(overrides)
    return cfg


def rule_problems(config: ml_collections.ConfigDict, rules: Mapping[str, Rule], prefix: str) -> list[str]:
    """One line per field of `config` whose value breaks its rule in `rules`, naming the field and the value."""
    out = []
    for name, rule in rules.items():
        if name in config and not rule.check(config[name]):
            out.append(f"{prefix}.{name}={config[name]!r} {rule.what}")
    return out


def problems(config: ml_collections.ConfigDict, fields: Iterable[Field], prefix: str) -> list[str]:
    """`rule_problems` for declared fields (those with a rule)."""
    return rule_problems(config, {f.name: f.rule for f in fields if f.rule is not None}, prefix)


def help_lines(fields: Iterable[Field], prefix: str) -> list[str]:
    """`prefix.name  (kind, default D)  help` lines, for --help."""
    return [f"  {prefix}.{f.name} ({_kind(f)}; default {_default(f)}): {f.help}" for f in fields]


def markdown_table(fields: Iterable[Field], prefix: str) -> str:
    lines = ["| field | values | default | meaning |", "|---|---|---|---|"]
    for f in fields:
        meaning = f.help.replace("|", "\\|")
        lines.append(f"| `{prefix}.{f.name}` | {_kind(f)} | {_default(f, '`')} | {meaning} |")
    return "\n".join(lines)


def _kind(f: Field) -> str:
    return f.rule.kind if f.rule is not None else "see meaning"


def _default(f: Field, quote: str = "") -> str:
    return "—" if f.default is None else f"{quote}{f.default!r}{quote}"  # None: filled in by the section


def declared_sections() -> dict[str, tuple[Field, ...]]:
    """Every shared section's fields by section name (imported here: the sections import this module)."""
    from zoo.models.config import MODEL_FIELDS
    from zoo.training.config import MESH_FIELDS, TRAIN_FIELDS

    return {"train": TRAIN_FIELDS, "model": MODEL_FIELDS, "mesh": MESH_FIELDS}


def mixer_sections() -> dict[str, tuple[Field, ...]]:
    """Every mixer's own options (`model.mixer_options.NAME`), declared in its module under zoo/mixers."""
    from zoo import mixers

    return {f"model.mixer_options.{name}": mixers.option_fields(name) for name in mixers.names()}


def markdown() -> str:
    """docs/config.md: every shared section's fields, then every mixer's options."""
    parts = [
        "# Config fields",
        "",
        "Every task config has these sections (`--config.SECTION.FIELD=value` on any training command). The",
        "tables are generated from the declarations in `zoo/training/config.py`, `zoo/models/config.py` and each",
        "mixer's module under `zoo/mixers` (`python -m zoo.config_fields > docs/config.md`); the same declarations",
        "give the defaults, the validation every run does before it writes anything, and `--help`. What the",
        "mixers compute: [mixers.md](mixers.md). Data sections are each task's: [tasks.md](tasks.md).",
    ]
    for name, fields in declared_sections().items():
        parts += ["", f"## `{name}`", "", markdown_table(fields, name)]
    parts += ["", "## Mixer options", "", "Every mixer's options, the inactive mixers' too, are validated."]
    for name, fields in mixer_sections().items():
        table = markdown_table(fields, name) if fields else "No options of its own."
        parts += ["", f"### `{name}`", "", table]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
