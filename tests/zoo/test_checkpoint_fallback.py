"""A checkpoint step that no longer restores is reported in one line, moved aside (never deleted), and the
step before it restores — state, meta and the data iterator's position — for each way a step can break."""

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.training.checkpoints import CheckpointDamaged, Checkpointer, NoCheckpointRestores

ABSTRACT = {"w": jax.ShapeDtypeStruct((4, 3), jnp.float32), "b": jax.ShapeDtypeStruct((3,), jnp.float32)}


def _iterator():
    return iter(grain.MapDataset.range(100).to_iter_dataset())


def _save_steps(directory, steps=(1, 2)):
    it = _iterator()
    checkpointer = Checkpointer(directory, max_to_keep=5)
    for step in steps:
        for _ in range(step):  # step s leaves the iterator at s·(s+1)/2
            next(it)
        state = {"w": jnp.full((4, 3), float(step)), "b": jnp.arange(3.0) * step}
        checkpointer.save(step, state, it, {"step": step, "note": f"step {step}"})
    checkpointer.close()


def _data_files(step_dir):
    return sorted(p for p in (step_dir / "state" / "d").iterdir() if p.is_file())


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


CORRUPTIONS = {
    "state file deleted": lambda d: _data_files(d)[0].unlink(),
    "state file truncated": lambda d: [f.write_bytes(f.read_bytes()[:40]) for f in _data_files(d)],
    "state file altered": lambda d: [_flip_byte(f) for f in _data_files(d)],
    "state metadata deleted": lambda d: (d / "state" / "_METADATA").unlink(),
    "state manifest deleted": lambda d: (d / "state" / "manifest.ocdbt").unlink(),
    "meta overwritten": lambda d: (d / "meta" / "metadata").write_text("garbage"),
    "data iterator state overwritten": lambda d: next((d / "data").glob("*.json")).write_text("{"),
    "meta of another step": lambda d: (d / "meta" / "metadata").write_text('{"step": 7}'),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_falls_back_to_the_previous_step_and_keeps_the_broken_one(tmp_path, kind):
    directory = tmp_path / "checkpoints"
    _save_steps(directory)
    CORRUPTIONS[kind](directory / "2")
    broken_files = sorted(p.relative_to(directory / "2") for p in (directory / "2").rglob("*"))

    lines = []
    it = _iterator()
    checkpointer = Checkpointer(directory, max_to_keep=5)
    step, state, meta = checkpointer.restore_latest(ABSTRACT, it, report=lines.append)

    assert step == 1 and meta["step"] == 1
    np.testing.assert_array_equal(state["w"], np.full((4, 3), 1.0))
    np.testing.assert_array_equal(state["b"], np.arange(3.0))
    assert next(it) == 1  # the iterator is where step 1 left it
    assert len(lines) == 1 and "\n" not in lines[0]
    assert (
        lines[0].startswith("checkpoint step 2 does not restore (")
        and str(tmp_path / "checkpoints_broken" / "2") in lines[0]
    )
    moved = tmp_path / "checkpoints_broken" / "2"
    assert sorted(p.relative_to(moved) for p in moved.rglob("*")) == broken_files  # moved whole, not deleted
    assert checkpointer.latest_step() == 1 and not (directory / "2").exists()
    checkpointer.close()


def test_a_broken_file_is_named_in_the_line(tmp_path):
    directory = tmp_path / "checkpoints"
    _save_steps(directory)
    (directory / "2" / "meta" / "metadata").write_text("garbage")
    lines = []
    Checkpointer(directory, max_to_keep=5).restore_latest(ABSTRACT, _iterator(), report=lines.append)
    assert str(directory / "2" / "meta" / "metadata") in lines[0] and "not valid JSON" in lines[0]


def test_every_step_broken_is_one_error_and_nothing_is_deleted(tmp_path):
    directory = tmp_path / "checkpoints"
    _save_steps(directory)
    for step in (1, 2):
        (directory / str(step) / "state" / "_METADATA").unlink()
    lines = []
    checkpointer = Checkpointer(directory, max_to_keep=5)
    with pytest.raises(NoCheckpointRestores, match=r"steps 2, 1, moved to .*checkpoints_broken"):
        checkpointer.restore_latest(ABSTRACT, _iterator(), report=lines.append)
    assert [line.split(" does not")[0] for line in lines] == ["checkpoint step 2", "checkpoint step 1"]
    assert sorted(p.name for p in (tmp_path / "checkpoints_broken").iterdir()) == ["1", "2"]
    assert checkpointer.restore_latest(ABSTRACT, _iterator()) is None  # the next run starts afresh
    checkpointer.close()


def test_a_second_break_of_the_same_step_keeps_the_first(tmp_path):
    directory = tmp_path / "checkpoints"
    for attempt in range(2):
        _save_steps(directory, steps=(1, 2) if attempt == 0 else (2,))
        (directory / "2" / "meta" / "metadata").write_text(f"garbage {attempt}")
        Checkpointer(directory, max_to_keep=5).restore_latest(ABSTRACT, _iterator(), report=lambda _: None)
    broken = tmp_path / "checkpoints_broken"
    assert (broken / "2" / "meta" / "metadata").read_text() == "garbage 0"
    assert (broken / "2.1" / "meta" / "metadata").read_text() == "garbage 1"


def test_no_checkpoint_is_none(tmp_path):
    assert Checkpointer(tmp_path / "checkpoints", max_to_keep=2).restore_latest(ABSTRACT, _iterator()) is None


@pytest.mark.parametrize("kind", sorted(k for k in CORRUPTIONS if k.startswith("state")))
def test_restoring_the_state_alone_says_the_step_is_damaged_and_names_the_others(tmp_path, kind):
    """Inference, fine-tuning and inspection restore a step read-only: a damaged one is an error, not moved aside."""
    directory = tmp_path / "checkpoints"
    _save_steps(directory)
    CORRUPTIONS[kind](directory / "2")
    checkpointer = Checkpointer(directory, max_to_keep=5)
    with pytest.raises(
        CheckpointDamaged, match=r"step 2 is damaged and does not restore \(.+\); the other steps there: 1$"
    ) as caught:
        checkpointer.restore_state(2, ABSTRACT)
    assert "TensorStore" not in str(caught.value)  # its details are a pybind11 repr, not for the user
    np.testing.assert_array_equal(checkpointer.restore_state(1, ABSTRACT)["w"], np.full((4, 3), 1.0))
    checkpointer.close()
    assert sorted(p.name for p in directory.iterdir()) == ["1", "2"]


def test_restoring_the_state_into_another_model_names_the_arrays_that_differ(tmp_path):
    directory = tmp_path / "checkpoints"
    _save_steps(directory)
    checkpointer = Checkpointer(directory, max_to_keep=5)
    wider = {**ABSTRACT, "w": jax.ShapeDtypeStruct((4, 5), jnp.float32)}
    with pytest.raises(
        ValueError, match=r"does not match the model .*1 arrays differ; w: saved \(4, 3\), model \(4, 5\)"
    ):
        checkpointer.restore_state(2, wider)
    fewer = {"w": ABSTRACT["w"]}
    with pytest.raises(ValueError, match=r"does not match the model .*b: saved \(3,\), model None"):
        checkpointer.restore_state(2, fewer)
    checkpointer.close()


def test_a_step_that_is_not_there_is_named_with_the_steps_that_are(tmp_path):
    from zoo.training.state import restore_model

    _save_steps(tmp_path / "checkpoints")
    with pytest.raises(FileNotFoundError, match=r"no checkpoint of step 7 in .*checkpoints; its steps: 1, 2$"):
        restore_model(lambda rngs: None, None, tmp_path / "checkpoints", step=7)
    with pytest.raises(FileNotFoundError, match=r"no checkpoint in .*empty"):
        restore_model(lambda rngs: None, None, tmp_path / "empty")
