"""A workdir at a URL stays a URL: config, metrics, TensorBoard, results, artifacts and the checkpoint directory
go to the remote filesystem, nothing is written under the current directory, and resume works there.

The remote filesystem is fsspec's in-memory one registered for `s3://` (what etils.epath uses for s3 without
TensorFlow), so the test runs offline. Orbax writes array data for gs:// and s3:// through TensorStore's own
cloud drivers, which need the network; the checkpointer is therefore redirected to a local directory here,
after asserting that it was handed the URL itself.
"""

import json
import os
from typing import ClassVar

import ml_collections
import pytest
from etils.epath import backend as epath_backend
from fsspec.implementations.memory import MemoryFileSystem

from tests.zoo.test_training import tiny_loop_run
from zoo.files import as_path, atomic_write_bytes, require_local
from zoo.training import checkpoints as checkpoints_lib
from zoo.training import loop, train_and_evaluate
from zoo.training.metrics import TIMING_METRICS
from zoo.training.validate import config_problems


class FakeS3(MemoryFileSystem):
    protocol = ("s3",)
    store: ClassVar[dict] = {}  # its own, not the memory:// filesystem's
    pseudo_dirs: ClassVar[list] = [""]


@pytest.fixture
def fake_s3():
    import fsspec

    fsspec.register_implementation("s3", FakeS3, clobber=True)
    epath_backend.fsspec_backend._get_filesystem.cache_clear()
    FakeS3.store.clear()
    yield FakeS3.store
    FakeS3.store.clear()
    epath_backend.fsspec_backend._get_filesystem.cache_clear()


def _config_and_task(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("a\nb\n")
    config, task = tiny_loop_run(6, artifacts=lambda: {"vocab.txt": vocab})
    config.train.eval_every = 4
    return config, task


def test_a_url_workdir_is_written_remotely_and_resumes_there(tmp_path, fake_s3, monkeypatch):
    handed = []

    class LocalOrbax(checkpoints_lib.Checkpointer):
        def __init__(self, directory, **kwargs):
            if "://" in str(directory):
                handed.append(directory)
                directory = tmp_path / "orbax" / str(directory).split("://", 1)[1]
            super().__init__(directory, **kwargs)

    monkeypatch.setattr(loop, "Checkpointer", LocalOrbax)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    config, task = _config_and_task(tmp_path)

    class Crash(Exception):
        pass

    def crash_after_step_5(event):
        if event.step == 5 and event.split is None:
            event.wait_for_checkpoints()
            raise Crash

    loop.EVENT_HOOKS.append(crash_after_step_5)
    try:
        with pytest.raises(Crash):
            train_and_evaluate(config, "s3://bucket/run", task)
    finally:
        loop.EVENT_HOOKS.remove(crash_after_step_5)
    resumed = train_and_evaluate(config, "s3://bucket/run", task)
    full = train_and_evaluate(config, tmp_path / "local", task)

    assert os.listdir(cwd) == []  # no URL became a relative local path
    assert all(str(d) == "s3://bucket/run/checkpoints" for d in handed) and len(handed) == 2
    files = set(fake_s3)
    for name in ("config.json", "metrics.jsonl", "results.json", "vocab.txt"):
        assert f"s3://bucket/run/{name}" in files, sorted(files)
    events = [f for f in files if f.startswith("s3://bucket/run/tensorboard/events.out.tfevents")]
    assert len(events) == 2 and all(len(fake_s3[f].getvalue()) > 100 for f in events)
    assert resumed["resumed_at_step"] == 4.0
    for key in ("valid_loss", "test_loss", "test_accuracy"):
        assert resumed[key] == full[key], key
    # The remote metrics.jsonl (trimmed to step 4 at resume, then rewritten whole) equals the local run's.
    remote = [json.loads(line) for line in fake_s3["s3://bucket/run/metrics.jsonl"].getvalue().decode().splitlines()]
    local = [json.loads(line) for line in (tmp_path / "local" / "metrics.jsonl").read_text().splitlines()]
    timing = TIMING_METRICS
    strip = [[{k: v for k, v in m.items() if k not in timing} for m in ms] for ms in (remote, local)]
    assert strip[0] == strip[1]
    # A finished remote workdir is recognised from its results.json.
    assert train_and_evaluate(config, "s3://bucket/run", task) == json.loads(
        fake_s3["s3://bucket/run/results.json"].getvalue()
    )


def test_paths_helpers_keep_urls_and_refuse_urls_for_local_data(fake_s3, tmp_path):
    assert str(as_path("s3://bucket/a/b")) == "s3://bucket/a/b"
    assert str(as_path("s3://bucket/a") / "c") == "s3://bucket/a/c"
    assert str(as_path("rel")) == os.path.join(os.getcwd(), "rel")
    atomic_write_bytes("s3://bucket/x.json", b"{}")
    assert fake_s3["s3://bucket/x.json"].getvalue() == b"{}"
    atomic_write_bytes(tmp_path / "x.json", b"[]")
    assert (tmp_path / "x.json").read_bytes() == b"[]" and os.listdir(tmp_path) == ["x.json"]
    with pytest.raises(ValueError, match=r"data.dir=gs://b/lra: must be a local path"):
        require_local("gs://b/lra", "data.dir")
    config = ml_collections.ConfigDict({"data": {"dir": "gs://b/lra", "nested": {"cache_dir": "s3://c"}}})
    assert config_problems(config) == [
        "data.dir=gs://b/lra must be a local path (copy the data to local disk first)",
        "data.nested.cache_dir=s3://c must be a local path (copy the data to local disk first)",
    ]
