"""A checkpoint save that fails in the background (a full disk, a folder made unwritable) stops the run at the
next log line with one line naming the folder and the cause; the last good step is kept and the half-written
one removed. The failure is injected where Orbax's background commit would meet it."""

import errno
import json
import time

import grain
import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest

from tests.zoo.test_training import tiny_loop_run
from zoo.training import periodic, train_and_evaluate
from zoo.training.checkpoints import Checkpointer, CheckpointSaveFailed


class _DiskFull:
    def result(self, timeout=None):
        raise OSError(errno.ENOSPC, "No space left on device")


def _fail_saves_from_now(monkeypatch):
    original = ocp.StandardCheckpointHandler.async_save

    async def failing(self, *args, **kwargs):
        return [*(await original(self, *args, **kwargs) or []), _DiskFull()]

    monkeypatch.setattr(ocp.StandardCheckpointHandler, "async_save", failing)


def test_a_failed_background_save_is_one_line_and_leaves_the_last_good_step_alone(tmp_path, monkeypatch):
    directory, state = tmp_path / "checkpoints", {"w": jnp.ones((4, 3))}
    data = iter(grain.MapDataset.range(10).to_iter_dataset())
    checkpointer = Checkpointer(directory, max_to_keep=5)
    checkpointer.save(1, state, data, {"step": 1})
    checkpointer.wait()
    _fail_saves_from_now(monkeypatch)
    checkpointer.save(2, state, data, {"step": 2})
    message = rf"saving checkpoint 2 in {directory} failed \(OSError: \[Errno 28\] No space left on device\); the " \
              r"last good checkpoint is step 1, and the half-written one is removed"  # fmt: skip
    with pytest.raises(CheckpointSaveFailed, match=message):
        checkpointer.wait()
    assert sorted(p.name for p in directory.iterdir()) == ["1"]


def test_a_save_left_unfinished_by_a_killed_run_is_removed_by_the_next_run_not_by_a_reader(tmp_path):
    directory, state = tmp_path / "checkpoints", {"w": jnp.ones((4, 3))}
    data = iter(grain.MapDataset.range(10).to_iter_dataset())
    writer = Checkpointer(directory, max_to_keep=5, writer=True)
    writer.save(1, state, data, {"step": 1})
    writer.wait()
    left = directory / "2.orbax-checkpoint-tmp-1764400000000000"  # what SIGKILL inside a save leaves
    (left / "state").mkdir(parents=True)
    Checkpointer(directory, max_to_keep=5)  # a reader (a study, load_model) while the run may be saving
    assert left.exists()
    resumed = Checkpointer(directory, max_to_keep=5, writer=True)  # removes it in the background; a save waits for it
    resumed.save(3, state, data, {"step": 3})
    resumed.wait()
    assert sorted(p.name for p in directory.iterdir()) == ["1", "3"]


def test_the_loop_stops_at_the_next_log_line_not_a_save_later(tmp_path, monkeypatch):
    # Steps of a real model's length (half a second): the failed save is over well within the next four.
    monkeypatch.setattr(periodic, "EVENT_HOOKS", [lambda event: time.sleep(0.5)])
    config, task = tiny_loop_run(12)
    config.train.update(log_every=1, checkpoint_every=4)
    _fail_saves_from_now(monkeypatch)
    with pytest.raises(CheckpointSaveFailed, match=r"saving checkpoint 4 .* no checkpoint was completed"):
        train_and_evaluate(config, tmp_path / "run", task)
    logged = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert 4 <= logged[-1] < 8  # stopped before the next save was due
    assert list((tmp_path / "run" / "checkpoints").iterdir()) == []


def test_orbax_error_logs_lose_their_tracebacks_and_others_keep_theirs():
    import logging
    import sys

    from zoo.training.cli import _orbax_errors_in_one_line

    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
        exc_info = sys.exc_info()
    for path, kept in (("/site-packages/orbax/checkpoint/future.py", False), ("/site-packages/jax/x.py", True)):
        record = logging.LogRecord("absl", logging.ERROR, path, 1, "failed:\n%s", ("details",), exc_info)
        assert _orbax_errors_in_one_line(record)  # filtered records are still logged
        assert (record.exc_info is not None) == kept and (record.getMessage() == "failed:") != kept
