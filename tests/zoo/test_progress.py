"""Long work shows progress with a rate; a failed cache write leaves no temporary file behind."""

import io

import numpy as np
import pytest

from lra_flax.tasks import listops
from zoo.progress import StepProgress, WorkProgress
from zoo.training import data as data_lib


def test_log_lines_carry_count_total_and_rate_when_not_a_terminal():
    stream = io.StringIO()
    with WorkProgress("caching test", total=4, unit="examples", every_s=0.0, stream=stream) as bar:
        for _ in range(4):
            bar.update()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4  # one per update (every 0 s); the closing line would repeat the last
    assert lines[-1].startswith("caching test: 4/4 examples in ") and "examples/s" in lines[-1]
    assert lines[0].startswith("caching test: 1/4 examples") and "s left" in lines[0]
    stream = io.StringIO()
    with WorkProgress("caching test", total=4, unit="examples", every_s=3600.0, stream=stream) as bar:
        bar.update(4)
    assert [line.split(" in ")[0] for line in stream.getvalue().splitlines()] == ["caching test: 4/4 examples"]


def test_the_train_loop_s_progress_logs_a_line_per_interval_with_its_rates_when_not_a_terminal(capsys):
    progress = StepProgress(total=10, initial=4)  # resumed at step 4; pytest's stderr is not a terminal
    progress.update(2)
    progress.log(6, "train", {"loss": 0.51234, "steps_per_sec": 3.0, "mfu": 0.4567, "note": float("nan")})
    progress.log(6, "valid", {"accuracy": 0.25})
    progress.close()
    assert capsys.readouterr().out.splitlines() == [
        "[train] step 6/10 loss=0.5123 steps_per_sec=3 mfu=0.4567 note=nan",
        "[valid] step 6/10 accuracy=0.25",
    ]
    quiet = StepProgress(total=10, initial=0, enabled=False)  # processes other than the writer
    quiet.log(1, "train", {"loss": 1.0})
    assert capsys.readouterr().out == ""


def test_listops_generation_reports_progress(tmp_path, capsys):
    listops.write_dataset(tmp_path, num_train=20, num_valid=2, num_test=2, seed=0, min_length=5, max_length=60)
    assert "generating ListOps: 24/24 examples" in capsys.readouterr().err


def test_failed_cache_write_removes_its_temporary_file(tmp_path):
    def examples():
        yield {"inputs": np.zeros(3, np.int32)}
        raise ValueError("data.tsv:2: bad line")

    with pytest.raises(ValueError, match="data.tsv:2: bad line"):
        data_lib.write_records(tmp_path / "cache" / "split.array_record", examples(), progress="caching split")
    assert list((tmp_path / "cache").iterdir()) == []


def test_atomic_writes_leave_the_old_file_or_the_new_one(tmp_path):
    from zoo.files import atomic_write_bytes

    path = tmp_path / "counts.npy"
    data_lib.atomic_save_npy(path, np.arange(5))
    np.testing.assert_array_equal(np.load(path), np.arange(5))
    with pytest.raises(TypeError):
        atomic_write_bytes(path, "not bytes")  # fails while writing the temporary file
    np.testing.assert_array_equal(np.load(path), np.arange(5))  # the old file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["counts.npy"]  # no temporary left behind
    atomic_write_bytes(tmp_path / "new" / "folder" / "out.txt", b"x")  # a folder the output checks accepted
    assert (tmp_path / "new" / "folder" / "out.txt").read_bytes() == b"x"


def test_a_write_that_fails_names_its_file_and_leaves_no_temporary_file(tmp_path):
    import errno

    from zoo.files import atomic_open

    path = tmp_path / "basic_train.tsv"
    with pytest.raises(OSError, match=rf"No space left on device \(while writing it\): '{path}'") as caught:
        with atomic_open(path) as f:
            f.write("Source\tTarget\n")
            raise OSError(errno.ENOSPC, "No space left on device")  # what a full disk raises, with no file named
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)
    assert list(tmp_path.iterdir()) == []  # neither the file nor a temporary one: the next run starts clean
