"""Name → mixer class and its options, declared once (`zoo.config_fields.Field`); unknown names and fields are
errors that list what is valid."""

from __future__ import annotations

import dataclasses

import ml_collections
from absl import logging
from flax import nnx

from kernels.options import IMPLS
from zoo import config_fields
from zoo.config_fields import BOOLEAN, Field, Rule, above, in_range, integer, one_of
from zoo.layers.common import DTYPES
from zoo.mixers.attention import ATTENTION_INITS

# Size bounds far above any model this code is for, low enough that a typo is refused in one line instead of a
# model that hangs or exhausts memory (zoo.models.config's MODEL_FIELDS bound the same fields with them).
MAX_WIDTH = 2**16
MAX_LENGTH = 2**20

# Fields every mixer takes from the model config; the rest are the mixer's own options.
SHARED_FIELDS = {
    "d_model": 256,
    "num_heads": 4,
    "max_length": 512,
    "dtype": "float32",
    "layer_norm_eps": 1e-6,
    "gelu_approximate": True,
    # Attention-type mixers (zoo.mixers.attention): q/k/v width (0: d_model), projection biases, dropout on the
    # attention weights where a mixer forms them; the model section's fields of the same names.
    "qkv_dim": 0,
    "attention_bias": True,
    "attention_dropout": 0.0,
    "attention_init": "xavier_uniform",
}
# Their rules, declared once: `build` checks them, and MODEL_FIELDS gives them to model.<name>.
SHARED_RULES: dict[str, Rule] = {
    "d_model": integer(1, MAX_WIDTH),
    "num_heads": integer(1, 4096),
    "max_length": integer(1, MAX_LENGTH),
    "dtype": one_of(*DTYPES),
    "layer_norm_eps": above(0),
    "gelu_approximate": BOOLEAN,
    "qkv_dim": integer(0, MAX_WIDTH),
    "attention_bias": BOOLEAN,
    "attention_dropout": in_range(0, 1),
    "attention_init": one_of(*ATTENTION_INITS),
}


# The option every mixer that calls a `kernels` op has, with one meaning everywhere.
IMPL_OPTION = Field(
    "impl",
    "auto",
    one_of(*IMPLS),
    "kernel implementation: auto (kernels.auto's table), reference, xla, triton, mosaic_gpu, mosaic_tpu",
)


@dataclasses.dataclass(frozen=True)
class _Entry:
    cls: type[nnx.Module]
    options: tuple[Field, ...]


_REGISTRY: dict[str, _Entry] = {}


def register(name: str, cls: type[nnx.Module], options: tuple[Field, ...] = ()) -> None:
    """Registers `cls(cfg, *, rngs)` under `name` with its own options (`model.mixer_options.<name>.*`). The class
    counts its model FLOPs of one forward pass over one sequence: `cls.forward_flops(cfg, length, *, causal)`."""
    if name in _REGISTRY:
        raise ValueError(f"mixer {name!r} is registered twice")
    if not callable(getattr(cls, "forward_flops", None)):
        raise TypeError(
            f"mixer {name!r}: {cls.__name__} has no forward_flops(cfg, length, *, causal) (its model FLOPs per "
            "sequence, zoo/training/flops.py); attention-type mixers inherit it from MultiHeadMixer"
        )
    names_ = [field.name for field in options]
    clash = set(names_) & (set(SHARED_FIELDS) | {"name"})
    if clash:
        raise ValueError(f"mixer {name!r} options {sorted(clash)} clash with shared fields")
    if len(set(names_)) != len(names_):
        raise ValueError(f"mixer {name!r} declares an option twice: {names_}")
    kind = lambda field: field.rule.kind if field.rule is not None else None
    declared = {f.name: kind(f) for entry in _REGISTRY.values() for f in entry.options}
    for field in options:  # a name means the same thing, with the same rule, in every mixer that has it
        if field.name in declared and declared[field.name] != kind(field):
            raise ValueError(
                f"mixer {name!r} declares option {field.name} as {kind(field)}; another mixer as {declared[field.name]}"
            )
    _REGISTRY[name] = _Entry(cls, tuple(options))


def names() -> list[str]:
    """Every registered mixer name, sorted."""
    return sorted(_REGISTRY)


def _entry(name: str) -> _Entry:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown mixer {name!r}; valid mixers: {', '.join(names())}") from None


def option_fields(name: str) -> tuple[Field, ...]:
    """Mixer `name`'s own options, declared."""
    return _entry(name).options


def default_options(name: str) -> dict:
    """Mixer `name`'s options at their declared defaults."""
    return {field.name: field.default for field in _entry(name).options}


def forward_flops(cfg: ml_collections.ConfigDict, length: int, *, causal: bool) -> float:
    """Model FLOPs of mixer `cfg.name`'s forward pass over one sequence of `length` tokens."""
    return float(_entry(cfg.name).cls.forward_flops(cfg, length, causal=causal))


def forms_attention_weights(name: str) -> bool:
    """Whether mixer `name` forms attention probabilities (so that model.attention_dropout applies to it)."""
    return getattr(_entry(name).cls, "has_attention_weights", False)


def default_config(name: str) -> ml_collections.ConfigDict:
    """A complete, locked config for `name`: shared fields (d_model, num_heads, max_length, dtype) and options."""
    cfg = ml_collections.ConfigDict({"name": name, **SHARED_FIELDS, **default_options(name)})
    cfg.lock()
    return cfg


def options_config() -> ml_collections.ConfigDict:
    """`{name: options}` for every mixer, so a task config can expose each mixer's fields as flags."""
    return ml_collections.ConfigDict({name: default_options(name) for name in names()})


_IGNORED_DROPOUT: set[str] = set()  # mixers already said to ignore attention_dropout


def build(cfg: ml_collections.ConfigDict, *, rngs: nnx.Rngs, checked: bool = False) -> nnx.Module:
    """Builds the mixer `cfg.name`; a field the mixer does not know, or a value its rule refuses, is an error naming
    it. `checked`: the caller has checked the fields already (a model's blocks: `check_model_fields`)."""
    expected = default_config(cfg.name)
    unknown = sorted(set(cfg.keys()) - set(expected.keys()))
    if unknown:
        raise ValueError(
            f"mixer {cfg.name!r} has no field(s) {unknown}; valid fields: {', '.join(sorted(expected.keys()))}"
        )
    full = expected.copy_and_resolve_references()
    full.update(cfg)
    if not checked:  # the declared rules, for mixers built from Python (the commands check them before building)
        problems = config_fields.rule_problems(full, SHARED_RULES, "model")
        problems += config_fields.problems(full, _entry(cfg.name).options, f"model.mixer_options.{cfg.name}")
        if problems:
            raise ValueError("; ".join(problems))
    if full.attention_dropout and not forms_attention_weights(cfg.name) and cfg.name not in _IGNORED_DROPOUT:
        _IGNORED_DROPOUT.add(cfg.name)  # once a process: studies build many models
        logging.warning(
            "attention_dropout=%s does not apply to mixer %r: it never forms attention weights",
            full.attention_dropout,
            cfg.name,
        )
    return _entry(cfg.name).cls(full, rngs=rngs)
