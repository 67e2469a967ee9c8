"""`lra-train` end to end for Image, Pathfinder and Path-X on tiny local data; bad files leave the workdir alone."""

import json

import numpy as np
import pytest

from tests.lra_flax.test_image_data import _write_idx
from tests.lra_flax.test_pathfinder import _release
from tests.lra_flax.test_train_cli import _train, accuracy_counts_whole_examples

TINY = {
    "model.num_layers": 1,
    "model.d_model": 16,
    "model.num_heads": 2,
    "model.mlp_dim": 16,
    "train.batch_size": 4,
    "train.eval_batch_size": 4,
    "train.steps": 4,
    "train.warmup_steps": 1,
    "train.log_every": 2,
    "train.checkpoint_every": 4,
}


def _flags(**fields):
    return [f"--config.{k}={v}" for k, v in {**TINY, **fields}.items()]


@pytest.mark.slow
@pytest.mark.parametrize("mixer", ["softmax", "linear"])
def test_image_trains_on_idx_files_and_says_which_data(tmp_path, mixer):
    rng = np.random.default_rng(0)
    _write_idx(tmp_path / "idx", "train", rng.integers(0, 256, (40, 28, 28)), rng.integers(0, 10, 40))
    _write_idx(tmp_path / "idx", "t10k", rng.integers(0, 256, (12, 28, 28)), rng.integers(0, 10, 12))
    flags = _flags(**{"data.source": "idx", "data.dir": tmp_path / "idx", "data.cache_dir": tmp_path / "cache"})
    run = _train(tmp_path / "run", [*flags, f"--config.model.mixer={mixer}"], config="lra_flax/configs/image.py:demo")
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["train_steps_run"] == 4 and accuracy_counts_whole_examples(results)
    assert results["data_source"] == "idx" and "not CIFAR-10" in results["data_note"]
    # Training time excludes the final evaluation, which is reported on its own.
    assert results["train_wall_time_s"] > 0 and results["eval_wall_time_s"] > 0


@pytest.mark.slow
def test_pathfinder_generates_then_trains(tmp_path):
    flags = _flags(**{"data.dir": tmp_path / "pf", "data.cache_dir": tmp_path / "pf", "data.num_images": 20})
    run = _train(tmp_path / "run", [*flags, "--config.data.workers=1"], config="lra_flax/configs/pathfinder.py:demo")
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["train_steps_run"] == 4 and "generated here: 20 images" in results["data_note"]
    assert len(list((tmp_path / "pf" / "pathfinder32" / "curv_contour_length_14" / "imgs").rglob("*.png"))) == 20


@pytest.mark.slow
def test_path_x_trains_a_few_steps_with_a_linear_mixer_on_release_files(tmp_path):
    _release(tmp_path / "lra_release", n=20, resolution=128)
    flags = _flags(
        **{"data.dir": tmp_path / "lra_release", "data.cache_dir": tmp_path / "cache", "data.generate": False}
    )
    run = _train(
        tmp_path / "run", [*flags, "--config.train.steps=2"], config="lra_flax/configs/pathfinder.py:pathx_demo"
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["train_steps_run"] == 2 and "data_note" not in results  # release data, not generated


def test_a_truncated_png_stops_before_the_workdir_is_touched(tmp_path):
    folder = _release(tmp_path / "lra_release", n=20)
    png = folder / "imgs" / "1" / "sample_4.png"
    png.write_bytes(png.read_bytes()[:50])
    flags = _flags(**{"data.dir": tmp_path / "lra_release", "data.cache_dir": tmp_path / "cache"})
    run = _train(
        tmp_path / "run", [*flags, "--config.data.generate=False"], config="lra_flax/configs/pathfinder.py:demo"
    )
    assert run.returncode != 0
    assert "sample_4.png: not a readable PNG" in run.stderr
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
