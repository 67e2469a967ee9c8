"""Config fields declared once: name, default, allowed values and help.

The shared config sections (`train`, `mesh` in zoo/training/config.py, `model` in zoo/models/config.py) and each
task config module's own (`CONFIG_SECTIONS`) are tuples of `Field`s: their defaults build the sections, their rules
validate them (zoo/training/validate.py), their help is `--help` and docs/config.md (`zoo.config_catalog`). This
module imports nothing of the project.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import math
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

import ml_collections


@dataclasses.dataclass(frozen=True)
class Rule:
    """What values a field takes: `check(value)` is True for them; `what` completes "x=v must ..."; `kind` says it
    in a word for tables ("int ≥ 0")."""

    check: Callable[[Any], bool]
    what: str
    kind: str
    each: Rule | None = None  # a mapping's rule for each of its values: a problem names the entry (`variants.relu`)


def _number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def integer(low: int, high: int | None = None) -> Rule:
    """An integer ≥ low and, when `high` is given, ≤ high (a size's bound refuses a value that would hang the
    model's construction or exhaust memory)."""
    ok = lambda x: isinstance(x, int) and not isinstance(x, bool) and low <= x <= (math.inf if high is None else high)
    if high is None:
        return Rule(ok, f"must be an integer ≥ {low}", f"int ≥ {low}")
    return Rule(ok, f"must be an integer in [{low}, {high:,}]", f"int in [{low}, {high:,}]")


def at_least(low: float) -> Rule:
    return Rule(lambda x: _number(x) and x >= low, f"must be a number ≥ {low}", f"number ≥ {low}")


def above(low: float) -> Rule:
    return Rule(lambda x: _number(x) and x > low, f"must be a number > {low}", f"number > {low}")


def in_range(low: float, high: float) -> Rule:
    """[low, high)"""
    return Rule(lambda x: _number(x) and low <= x < high, f"must be in [{low}, {high})", f"[{low}, {high})")


def closed(low: float, high: float) -> Rule:
    """[low, high]"""
    return Rule(lambda x: _number(x) and low <= x <= high, f"must be in [{low}, {high}]", f"[{low}, {high}]")


def fraction() -> Rule:
    """A number in the open interval (0, 1)."""
    return Rule(lambda x: _number(x) and 0 < x < 1, "must be in (0, 1)", "(0, 1)")


FINITE = Rule(_number, "must be a finite number", "number")


def one_of(*values) -> Rule:
    listed = ", ".join(map(str, values))
    return Rule(lambda x: x in values, f"must be one of {listed}", f"one of {listed}")


BOOLEAN = Rule(lambda x: isinstance(x, bool), "must be True or False", "bool")
TEXT = Rule(lambda x: isinstance(x, str), "must be a string", "str")
# A folder a run reads or writes: '' would silently mean the current directory.
PATH = Rule(
    lambda x: isinstance(x, str) and x.strip() != "", "must be a path (not empty: '' is the current directory)", "path"
)


def integers(low: int, high: int | None = None, *, empty: bool = False, distinct: bool = False) -> Rule:
    """A list of integers ≥ low (and ≤ high when given): non-empty unless `empty`, each once when `distinct`."""
    one = integer(low, high)

    def ok(x) -> bool:
        listed = isinstance(x, list | tuple) and (empty or len(x) > 0) and all(one.check(v) for v in x)
        return listed and (not distinct or len(set(x)) == len(x))

    bound = f"≥ {low}" if high is None else f"in [{low}, {high:,}]"
    what = f"{'' if empty else 'non-empty '}list of {'distinct ' if distinct else ''}integers {bound}"
    return Rule(ok, f"must be a {what}", f"list of int {bound}")


def is_section(x) -> bool:
    """A config section or a dict (a ConfigDict is not a `Mapping`)."""
    return isinstance(x, ml_collections.ConfigDict | Mapping)


SECTION = Rule(is_section, "must be a section of config fields, nested as the config is ({'train': {...}})", "section")


def mapping_of(each: Rule, what: str, *, empty: bool = True) -> Rule:
    """A mapping (non-empty unless `empty`) of names to values that satisfy `each`; a problem with one value names
    its entry (`variants.relu=... must be ...`), one with the mapping itself says `what`."""
    ok = lambda x: is_section(x) and (empty or len(x) > 0) and all(each.check(v) for v in x.values())
    return Rule(ok, what, f"{{name: {each.kind}}}", each)


@dataclasses.dataclass(frozen=True)
class Field:
    """One config field; one with `fields` is a nested section of those (see `nested`)."""

    name: str
    default: Any
    rule: Rule | None  # None: checked elsewhere (a mixer name against the registry) or a nested section
    help: str
    fields: tuple[Field, ...] = ()


def nested(name: str, fields: Iterable[Field], help: str, rule: Rule | None = None) -> Field:
    """A section inside a section (`data.generator.seed`); `rule`, when given, is what the fields must satisfy
    together (checked once each passes its own)."""
    return Field(name, None, rule, help, tuple(fields))


def _defaults(fields: Iterable[Field]) -> dict[str, Any]:
    return {f.name: _defaults(f.fields) if f.fields else f.default for f in fields}


def section(fields: Iterable[Field], **overrides) -> ml_collections.ConfigDict:
    """A config section of the fields' defaults, with `overrides` (which must name declared fields)."""
    fields = tuple(fields)
    cfg = ml_collections.ConfigDict(copy.deepcopy(_defaults(fields)))  # a list default is the config's own
    unknown = sorted(set(overrides) - set(cfg.keys()))
    if unknown:
        raise ValueError(f"unknown config field(s) {', '.join(unknown)}; valid: {', '.join(f.name for f in fields)}")
    cfg.update(overrides)
    return cfg


def _path(prefix: str, name: str) -> str:
    """`prefix.name`; `name` alone at a config's top level (prefix '')."""
    return f"{prefix}.{name}" if prefix else name


def _shown(value):
    return value.to_dict() if isinstance(value, ml_collections.ConfigDict) else value


def completed(fields: Iterable[Field], config: Mapping | ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` (a file's own, not built from the fields) with the declared fields it leaves out at their defaults,
    nested sections' too; a name no field declares is an error naming it. Values are kept as given, not cast."""

    def merge(fields: tuple[Field, ...], given: Mapping, prefix: str) -> dict:
        declared = {f.name: f for f in fields}
        if unknown := [_path(prefix, name) for name in given if name not in declared]:
            raise ValueError(f"unknown config field(s) {', '.join(unknown)}; valid: {', '.join(declared)}")
        out = copy.deepcopy(_defaults(fields))
        for name, value in given.items():
            inner = declared[name].fields
            out[name] = merge(inner, value, _path(prefix, name)) if inner and is_section(value) else value
        return out

    return ml_collections.ConfigDict(merge(tuple(fields), _shown(config), ""))


def rule_problems(config: ml_collections.ConfigDict, rules: Mapping[str, Rule], prefix: str) -> list[str]:
    """One line per field of `config` whose value breaks its rule in `rules`, naming the field and the value (the
    entry of a mapping, for a rule with `each`)."""
    out = []
    for name, rule in rules.items():
        if name in config and not rule.check(value := config[name]):
            path = _path(prefix, name)
            entries = value.items() if rule.each is not None and is_section(value) else ()
            bad = [f"{path}.{k}={_shown(v)!r} {rule.each.what}" for k, v in entries if not rule.each.check(v)]
            out += bad or [f"{path}={_shown(value)!r} {rule.what}"]
    return out


def problems(config: ml_collections.ConfigDict, fields: Iterable[Field], prefix: str) -> list[str]:
    """`rule_problems` for declared fields (those with a rule), nested sections' fields included; prefix '': the
    fields are the config's top level."""
    fields = tuple(fields)
    out = rule_problems(config, {f.name: f.rule for f in fields if f.rule is not None and not f.fields}, prefix)
    for f in fields:
        if f.fields and f.name in config:
            value = config[f.name]
            if not is_section(value):
                out.append(
                    f"{_path(prefix, f.name)}={value!r} must be a section of {', '.join(g.name for g in f.fields)}"
                )
            elif inner := problems(value, f.fields, _path(prefix, f.name)):
                out += inner
            elif f.rule is not None:
                out += rule_problems(config, {f.name: f.rule}, prefix)
    return out


def flat(fields: Iterable[Field], prefix: str) -> list[tuple[str, Field]]:
    """(dotted name, field) of every leaf field, nested sections' fields in place of their section."""
    out = []
    for f in fields:
        out += flat(f.fields, _path(prefix, f.name)) if f.fields else [(_path(prefix, f.name), f)]
    return out


def help_lines(fields: Iterable[Field], prefix: str) -> list[str]:
    """`prefix.name  (kind, default D)  help` lines, for --help."""
    return [f"  {name} ({_kind(f)}; default {_default(f)}): {f.help}" for name, f in flat(fields, prefix)]


def markdown_table(fields: Iterable[Field], prefix: str) -> str:
    lines = ["| field | values | default | meaning |", "|---|---|---|---|"]
    for name, f in flat(fields, prefix):
        meaning = f.help.replace("|", "\\|")
        lines.append(f"| `{name}` | {_kind(f)} | {_default(f, '`')} | {meaning} |")
    return "\n".join(lines)


def _kind(f: Field) -> str:
    return f.rule.kind if f.rule is not None else "see meaning"


def _default(f: Field, quote: str = "") -> str:
    return "—" if f.default is None else f"{quote}{f.default!r}{quote}"  # None: filled in by the section


Sections = Mapping[str, tuple[Field, ...]]


def config_file_sections(*modules: ModuleType) -> dict[str, Sections]:
    """{config file's path in the repository: its `CONFIG_SECTIONS`} of task config modules."""
    return {module.__name__.replace(".", "/") + ".py": module.CONFIG_SECTIONS for module in modules}


def package_config_modules(package: str) -> list[ModuleType]:
    """The modules of a configs package (`lra_flax.configs`) that declare `CONFIG_SECTIONS`, by file name."""
    root = importlib.import_module(package)
    found = [importlib.import_module(f"{package}.{info.name}") for info in pkgutil.iter_modules(root.__path__)]
    return [module for module in found if hasattr(module, "CONFIG_SECTIONS")]
