"""`lra-compare`: cells, shards, a real tiny sweep (failures recorded, kill and resume, tables from results.json)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import ml_collections
import pytest

from lra_flax import compare
from lra_flax.configs import compare as compare_configs
from tests import fault_injection

TINY = {
    "data": {"generator": {"num_train": 100, "num_valid": 20, "num_test": 20}},
    "model": {"num_layers": 1, "d_model": 16, "num_heads": 2, "mlp_dim": 16},
    "train": {"batch_size": 8, "steps": 4, "warmup_steps": 1, "log_every": 2, "checkpoint_every": 2},
}


def _sweep(data_dir, variants, seeds=(0, 1)):
    config = ml_collections.ConfigDict()
    config.preset = "tiny"
    config.tasks = {"listops": "listops:demo"}
    config.variants = variants
    config.seeds = list(seeds)
    config.overrides = {"model": TINY["model"], "train": TINY["train"]}
    listops_data = {**TINY["data"], "dir": str(data_dir)}
    config.task_overrides = {"listops": {"data": listops_data, "train": {"eval_batch_size": 8}}}
    return config


@pytest.mark.parametrize("preset", compare_configs.PRESETS)
def test_shards_cover_every_cell_exactly_once(preset):
    config = compare_configs.get_config(preset)
    cells = compare.cells(config)
    assert len(cells) == len(config.tasks) * len(config.variants) * len(config.seeds)
    assert len({c.name for c in cells}) == len(cells)
    for n in (1, 3, 7):
        parts = [compare.shard(cells, i, n) for i in range(1, n + 1)]
        names = [c.name for part in parts for c in part]
        assert sorted(names) == sorted(c.name for c in cells)
    with pytest.raises(ValueError, match=r"--shard=.4/3.: i/n \(e.g. 1/4\) needs 1 <= first <= second"):
        compare.parse_shard("4/3")


def test_a_cell_is_an_ordinary_lra_train_command(tmp_path):
    cell = compare.cells(compare_configs.get_config("kernel_paper"))[0]
    cmd = cell.train_command(tmp_path)
    assert cmd[1:3] == ["-m", "lra_flax"] and f"--workdir={cell.workdir(tmp_path)}" in cmd
    config_file = Path(cmd[3].removeprefix("--config=").rpartition(":")[0])
    assert config_file.is_absolute() and config_file.is_file()  # the sweep may run from any directory
    assert any(a.startswith("--config.model.mixer_options.") for a in cmd) or cell.mixer == "softmax"


@pytest.mark.parametrize("preset", compare_configs.PRESETS)
def test_the_config_checked_before_a_cell_starts_is_the_one_its_command_trains_with(preset, tmp_path):
    from absl import flags
    from ml_collections import config_flags

    for cell in compare.cells(compare_configs.get_config(preset)):
        # The command's --config and --config.a.b=v flags, parsed as lra-train's absl flags parse them.
        argv = ["lra-train", *(a for a in cell.train_command(tmp_path) if a.startswith("--config"))]
        values = flags.FlagValues()
        config_flags.DEFINE_config_file("config", flag_values=values, sys_argv=argv)
        values(argv)
        assert compare.cell_config(cell).to_dict() == values.config.to_dict(), cell.name
        assert compare.config_problem(cell) is None, cell.name


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"mixer": "linear", "options": (("feature_mapp", "glu"),)}, r"model.mixer_options.linear.feature_mapp: "
         r"listops configs have no such field"),
        ({"overrides": (("train.stepz", 3),)}, r"train.stepz: listops configs have no such field"),
        ({"config_spec": "listopz:demo"}, r"tasks.listops='listopz:demo': there is no task config module "
         r"lra_flax/configs/listopz.py"),
        ({"config_spec": "listops:demoo"}, r"tasks.listops='listops:demoo': unknown ListOps preset 'demoo'"),
    ],
)  # fmt: skip
def test_a_misspelled_field_or_task_module_is_a_cell_problem(change, problem):
    import dataclasses

    cell = next(c for c in compare.cells(compare_configs.get_config("demo")) if c.task == "listops")
    assert re.match(problem, compare.config_problem(dataclasses.replace(cell, **change)))


def test_a_cell_another_sweep_holds_or_has_finished_is_passed_over_not_failed(tmp_path, monkeypatch):
    import socket

    config, root = _sweep(tmp_path / "data", {"softmax": {"mixer": "softmax"}}), tmp_path / "sweep"
    held, finished = (cell.workdir(root) for cell in compare.cells(config))
    held.mkdir(parents=True)  # another lra-compare (a live process: pid 1) runs the first cell
    (held / compare.CELL_LOCK).write_text(json.dumps({"host": socket.gethostname(), "pid": 1}))

    class FinishedMeanwhile(compare.WorkdirLock):  # the other sweep finishes the second cell as this one looks
        def acquire(self):
            super().acquire()
            if self.workdir == finished:
                (finished / compare.RESULTS).write_text(json.dumps({"test_accuracy": 0.5}))

    monkeypatch.setattr(compare, "WorkdirLock", FinishedMeanwhile)
    monkeypatch.setattr(compare.subprocess, "run", lambda *a, **k: pytest.fail("a process was started"))
    assert compare.run_sweep(config, root) == {"done": 1, "failed": 0, "skipped": 0, "busy": 1}
    assert not list(root.glob(f"cells/**/{compare.FAILED}"))
    assert (held / compare.CELL_LOCK).exists() and not (finished / compare.CELL_LOCK).exists()


def test_a_cell_that_validation_refuses_fails_without_a_process(tmp_path, monkeypatch):
    variants = {"broken": {"mixer": "linear", "options": {"feature_map": "nonsense"}}}
    config = _sweep(tmp_path / "data", variants)
    monkeypatch.setattr(compare.subprocess, "run", lambda *a, **k: pytest.fail("a process was started"))
    assert compare.run_sweep(config, tmp_path / "sweep") == {"done": 0, "failed": 2, "skipped": 0}
    record = json.loads((compare.cells(config)[0].workdir(tmp_path / "sweep") / compare.FAILED).read_text())
    assert record["reason"].startswith(
        "invalid config: model.mixer_options.linear.feature_map='nonsense' must be one of elu1, relu"
    )
    assert "--config.model.mixer_options.linear.feature_map=nonsense" in record["command"]


def test_cells_trained_with_other_settings_than_the_edited_sweep_are_refused(tmp_path):
    from zoo.training.config import write_config

    variants = {"relu": {"mixer": "relu", "options": {"gamma_init": 1.0}}}
    config = _sweep(tmp_path / "data", variants)
    root = tmp_path / "sweep"
    for cell in compare.cells(config):  # two finished cells, as lra-train leaves them
        cell.workdir(root).mkdir(parents=True)
        write_config(compare.cell_config(cell), cell.workdir(root))
        (cell.workdir(root) / "results.json").write_text('{"test_accuracy": 0.5}')
    assert compare.changed_cells(config, root) == {}
    compare.check_cells_unchanged(config, root)
    edited = _sweep(tmp_path / "data", {"relu": {"mixer": "relu", "options": {"gamma_init": 5.0}}})
    edited.overrides.train.log_every = 1  # results do not depend on it: not a change of the cells
    assert compare.changed_cells(edited, root) == {
        f"listops/relu/seed{s}": "model.mixer_options.relu.gamma_init 1.0 -> 5.0" for s in (0, 1)
    }
    edited.overrides.model.d_model = 32
    both = "model.d_model 16 -> 32, model.mixer_options.relu.gamma_init 1.0 -> 5.0"
    assert compare.changed_cells(edited, root) == {f"listops/relu/seed{s}": both for s in (0, 1)}
    with pytest.raises(ValueError, match=r"holds 2 cell\(s\) trained with other settings than this sweep gives them: "
                       r"listops/relu/seed0: model.d_model 16 -> 32.*Use a new --workdir"):  # fmt: skip
        compare.check_cells_unchanged(edited, root)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"test_accuracy": 37.0}', "test_accuracy=37.0 is not an accuracy in [0, 1]"),
        ('{"test_accuracy": NaN}', "test_accuracy=nan is not an accuracy in [0, 1]"),
        ('{"test_accuracy": "0.9"}', "test_accuracy='0.9' is not an accuracy in [0, 1]"),
        ('{"test_loss": 1.0}', "test_accuracy=None is not an accuracy in [0, 1]"),
        ("[1, 2]", "not a results record (a JSON object), but list"),
    ],
)
def test_a_cell_results_file_that_holds_no_accuracy_is_shown_failed_not_averaged(tmp_path, text, reason):
    config = _sweep(tmp_path / "data", {"relu": {"mixer": "relu", "options": {}}})
    root = tmp_path / "sweep"
    good, bad = compare.cells(config)
    for cell, results in ((good, '{"test_accuracy": 0.5}'), (bad, text)):
        cell.workdir(root).mkdir(parents=True)
        (cell.workdir(root) / "results.json").write_text(results)
    rows = compare.collect(config, root)
    assert [r["state"] for r in rows] == ["done", "failed"]
    assert rows[1]["reason"] == f"{bad.workdir(root) / 'results.json'}: {reason}"
    assert "| relu | 50.0 ± 0.0 (n=1) | 50.0 |" in compare.accuracy_table(config, rows)  # the good seed alone


def test_a_sweep_folder_is_not_taken_for_a_training_run_s_workdir(tmp_path):
    from zoo.training.config import check_workdir_layout

    (tmp_path / "sweep" / "cells").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"holds cells/: it is a sweep's folder \(lra-compare\), not a run's"):
        check_workdir_layout(tmp_path / "sweep")
    (tmp_path / "sweep" / "config.json").write_text("{}")  # a training run's config beside the cells
    with pytest.raises(ValueError, match=r"is a training run's workdir \(it holds config.json\)"):
        compare.check_sweep_dir(tmp_path / "sweep", must_exist=True)


@pytest.mark.slow
def test_two_task_sweep_tables_figures_failures_kill_and_resume(tmp_path, monkeypatch):
    # ListOps and Pathfinder (both generated offline, in seconds) × softmax, FAVOR+ and a variant that cannot
    # be built × 2 seeds, plus the efficiency table at one length: both tables and all three figures.
    variants = {
        "softmax": {"mixer": "softmax", "options": {}},
        "favor": {"mixer": "linear", "options": {"feature_map": "favor", "num_features": 16}},
        "broken": {"mixer": "linear", "options": {"feature_map": "nonsense"}},
    }
    full = _sweep(tmp_path / "data", variants)
    full.tasks["pathfinder"] = "pathfinder:demo"
    pf_data = {"dir": str(tmp_path / "pf"), "cache_dir": str(tmp_path / "pf"), "num_images": 40, "workers": 1}
    full.task_overrides["pathfinder"] = {"data": pf_data, "train": {"eval_batch_size": 4}}
    full.efficiency = {
        "task": "text:demo",
        "lengths": [64],
        "steps": 2,
        "warmup": 1,
        "timeout_s": 300,
        "overrides": {"train": {"batch_size": 2}, "model": {"num_layers": 1, "d_model": 16, "mlp_dim": 16}},
    }
    counts = compare.run_sweep(full, tmp_path / "full")
    assert counts == {"done": 8, "failed": 4, "skipped": 0}  # the failures did not stop the sweep
    assert compare.run_efficiency(full, tmp_path / "full") == {"ran": 3, "failed": 1}  # the broken variant's
    assert compare.run_efficiency(full, tmp_path / "full") == {"ran": 0, "failed": 0}  # measured entries are kept
    eff = compare.collect_efficiency(full, tmp_path / "full")
    assert {r["variant"] for r in eff if "error" not in r} == {"softmax", "favor"}
    assert all(r["steps_per_s"] > 0 and r["memory_bytes"] > 0 for r in eff if "error" not in r)
    paths = compare.write_report(full, tmp_path / "full")
    md = paths["md"].read_text()
    assert "| variant | listops | pathfinder | average |" in md and "## Efficiency" in md
    assert "| broken | failed | failed |" in md and "feature_map='nonsense' must be one of" in md
    # Both tables name what computed the softmax figures (results.json and the efficiency files record it).
    assert md.count("Softmax attention computed by: XLA blocked softmax: no entry for cpu under jax") == 2
    for figure in ("accuracy_png", "efficiency_png", "bubble_png"):
        assert paths[figure].stat().st_size > 1000, figure
    rows = json.loads(paths["json"].read_text())["cells"]
    assert len(rows) == 12 and {r["state"] for r in rows} == {"done", "failed"}

    # The table's mean ± std is what the cells' results.json files say.
    for task in ("listops", "pathfinder"):
        for variant in ("softmax", "favor"):
            accs = [
                100
                * json.loads((tmp_path / "full/cells" / task / variant / f"seed{s}/results.json").read_text())[
                    "test_accuracy"
                ]
                for s in (0, 1)
            ]
            mean, std = compare.mean_std(accs)
            row = next(line for line in md.splitlines() if line.startswith(f"| {variant} |"))
            assert re.search(
                rf"(\*\*)?{mean:.1f} ± {std:.1f} \(n=2\)", row.split("|")[{"listops": 2, "pathfinder": 3}[task]]
            )

    # Killed mid-cell (SIGKILL at step 3), then re-run: the same results as the uninterrupted sweep.
    resumed = _sweep(tmp_path / "data", {"favor": variants["favor"]}, seeds=(0,))
    stopped = compare.run_sweep(resumed, tmp_path / "resumed", env=fault_injection.env(kill_after_step=3))
    assert stopped.get("preempted") == 1 and stopped["done"] == 0
    assert compare.state(compare.cells(resumed)[0], tmp_path / "resumed") == "started"
    assert compare.run_sweep(resumed, tmp_path / "resumed") == {"done": 1, "failed": 0, "skipped": 0}
    assert compare.run_sweep(resumed, tmp_path / "resumed") == {"done": 0, "failed": 0, "skipped": 1}
    a, b = (
        json.loads((tmp_path / d / "cells/listops/favor/seed0/results.json").read_text()) for d in ("full", "resumed")
    )
    assert {k: v for k, v in a.items() if k.startswith("test_")} == {
        k: v for k, v in b.items() if k.startswith("test_")
    }
    assert b["resumed_at_step"] == 2  # the checkpoint before the kill, not a fresh start
    # What a cell's run records is the config the sweep gives it: an unchanged sweep finds no changed cell.
    assert (
        compare.changed_cells(full, tmp_path / "full") == {}
        and compare.changed_cells(resumed, tmp_path / "resumed") == {}
    )


def test_a_training_run_s_workdir_is_not_taken_for_a_sweep(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")  # what lra-train writes first
    for must_exist in (False, True):
        with pytest.raises(ValueError, match=r"is a training run's workdir \(it holds config.json\)"):
            compare.check_sweep_dir(tmp_path / "run", must_exist=must_exist)
    compare.check_sweep_dir(tmp_path / "new", must_exist=False)  # a sweep's folder to be
    with pytest.raises(ValueError, match="holds no sweep"):
        compare.check_sweep_dir(tmp_path / "new", must_exist=True)


def test_a_shard_with_failed_cells_lists_them_first_and_exits_1_after_its_reports(tmp_path):
    cells = compare.cells(compare_configs.get_config("demo"))
    broken = f"--config.variants.{cells[0].variant}.mixer=nosuch"  # shard 1 of len(cells): cells[0] alone
    command = [
        sys.executable, "-m", "lra_flax.compare_cli", f"--config={compare.CONFIGS_DIR / 'compare.py'}:demo",
        f"--workdir={tmp_path / 'sweep'}", broken, f"--shard=1/{len(cells)}",
    ]  # fmt: skip
    listed = subprocess.run([*command, "--cells"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert listed.returncode == 2, listed.stderr[-2000:]  # a script that lists the sweep first learns it
    assert "will fail: invalid config: model.mixer: unknown mixer 'nosuch'" in listed.stdout
    assert listed.stderr.strip() == "lra-compare: error: 1 of the listed cells will fail (each says why above); " + (
        "nothing was run"
    )
    assert not (tmp_path / "sweep").exists()
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 1, run.stderr[-2000:]
    assert "1 cell(s) of this shard failed" in run.stderr
    assert "| failed |" in (tmp_path / "sweep" / "results.md").read_text()  # the reports were written first


def test_an_interrupted_sweep_says_what_is_kept_in_one_line_and_exits_130(tmp_path):
    # Ctrl-C while a cell trains: the parent's KeyboardInterrupt, raised here where the sweep would run.
    script = (
        "import sys; from lra_flax import compare, compare_cli\n"
        "def stop(*args, **kwargs): raise KeyboardInterrupt\n"
        "compare.run_sweep = stop\n"
        f"sys.argv = ['lra-compare', '--config={compare.CONFIGS_DIR / 'compare.py'}:demo', '--workdir={tmp_path}']\n"
        "compare_cli.run()\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 130 and len(run.stderr.strip().splitlines()) == 1, run.stderr[-2000:]
    assert "lra-compare: interrupted; finished cells are kept" in run.stderr


def test_report_only_with_no_finished_cell_says_there_is_nothing_to_report(tmp_path):
    cell = compare.cells(compare_configs.get_config("demo"))[0]
    (cell.workdir(tmp_path) / "checkpoints").mkdir(parents=True)  # started, not finished
    command = [sys.executable, "-m", "lra_flax.compare_cli", "--config=lra_flax/configs/compare.py:demo"]
    run = subprocess.run([*command, f"--workdir={tmp_path}", "--report_only"], capture_output=True, text=True)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr[-2000:]
    assert "has finished, so there is nothing to report" in run.stderr
    assert not (tmp_path / "results.md").exists()


def test_cells_flag_lists_states_without_running(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "lra_flax.compare_cli",
            "--config=lra_flax/configs/compare.py:demo",
            f"--workdir={tmp_path}",
            "--cells",
            "--shard=2/5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.strip().splitlines()
    total = len(compare.cells(compare_configs.get_config("demo")))
    assert len(lines) == len(range(1, total, 5)) and all(line.startswith("to do") for line in lines)
    assert not (tmp_path / "cells").exists()


def test_efficiency_table_ratios_and_out_of_memory():
    config = _sweep(
        "unused", {"softmax": {"mixer": "softmax"}, "linear": {"mixer": "linear"}, "relu": {"mixer": "relu"}}
    )
    config.efficiency = {"task": "text:demo", "lengths": [1000, 4000], "steps": 3, "warmup": 1, "timeout_s": 60}
    base = {"memory_source": "compiled step's memory analysis", "device": "cpu", "batch_size": 4}
    rows = [
        {"variant": "softmax", "length": 1000, "steps_per_s": 2.0, "memory_bytes": 400 * 2**20, "mfu": 0.125, **base},
        {"variant": "linear", "length": 1000, "steps_per_s": 3.0, "memory_bytes": 100 * 2**20, **base},
        {"variant": "softmax", "length": 4000, "error": "out of memory"},
        {"variant": "linear", "length": 4000, "steps_per_s": 1.0, "memory_bytes": 300 * 2**20, **base},
        {"variant": "relu", "length": 4000, "error": "lra-efficiency: error: something else"},
    ]
    rows[0]["softmax_attention"] = "XLA dense softmax (implementation=dense)"
    table = compare.efficiency_table(config, rows)
    assert "| linear | 3 (×1.50) | 100 (×0.25) | — | 1 | 300 | — |" in table
    assert "| softmax | 2 (×1.00) | 400 (×1.00) | 12.5% | out of memory | out of memory | out of memory |" in table
    assert "| relu | — | — | — | failed | failed | failed |" in table
    assert "compiled step's memory analysis" in table and "batch 4" in table
    assert "Softmax attention computed by: XLA dense softmax (implementation=dense)." in table


def test_bubble_points_need_every_task_and_softmax_at_the_same_length(tmp_path):
    config = _sweep("unused", {"softmax": {"mixer": "softmax"}, "linear": {"mixer": "linear"}})
    config.tasks = {"listops": "listops:demo", "text": "text:demo"}
    rows = [
        {"variant": v, "task": t, "state": "done", "test_accuracy": acc}
        for v, t, acc in [("softmax", "listops", 0.3), ("softmax", "text", 0.6), ("linear", "listops", 0.2)]
    ]
    eff = [
        {"variant": "softmax", "length": 4000, "steps_per_s": 1.0, "memory_bytes": 800 * 2**20},
        {"variant": "linear", "length": 4000, "steps_per_s": 4.0, "memory_bytes": 100 * 2**20},
    ]
    points = compare.bubble_points(config, rows, eff)
    assert [p["variant"] for p in points] == ["softmax"]  # linear has no Text result yet
    rows.append({"variant": "linear", "task": "text", "state": "done", "test_accuracy": 0.5})
    points = {p["variant"]: p for p in compare.bubble_points(config, rows, eff)}
    assert points["linear"]["speed_vs_softmax"] == 4.0 and abs(points["linear"]["average_accuracy"] - 35.0) < 1e-9
    assert points["softmax"]["memory_mib"] == 800
    assert compare.bubble_figure(config, list(points.values()), tmp_path / "bubble.png").stat().st_size > 1000


def _preset_sweep(**changes):
    """The demo sweep on ListOps with `changes` (dotted fields), a value of another type too (as a file writes it)."""
    config = compare_configs.get_config("demo").to_dict()
    config.update(tasks={"listops": "listops:demo"}, task_overrides={"listops": {}})
    for field, value in changes.items():
        node, _, name = field.rpartition(".")
        (config[node] if node else config)[name] = value
    return ml_collections.ConfigDict(config)


def test_every_preset_is_a_valid_sweep_of_exactly_the_declared_fields():
    for preset in compare_configs.PRESETS:
        config = compare_configs.get_config(preset)
        assert set(config.keys()) == {f.name for f in compare_configs.SWEEP_FIELDS}, preset
        assert compare.sweep_problems(config) == [], preset


@pytest.mark.parametrize(
    "changes, problem",
    [
        ({"variants": {"softmax": "softmax"}}, "variants.softmax='softmax' must be {'mixer': MIXER, 'options': "
         "{OPTION: value}}: a mixer name and its option overrides"),
        ({"variants": {"softmax": {"options": {}}}}, "variants.softmax={'options': {}} must be {'mixer': MIXER"),
        ({"variants": {"relu": {"mixer": "relu", "option": {}}}}, "variants.relu={'mixer': 'relu', 'option': {}}"),
        ({"variants": {}}, "variants={} must map at least one variant name"),
        ({"tasks": {"listops": "listops"}}, "tasks.listops='listops' must be 'config_module:preset'"),
        ({"seeds": [-1]}, "seeds=[-1] must be a list of distinct integers ≥ 0"),
        ({"seeds": ["a"]}, "seeds=['a'] must be a list of distinct integers ≥ 0"),
        ({"seeds": [0, 0]}, "seeds=[0, 0] must be a list of distinct integers ≥ 0"),
        ({"overrides": 3}, "overrides=3 must be a section of config fields"),
        ({"task_overrides": {"listopz": {}}}, "task_overrides.listopz names no task of this sweep (tasks: listops)"),
        ({"efficiency.lengths": [-5]}, "efficiency.lengths=[-5] must be a list of distinct integers in [1, 1,048,576]"),
        ({"efficiency.steps": 0}, "efficiency.steps=0 must be an integer ≥ 1"),
        ({"efficiency.timeout_s": -1}, "efficiency.timeout_s=-1 must be a number > 0"),
        ({"efficiency.task": "text:dmo"}, "efficiency.task='text:dmo': unknown Text preset 'dmo'; valid presets: "),
        ({"efficiency.task": "txt:demo"}, "efficiency.task='txt:demo': there is no task config module "
         "lra_flax/configs/txt.py"),
        ({"efficiency.overrides": {"train": {"batchsize": 4}}}, "efficiency.overrides.train.batchsize: text configs "
         "have no such field"),
    ],
)  # fmt: skip
def test_the_sweep_config_s_own_fields_are_checked_by_name(changes, problem):
    found = compare.sweep_problems(_preset_sweep(**changes))
    assert len(found) == 1 and found[0].startswith(problem), found


@pytest.mark.parametrize("cells", [True, False])
def test_an_invalid_sweep_config_is_one_line_before_anything_runs(tmp_path, cells):
    sweep = tmp_path / "sweep.py"
    sweep.write_text(
        "from lra_flax.configs.compare import get_config as base\n"
        "def get_config(preset):\n"
        "    config = base('efficiency_cpu')\n"
        "    config.variants = {'softmax': 'softmax'}\n"
        "    return config\n"
    )
    command = [sys.executable, "-m", "lra_flax.compare_cli", f"--config={sweep}:x", f"--workdir={tmp_path / 'w'}"]
    run = subprocess.run(command + ["--cells"] * cells, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stdout == "", run.stderr[-2000:]
    assert run.stderr.strip() == (
        "lra-compare: error: invalid sweep config: variants.softmax='softmax' must be {'mixer': MIXER, 'options': "
        "{OPTION: value}}: a mixer name and its option overrides"
    )
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    ("fields", "listed", "error"),
    [
        # the rest at their defaults; values kept as given (a float timeout is a number > 0)
        ("'seeds': [3], 'efficiency': {'timeout_s': 600.5}", "to do     listops/relu/seed3  (listops:demo)\n", ""),
        ("'seed': [3]", "", "lra-compare: error: --config is not an lra-compare sweep config "
         "(lra_flax/configs/compare.py): it has no seeds"),
        ("'seeds': [3], 'preset': 'mine', 'sed': 1", "", "lra-compare: error: unknown config field(s) sed; valid: "
         "tasks, variants, seeds, overrides, task_overrides, preset, efficiency"),
        ("'seeds': [3], 'efficiency': {'lenghts': [1000]}", "", "lra-compare: error: unknown config field(s) "
         "efficiency.lenghts; valid: task, lengths, steps, warmup, timeout_s, overrides"),
        ("'seeds': [3], 'efficiency': {'steps': 3.0}", "", "lra-compare: error: invalid sweep config: "
         "efficiency.steps=3.0 must be an integer ≥ 1"),
    ],
)  # fmt: skip
def test_a_sweep_file_of_one_s_own_needs_its_cells_fields_and_names_an_unknown_or_bad_field(
    tmp_path, fields, listed, error
):
    sweep = tmp_path / "sweep.py"
    sweep.write_text(
        "import ml_collections\n"
        "def get_config():\n"
        "    return ml_collections.ConfigDict({'tasks': {'listops': 'listops:demo'}, 'variants': {'relu': "
        f"{{'mixer': 'relu', 'options': None}}}}, {fields}}})\n"
    )
    command = [sys.executable, "-m", "lra_flax.compare_cli", f"--config={sweep}", f"--workdir={tmp_path / 'w'}"]
    run = subprocess.run([*command, "--cells"], capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stdout, run.stderr.strip()) == (2 if error else 0, listed, error), run.stderr[-2000:]


def test_a_failed_efficiency_entry_fails_the_command_and_draws_no_empty_figure(tmp_path):
    # A variant whose mixer does not exist: its efficiency process refuses the config; the report is written, the
    # figure (no measurement) is not, nor left from before, and the command says so and exits 1, as for a failed cell.
    sweep = tmp_path / "sweep.py"
    sweep.write_text(
        "from lra_flax.configs.compare import get_config as base\n"
        "def get_config(preset):\n"
        "    config = base('efficiency_cpu')\n"
        "    config.variants = {'broken': {'mixer': 'nosuch', 'options': {}}}\n"
        "    config.efficiency.lengths = [64]\n"
        "    return config\n"
    )
    (tmp_path / "w").mkdir()
    (tmp_path / "w/efficiency.png").write_bytes(b"a figure of an earlier version of this sweep")
    command = [sys.executable, "-m", "lra_flax.compare_cli", f"--config={sweep}:x", f"--workdir={tmp_path / 'w'}"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr[-2000:]
    assert run.stderr.strip().splitlines()[-1] == (
        "lra-compare: 1 of the efficiency entries failed (each efficiency/VARIANT/L<length>.json says why; "
        "--retry_failed runs them again)"
    )
    assert "unknown mixer 'nosuch'" in json.loads((tmp_path / "w/efficiency/broken/L64.json").read_text())["error"]
    assert "| broken | failed | failed | failed |" in (tmp_path / "w/results.md").read_text()
    assert not (tmp_path / "w/efficiency.png").exists() and not (tmp_path / "w/accuracy.png").exists()
