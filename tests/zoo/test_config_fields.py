"""Config fields are declared once (zoo.config_fields): the sections, their validation, --help and docs/config.md
all come from the declarations, so none of them can drift from the others."""

import importlib
from pathlib import Path

import ml_collections
import pytest
from etils import epath

from zoo import config_catalog, config_fields, mixers
from zoo.models import model_config
from zoo.models.encoder import REMAT_POLICIES
from zoo.training import cli, mesh_config, train_config
from zoo.training.validate import OPTION_RULES, config_problems

SECTIONS = config_catalog.declared_sections()
TASK_CONFIGS = ("lra_flax.configs", "mt_flax.configs", "mlm_flax.configs")
CONFIG_MODULES = [m for package in TASK_CONFIGS for m in config_fields.package_config_modules(package)]
BUILT = {"train": train_config(), "model": model_config(), "mesh": mesh_config()}


@pytest.mark.parametrize("name", list(SECTIONS))
def test_a_section_holds_exactly_its_declared_fields_at_their_defaults(name):
    fields = SECTIONS[name]
    assert set(BUILT[name].keys()) == {f.name for f in fields}
    assert len({f.name for f in fields}) == len(fields)  # each declared once
    for f in fields:
        if f.default is not None:
            value = BUILT[name][f.name]
            assert (value.to_dict() if isinstance(value, ml_collections.ConfigDict) else value) == f.default, f.name
        if f.rule is not None:
            assert f.rule.check(f.default), f"{name}.{f.name}'s default {f.default!r} breaks its own rule"


def test_every_declared_field_has_help_and_a_rule_unless_checked_elsewhere():
    unchecked = {f"{n}.{f.name}" for n, fields in SECTIONS.items() for f in fields if f.rule is None}
    # validate.py checks these: mixer names against the registry, options per mixer, rules per entry
    assert unchecked == {"model.mixer", "model.cross_mixer", "model.mixer_options", "mesh.rules"}
    assert all(len(f.help) > 5 for fields in SECTIONS.values() for f in fields)


def test_an_undeclared_override_is_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown config field\(s\) stepz; valid: steps, batch_size"):
        train_config(stepz=3)


def test_validation_uses_the_declared_rules():
    mesh = mesh_config(fsdp=0)
    mesh.rules.embed = "batch"
    config = {"train": train_config(steps=-1), "mesh": mesh, "model": model_config(norm="middle")}
    assert config_problems(ml_collections.ConfigDict(config)) == [
        "train.steps=-1 must be an integer in [0, 1,000,000,000]",
        "mesh.fsdp=0 must be -1 (every remaining device) or an integer ≥ 1",
        "mesh.rules.embed='batch' must be one of fsdp, tensor or ''",
        "model.norm='middle' must be one of pre, post",
    ]
    model = ml_collections.ConfigDict({"model": model_config(cross_mixer="softmaxx")})
    assert config_problems(model)[0].startswith("model.cross_mixer: unknown mixer 'softmaxx'; valid mixers: ")


def test_help_lists_every_declared_field():
    text = cli.config_fields_help()
    for name, fields in {**SECTIONS, **config_catalog.mixer_sections()}.items():
        for f in fields:
            assert f"  {name}.{f.name} (" in text, f.name


@pytest.mark.parametrize("mixer", mixers.names())
def test_a_mixer_s_options_are_its_declared_fields_each_with_a_rule_and_help(mixer):
    fields = mixers.option_fields(mixer)
    assert dict(model_config().mixer_options[mixer]) == {f.name: f.default for f in fields}
    for f in fields:
        assert f.rule is not None and f.rule.check(f.default) and len(f.help) > 5, f.name


def test_a_mixer_declaring_a_known_option_name_with_another_rule_is_refused_when_it_registers():
    from zoo.config_fields import Field, one_of
    from zoo.mixers.attention import MultiHeadMixer

    with pytest.raises(ValueError, match=r"mixer 'odd' declares option impl as one of fast; another mixer as one of"):
        mixers.register("odd", MultiHeadMixer, (Field("impl", "fast", one_of("fast"), "a kernel of its own"),))
    assert "odd" not in mixers.names()


def test_an_option_name_has_one_rule_in_every_mixer_that_declares_it():
    kinds = {}
    for mixer in mixers.names():
        for f in mixers.option_fields(mixer):
            kinds.setdefault(f.name, set()).add(f.rule.kind)
    assert {name: k for name, k in kinds.items() if len(k) > 1} == {}
    assert set(OPTION_RULES) == set(kinds) and len(kinds) > 20


def test_docs_config_md_is_generated_from_the_declarations():
    committed = (Path(__file__).parents[2] / "docs" / "config.md").read_text()
    assert committed == config_catalog.markdown(TASK_CONFIGS), (
        "run: python -m zoo.config_catalog lra_flax.configs mt_flax.configs mlm_flax.configs > docs/config.md"
    )


def test_the_declared_remat_values_are_the_encoders_policies():
    remat = next(f for f in SECTIONS["model"] if f.name == "remat")
    assert remat.rule.kind == "one of " + ", ".join(("none", *REMAT_POLICIES))


def test_every_task_config_file_declares_its_own_sections():
    """Each config module of the three task packages (and no other) declares CONFIG_SECTIONS."""
    import pkgutil

    packages = {p: importlib.import_module(p).__path__ for p in TASK_CONFIGS}
    files = {f"{p}.{info.name}" for p, path in packages.items() for info in pkgutil.iter_modules(path)}
    shared = {"lra_flax.configs.common", "lra_flax.configs.compare"}  # pieces and sweeps, not task configs
    assert {m.__name__ for m in CONFIG_MODULES} == files - shared
    from lra_flax.tasks import REGISTRY  # every LRA row's config module is one of them

    assert {f"lra_flax.configs.{spec.config}" for spec in REGISTRY.values()} <= {m.__name__ for m in CONFIG_MODULES}


def _presets(module) -> list[str]:
    return list(getattr(module, "PRESETS", ())) or [f"{task},bert_demo" for task in module.TASKS]


@pytest.mark.parametrize("module", CONFIG_MODULES, ids=lambda m: m.__name__)
def test_every_preset_holds_exactly_the_declared_fields_of_each_own_section_and_passes_their_rules(module):
    for preset in _presets(module):
        config = module.get_config(preset)
        for name, fields in module.CONFIG_SECTIONS.items():
            declared = {dotted for dotted, _ in config_fields.flat(fields, name)}
            held = {f"{name}.{key}" for key in _flatten(config[name].to_dict())}
            assert held == declared, (preset, name, held ^ declared)
            assert config_fields.problems(config[name], fields, name) == [], preset
        for dotted, f in (x for fields in module.CONFIG_SECTIONS.values() for x in config_fields.flat(fields, "")):
            assert f.rule is not None and f.rule.check(f.default) and len(f.help) > 5, dotted


def _flatten(d: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in d.items():
        out += _flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}"]
    return out


def test_nested_sections_are_built_validated_and_listed_by_their_own_fields():
    from zoo.config_fields import BOOLEAN, Field, Rule, integer, nested, section

    inner = (Field("seed", 0, integer(0), "a seed"), Field("fast", True, BOOLEAN, "go fast"))
    fields = (Field("size", 3, integer(1), "a size"), nested("gen", inner, "the generator"))
    cfg = section(fields)
    assert cfg.to_dict() == {"size": 3, "gen": {"seed": 0, "fast": True}}
    cfg.gen.seed = -2
    cfg.size = 0
    assert config_fields.problems(cfg, fields, "data") == [
        "data.size=0 must be an integer ≥ 1",
        "data.gen.seed=-2 must be an integer ≥ 0",
    ]
    # A nested section's own rule, on its fields together, once each passes its own.
    ordered = nested("gen", inner, "ordered", Rule(lambda g: g["seed"] < 10 or g["fast"], "must be fast", "fast"))
    cfg = section((ordered,), gen={"seed": 12, "fast": False})
    assert config_fields.problems(cfg, (ordered,), "data") == ["data.gen={'fast': False, 'seed': 12} must be fast"]
    cfg.gen.seed = -1
    assert config_fields.problems(cfg, (ordered,), "data") == ["data.gen.seed=-1 must be an integer ≥ 0"]
    flat_cfg = ml_collections.ConfigDict({"size": 3, "gen": 7})
    assert config_fields.problems(flat_cfg, fields, "data") == ["data.gen=7 must be a section of seed, fast"]
    assert config_fields.help_lines(fields, "data")[1:] == [
        "  data.gen.seed (int ≥ 0; default 0): a seed",
        "  data.gen.fast (bool; default True): go fast",
    ]


def test_a_run_validates_its_task_s_own_sections_with_the_shared_ones_before_anything_is_written(tmp_path):
    from lra_flax.configs import listops
    from lra_flax.tasks import make_task
    from zoo.training.loop import check_run

    config = listops.get_config("demo")
    config.data.generator.max_args = 1
    config.train.steps = -1
    with pytest.raises(ValueError) as error:
        check_run(config, epath.Path(tmp_path / "run"), make_task(config))
    assert str(error.value) == (
        "invalid config: train.steps=-1 must be an integer in [0, 1,000,000,000]; "
        "data.generator.max_args=1 must be an integer in [2, 100]"
    )
    assert not (tmp_path / "run").exists()


def test_translation_refuses_a_book_in_two_splits_before_a_run():
    from mt_flax.configs import translation

    config = translation.get_config("demo")
    config.data.bible_books.test = (8, 32)  # Ruth is the valid split's book
    (problem,) = config_problems(config, translation.CONFIG_SECTIONS)
    assert problem.startswith("data.bible_books={") and problem.endswith("must give each book to one split at most")


def test_top_level_fields_and_a_mapping_s_entries_are_named_by_their_path():
    from zoo.config_fields import TEXT, Field, integer, integers, mapping_of, nested

    fields = (
        Field("names", {}, mapping_of(TEXT, "must map names to strings", empty=False), "names"),
        Field("seeds", [], integers(0, empty=True, distinct=True), "seeds"),
        nested("inner", (Field("steps", 1, integer(1), "steps"),), "inner"),
    )
    config = ml_collections.ConfigDict({"names": {"a": "x", "b": 3}, "seeds": [1, 1], "inner": {"steps": 0}})
    assert config_fields.problems(config, fields, "") == [
        "names.b=3 must be a string",
        "seeds=[1, 1] must be a list of distinct integers ≥ 0",
        "inner.steps=0 must be an integer ≥ 1",
    ]
    config.names, config.seeds = {}, []  # an empty list may be allowed, an empty mapping not
    assert config_fields.problems(config, fields[:2], "") == ["names={} must map names to strings"]
    assert [name for name, _ in config_fields.flat(fields, "")] == ["names", "seeds", "inner.steps"]
    assert config_fields.section(fields).seeds is not fields[1].default  # a list default is each config's own
