"""`lra-compare`: cells, shards, a real tiny sweep (failures recorded, kill and resume, tables from results.json)."""

import json
import re
import subprocess
import sys

import ml_collections
import pytest

from lra_flax import compare
from lra_flax.configs import compare as compare_configs

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
    config.overrides = {**TINY, "data": {**TINY["data"], "dir": str(data_dir)}}
    config.task_overrides = {"listops": {"train": {"eval_batch_size": 8}}}
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
    with pytest.raises(ValueError, match="need 1 <= i <= n"):
        compare.parse_shard("4/3")


def test_a_cell_is_an_ordinary_lra_train_command(tmp_path):
    cell = compare.cells(compare_configs.get_config("kernel_paper"))[0]
    cmd = cell.train_command(tmp_path)
    assert cmd[1:3] == ["-m", "lra_flax"] and f"--workdir={cell.workdir(tmp_path)}" in cmd
    assert any(a.startswith("--config.model.mixer_options.") for a in cmd) or cell.mixer == "softmax"


@pytest.mark.slow
def test_tiny_sweep_records_failures_resumes_after_a_kill_and_tables_match_the_cells(tmp_path):
    variants = {
        "softmax": {"mixer": "softmax", "options": {}},
        "favor": {"mixer": "linear", "options": {"feature_map": "favor", "num_features": 16}},
        "broken": {"mixer": "linear", "options": {"feature_map": "nonsense"}},
    }
    full = _sweep(tmp_path / "data", variants)
    counts = compare.run_sweep(full, tmp_path / "full")
    assert counts == {"done": 4, "failed": 2, "skipped": 0}
    paths = compare.write_report(full, tmp_path / "full")
    md = paths["md"].read_text()
    assert "| broken | failed |" in md and "unknown feature_map 'nonsense'" in md
    assert paths["accuracy_png"].stat().st_size > 1000

    # The table's mean ± std is what the cells' results.json files say.
    for variant in ("softmax", "favor"):
        accs = [
            100
            * json.loads((tmp_path / "full" / "cells" / "listops" / variant / f"seed{s}" / "results.json").read_text())[
                "test_accuracy"
            ]
            for s in (0, 1)
        ]
        mean, std = compare.mean_std(accs)
        assert re.search(rf"\| {variant} \| (\*\*)?{mean:.1f} ± {std:.1f} \(n=2\)", md), md

    # Killed mid-cell (SIGKILL at step 2), then re-run: the same results as the uninterrupted sweep.
    resumed = _sweep(tmp_path / "data", {"favor": variants["favor"]})
    stopped = compare.run_sweep(resumed, tmp_path / "resumed", env={"ZOO_TEST_KILL_AFTER_STEP": "3"})
    assert stopped.get("preempted") == 1 and stopped["done"] == 0
    assert compare.state(compare.cells(resumed)[0], tmp_path / "resumed") == "started"
    assert compare.run_sweep(resumed, tmp_path / "resumed") == {"done": 2, "failed": 0, "skipped": 0}
    assert compare.run_sweep(resumed, tmp_path / "resumed") == {"done": 0, "failed": 0, "skipped": 2}
    for s in (0, 1):
        a, b = (
            json.loads((tmp_path / d / "cells/listops/favor" / f"seed{s}" / "results.json").read_text())
            for d in ("full", "resumed")
        )
        assert {k: v for k, v in a.items() if k.startswith("test_")} == {
            k: v for k, v in b.items() if k.startswith("test_")
        }


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
