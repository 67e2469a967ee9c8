"""The config validation pass: every numeric field out of range and every bad enum is an error naming the
field, raised before anything touches the workdir; every shipped preset passes."""

import importlib
import re

import pytest

from lra_flax.configs import listops
from lra_flax.tasks import REGISTRY
from lra_flax.tasks import listops as listops_task
from zoo.models.config import MODEL_FIELDS
from zoo.training.config import MESH_FIELDS, TRAIN_FIELDS
from zoo.training.loop import train_and_evaluate
from zoo.training.validate import OPTION_RULES, config_problems

SECTION_RULES = {
    section: {f.name: f.rule for f in fields if f.rule is not None}
    for section, fields in (("train", TRAIN_FIELDS), ("model", MODEL_FIELDS), ("mesh", MESH_FIELDS))
}
TRAIN_RULES = SECTION_RULES["train"]

CANDIDATES = (-5, 2, 0, -5.0, 2.0, 0.0, float("nan"), "bogus")


def _bad_value(current, rule):
    """A value of the field's own type that the rule rejects (ConfigDict keeps types)."""
    ok = rule.check
    kind = float if isinstance(current, float) else type(current)
    for value in CANDIDATES:
        if isinstance(value, kind) and not isinstance(value, bool) and not ok(value):
            return value
    return None


def _cases():
    config = listops.get_config("demo")
    cases = []
    for section, rules in SECTION_RULES.items():
        for name, rule in rules.items():
            if name in config[section] and _bad_value(config[section][name], rule) is not None:
                cases.append(f"{section}.{name}")
    for mixer, options in config.model.mixer_options.items():
        for name, rule in OPTION_RULES.items():
            if name in options and _bad_value(options[name], rule) is not None:
                cases.append(f"model.mixer_options.{mixer}.{name}")
    return cases


CASES = _cases()


def test_the_cases_cover_every_numeric_train_field():
    assert {c.split(".")[1] for c in CASES if c.startswith("train.")} == set(TRAIN_RULES)
    assert {c.split(".")[1] for c in CASES if c.startswith("mesh.")} == {"data", "fsdp", "tensor", "sharding_tolerance"}
    assert len([c for c in CASES if c.startswith("model.mixer_options.")]) > 20


@pytest.mark.parametrize("path", CASES)
def test_an_out_of_range_field_is_named_and_the_workdir_untouched(path, tmp_path):
    config = listops.get_config("demo")
    *parents, leaf = path.split(".")
    node = config
    for part in parents:
        node = node[part]
    rules = OPTION_RULES if "mixer_options" in parents else SECTION_RULES[parents[0]]
    bad = _bad_value(node[leaf], rules[leaf])
    node[leaf] = bad
    workdir = tmp_path / "run"
    with pytest.raises(ValueError, match=re.escape(f"{path}={bad!r}")):
        train_and_evaluate(config, workdir, listops_task.make_task(config))
    assert not workdir.exists()


def test_an_inactive_mixers_bad_option_is_reported():
    config = listops.get_config("demo")
    config.model.mixer = "softmax"
    config.model.mixer_options.linear.feature_map = "bogus"
    config.model.mixer_options.linear.eps_mode = "sometimes"  # every broken option, each by its field
    assert config_problems(config) == [
        "model.mixer_options.linear.feature_map='bogus' must be one of " + _MAPS,
        "model.mixer_options.linear.eps_mode='sometimes' must be one of auto, add, guard",
    ]


_MAPS = "elu1, relu, favor, softplus, orth_softplus, glu, oglu, aoglu"


def test_the_mixers_the_model_runs_and_those_with_changed_options_are_built_once_per_process(monkeypatch):
    from zoo.training import validate

    built = []
    real_build = validate.mixers.build
    monkeypatch.setattr(validate, "_BUILD_OUTCOMES", {})
    monkeypatch.setattr(validate.mixers, "build", lambda cfg, **kw: built.append(cfg.name) or real_build(cfg, **kw))
    config = listops.get_config("demo")
    config.model.cross_mixer = "relu"  # the mixers model.mixer and model.cross_mixer name: built
    assert config_problems(config) == [] and built == ["relu"]  # the other mixers keep their defaults: not built
    assert config_problems(config) == [] and built == ["relu"]  # the same config: its outcome kept
    softmax = config.model.mixer_options.softmax  # unused, its options changed: built
    softmax.relative_buckets, softmax.implementation = 32, "xla"  # each valid alone, not together: the build says
    expected = [
        "model.mixer_options.softmax: softmax implementation='xla' takes no position bias; with relative_buckets=32 "
        "use one of auto, dense (JAX's dense attention)"
    ]
    assert config_problems(config) == expected and built == ["relu", "softmax"]
    assert config_problems(config) == expected and built == ["relu", "softmax"]  # the error kept
    config.model.mixer_options.linear.feature_map = "bogus"  # refused by its rule, before any build
    assert config_problems(config) == [
        "model.mixer_options.linear.feature_map='bogus' must be one of " + _MAPS,
        *expected,
    ] and built == ["relu", "softmax"]
    config.model.d_model = 48  # a shared field changes every mixer's config
    config.model.mixer_options.linear.feature_map = "elu1"
    softmax.implementation = "auto"
    assert config_problems(config) == [] and built[2:] == ["relu", "softmax"]


def test_an_unused_mixer_at_its_defaults_does_not_refuse_the_run(monkeypatch):
    """A build failure is the config's only where that mixer runs or its options were set."""
    from zoo.training import validate

    real_build = validate.mixers.build

    def build(cfg, **kw):
        if cfg.name == "linear":
            raise ValueError("linear cannot take these shapes")
        return real_build(cfg, **kw)

    monkeypatch.setattr(validate, "_BUILD_OUTCOMES", {})
    monkeypatch.setattr(validate.mixers, "build", build)
    config = listops.get_config("demo")
    assert config.model.mixer != "linear" and config_problems(config) == []
    config.model.mixer = "linear"
    assert config_problems(config) == ["model.mixer_options.linear: linear cannot take these shapes"]


def test_every_problem_is_reported_at_once():
    config = listops.get_config("demo")
    config.train.steps, config.train.learning_rate, config.model.dropout = -5, -1.0, 2.0
    problems = config_problems(config)
    assert problems[:2] == [
        "train.steps=-5 must be an integer in [0, 1,000,000,000]",
        "train.learning_rate=-1.0 must be a number > 0",
    ]
    assert "model.dropout=2.0 must be in [0, 1)" in problems


@pytest.mark.parametrize(
    "module",
    [
        *sorted({f"lra_flax.configs.{spec.config}" for spec in REGISTRY.values()}),
        "mt_flax.configs.translation",
        "mlm_flax.configs.pretrain",
    ],
)
def test_every_shipped_preset_validates(module):
    mod = importlib.import_module(module)
    for preset in mod.PRESETS:
        assert config_problems(mod.get_config(preset)) == [], preset
