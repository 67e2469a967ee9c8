"""The LRA task registry: every entry is consistent with the task it names, and the tools read it.

A task added to the registry reaches lra-data, lra-compare, the efficiency runs, the demo and the studies
without their code naming it; these tests fail if a tool keeps a list of its own again.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from flax import nnx

from lra_flax.configs import compare as compare_config
from lra_flax.tasks import REGISTRY, TASK_MODULES, data_writers, make_task, published_rows, reported_by, with_demo
from lra_flax.tasks.spec import DataFlag

ROOT = Path(__file__).parents[2]
# Where task names may still appear as literals (outside each task's own modules): `make demo`'s default task
# and the MLM studies' "text" corpus source, which is not an LRA task.
MAX_NAME_LITERALS = 4


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_entry_builds_the_model_it_declares(name):
    spec = REGISTRY[name]
    for preset in {spec.lra_preset, spec.demo_preset} - {None}:
        config = spec.get_config(preset)
        assert config.task in TASK_MODULES and spec in TASK_MODULES[config.task].SPECS, preset
        task = make_task(config)
        model = nnx.eval_shape(lambda task=task: task.build_model(nnx.Rngs(0)))
        shapes = {"/".join(map(str, path)): x.shape for path, x in nnx.to_flat_state(nnx.state(model, nnx.Param))}
        embed = next(shape for key, shape in shapes.items() if "embed" in key and len(shape) == 2)
        assert embed[0] == spec.vocab_size, (preset, shapes)
        head = [shape for key, shape in shapes.items() if "head" in key and len(shape) == 2]
        assert head[-1][1] == spec.num_classes, (preset, head)
    assert set(spec.demo_cut) <= {"steps", "eval_max_batches"}
    assert (spec.demo_cut != {}) == (spec.demo_preset is not None)


def test_the_tools_take_their_task_lists_from_the_registry():
    # (the CLI modules are read, not imported: their absl flags would clash with other commands' in this process)
    assert set(data_writers()) == {n for n, s in REGISTRY.items() if s.write_data} >= {"listops", "pathfinder"}
    assert "SUBCOMMANDS = data_writers()" in (ROOT / "lra_flax/data_cli.py").read_text()
    assert 'flags.DEFINE_enum("task", "listops", with_demo(),' in (ROOT / "lra_flax/demo.py").read_text()
    assert compare_config.LRA_TASKS == {n: f"{s.config}:{s.lra_preset}" for n, s in REGISTRY.items()}
    assert set(compare_config.DEMO_TASKS) == set(compare_config.DEMO_CUTS) == set(with_demo())
    assert set(compare_config.get_config("kernel_paper").tasks) == set(reported_by("kernel paper"))
    rows = published_rows()
    # every published row shows up under the tasks that report it, with the LRA paper's Transformer everywhere
    assert set(rows["LRA paper: Transformer"]) == set(REGISTRY)
    assert rows["kernel paper: linear kernel"] == {"listops": 18.54, "text": 65.77, "retrieval": 73.51}


def test_lra_data_takes_each_task_s_flags_from_its_entry():
    listed = subprocess.run(
        [sys.executable, "-m", "lra_flax.data_cli", "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    text = " ".join(listed.stdout.split())  # absl wraps the help at 80 columns
    assert listed.returncode == 0, listed.stderr[-2000:]
    for task in data_writers():
        for flag in REGISTRY[task].data_flags:
            choices = f"<{'|'.join(flag.choices)}>: " if flag.choices else ""
            assert f"--{flag.name}: {choices}{task}: {flag.help}" in text, (task, flag.name)
            assert f"(default: '{flag.default}')" in text
    assert {flag.name for flag in REGISTRY["listops"].data_flags} >= {"num_train", "max_length"}


def test_lra_data_defaults_are_the_lra_code_presets_data_fields():
    # Pathfinder's lra-data writes 10,000 images unless asked; the lra_code preset generates the release's 200,000.
    different = {("pathfinder", "num_images")}
    for task in data_writers():
        data = REGISTRY[task].get_config().data.to_dict()
        fields = {**data, **data.get("generator", {})}
        for flag in REGISTRY[task].data_flags:
            if flag.name in fields and (task, flag.name) not in different:
                assert str(flag.default) == str(fields[flag.name]), (task, flag.name, flag.default, fields[flag.name])


def test_a_data_flag_is_an_int_a_float_or_a_str():
    for bad in (True, None, [1]):  # a bool would become an integer flag; absl has no list default here
        with pytest.raises(TypeError, match=rf"lra-data flag --x: default {re.escape(repr(bad))} must be an int"):
            DataFlag("x", bad, "help")


def test_an_unknown_task_names_the_registered_ones():
    config = REGISTRY["listops"].get_config("demo")
    config.task = "listopz"
    with pytest.raises(ValueError, match=r"task='listopz' is unknown; valid: listops, text"):
        make_task(config)


def test_task_names_are_not_spelled_out_outside_their_own_modules():
    own = {(folder, name) for folder in ("tasks", "configs") for name in TASK_MODULES}
    hits = []
    for package in ("lra_flax", "studies", "zoo", "kernels"):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative.parts[0] == "lra_flax" and (relative.parts[1], path.stem) in own:
                continue
            if path.name == "pathfinder_generator.py":  # Pathfinder's image generator: its own module too
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in REGISTRY:
                    hits.append(f"{relative}:{node.lineno}: {node.value!r}")
    assert len(hits) <= MAX_NAME_LITERALS, "\n".join(hits)
