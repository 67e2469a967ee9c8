"""One validation pass over a resolved task config, before anything touches the workdir.

Every field of the shared sections, the task's own and every mixer's options (the inactive mixers' too: a typo
must not wait for the day that mixer is chosen) is checked against the rule it is declared with; then the mixers
the model runs, and any other whose options differ from its defaults, are built (shapes only) for what their
options must satisfy together. All problems are reported at once, each naming its field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import ml_collections
from absl import logging
from flax import nnx

from zoo import mixers
from zoo.config_fields import Field, Rule
from zoo.config_fields import problems as field_problems
from zoo.files import is_url
from zoo.models.config import MODEL_FIELDS, mixer_config, mixer_name_problems, mixer_option_problems
from zoo.training.config import MESH_FIELDS, TRAIN_FIELDS, check_output_dir
from zoo.training.flops import cpu_peak_from_env
from zoo.training.mesh import PARAMETER_AXES

# Mixer options by name, from the mixers' declarations (the registry keeps one rule per name); the tests and the
# bad-input table take their cases from it.
OPTION_RULES: dict[str, Rule] = {
    f.name: f.rule for name in mixers.names() for f in mixers.option_fields(name) if f.rule is not None
}


# The outcome of building a mixer from a config, by the config's content: the build is deterministic, and a
# process that validates many configs (lra-compare, the studies, the tests) would otherwise trace the mixers'
# construction again for each (~50 ms a mixer).
_BUILD_OUTCOMES: dict[str, str | None] = {}


def _build_problem(cfg: ml_collections.ConfigDict) -> str | None:
    """The first line of the error that building the mixer of `cfg` raises, or None when it builds."""
    key = json.dumps(cfg.to_dict(), sort_keys=True, default=repr)
    if key not in _BUILD_OUTCOMES:
        try:  # shapes only: the mixer's own checks (enums, divisibility) without allocating anything
            nnx.eval_shape(lambda: mixers.build(cfg, rngs=nnx.Rngs(0), checked=True))  # MODEL_FIELDS checked them
            _BUILD_OUTCOMES[key] = None
        except (ValueError, TypeError) as e:
            _BUILD_OUTCOMES[key] = str(e).splitlines()[0]
    return _BUILD_OUTCOMES[key]


def _mixer_problems(model: ml_collections.ConfigDict) -> list[str]:
    """Every mixer's options by their rules; built are the mixers `model.mixer` and `model.cross_mixer` name and
    those whose options were changed (an unused mixer at its defaults is not this run's concern, and building all
    nine took ~0.45 s of each command's start)."""
    active = {model.mixer, model.get("cross_mixer")}
    problems = []
    for name in sorted(model.mixer_options.keys()):
        options = model.mixer_options[name]
        found = mixer_option_problems(name, options)  # the rules models built from Python are checked by too
        if found or (name not in active and options.to_dict() == mixers.default_options(name)):
            problems += found
            continue
        if (problem := _build_problem(mixer_config(model, name=name))) is not None:
            problems.append(f"model.mixer_options.{name}: {problem}")
    return problems


def _url_data_paths(section, prefix: str) -> list[str]:
    """Data paths are read through the local filesystem (memory-mapped caches, directory listings): a URL
    there would be taken for a relative local path, so it is refused by name. Workdirs may be URLs."""
    if not isinstance(section, ml_collections.ConfigDict):
        return []
    problems = []
    for key, value in section.items():
        if isinstance(value, ml_collections.ConfigDict):
            problems += _url_data_paths(value, f"{prefix}.{key}")
        elif isinstance(value, str) and is_url(value):
            problems.append(f"{prefix}.{key}={value} must be a local path (copy the data to local disk first)")
        elif isinstance(value, str) and value and key.endswith("dir") and os.path.isfile(value):
            problems.append(f"{prefix}.{key}={value} is a file, not a directory")
    return problems


def _cache_dir_problems(data) -> list[str]:
    """The run writes its caches (tokenizers, tokenised splits) into data.cache_dir, or beside the data when that
    is '': a directory it cannot write is found here, not after minutes of preparing data."""
    if not isinstance(data, ml_collections.ConfigDict) or "cache_dir" not in data:
        return []
    field, path = ("data.cache_dir", data.cache_dir) if data.cache_dir else ("data.dir", data.get("dir", ""))
    if not isinstance(path, str) or not path or is_url(path) or os.path.isfile(path):
        return []  # nothing to check, or a problem reported by its own rule
    try:
        check_output_dir(path, field)
    except ValueError as e:
        where = "" if field == "data.cache_dir" else "; set data.cache_dir to a directory this run can write"
        return [f"{e} (the run's caches are written there{where})"]
    return []


def config_problems(
    config: ml_collections.ConfigDict, sections: Mapping[str, tuple[Field, ...]] | None = None
) -> list[str]:
    """Every problem found in `config`, one line each naming the field; empty when it is valid. `sections`: the
    task's own declared sections (`Task.config_sections`: its data section, ...), checked like the shared ones."""
    problems = field_problems(config.train, TRAIN_FIELDS, "train") if "train" in config else []
    if "train" in config:
        try:
            cpu_peak_from_env()
        except ValueError as e:
            problems.append(str(e))
    if "mesh" in config:
        problems += field_problems(config.mesh, MESH_FIELDS, "mesh")
        for name, axis in config.mesh.get("rules", {}).items():
            if axis not in ("", *PARAMETER_AXES):
                problems.append(f"mesh.rules.{name}={axis!r} must be one of {', '.join(PARAMETER_AXES)} or ''")
    for name, fields in (sections or {}).items():
        if name in config:
            problems += field_problems(config[name], fields, name)
    problems += _url_data_paths(config.get("data"), "data")
    problems += _cache_dir_problems(config.get("data"))
    if "model" in config:
        model = config.model
        problems += field_problems(model, MODEL_FIELDS, "model")
        if not problems:
            problems += mixer_name_problems(model)
        if not problems:
            problems += _mixer_problems(model)
    return problems


def validate_config(config: ml_collections.ConfigDict, sections: Mapping[str, tuple[Field, ...]] | None = None) -> None:
    """Raises ValueError listing every problem (see `config_problems`); warns about legal oddities."""
    problems = config_problems(config, sections)
    if problems:
        raise ValueError("invalid config: " + "; ".join(problems))  # one line: CLIs print errors as one
    train = config.get("train")
    if train is not None and 0 < train.steps < train.warmup_steps:
        logging.warning(
            "train.warmup_steps=%d exceeds train.steps=%d: the learning rate never finishes warming up",
            train.warmup_steps,
            train.steps,
        )
