"""zoo.training: schedules, steps (accumulation, bf16, label smoothing), data pipelines, config checks, mesh."""

import json
import re

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from zoo import models
from zoo.training import ConfigMismatchError, classification_loss, make_schedule, mesh_config, train_config
from zoo.training import data as data_lib
from zoo.training import mesh as mesh_lib
from zoo.training.config import check_resume_config, write_config
from zoo.training.loop import Task, check_batch_rows, evaluate
from zoo.training.optim import make_optimizer
from zoo.training.steps import make_eval_step, make_train_step


@pytest.mark.parametrize("base, warmup", [(0.05, 1000), (0.05, 8000)])  # LRA ListOps; Text and Retrieval
def test_rsqrt_schedule_is_the_lra_code_schedule_to_the_step(base, warmup):
    """lra_benchmarks/utils/train_utils.py:118-147 (create_learning_rate_scheduler, commit cd31e5c) with
    factors "constant * linear_warmup * rsqrt_decay": lr(s) = base · min(1, s/w) / √max(s, w), and the step the
    train step passes is optimizer.state.step, 0 for the first update (listops/train.py:116-117)."""
    sched = make_schedule(train_config(schedule="rsqrt", learning_rate=base, warmup_steps=warmup))

    def lra(step):  # the factors, one by one, as train_utils.step_fn multiplies them
        return base * min(1.0, step / warmup) / np.sqrt(max(step, warmup))

    for step in (0, warmup - 1, warmup, warmup + 1, 10 * warmup):
        np.testing.assert_allclose(float(sched(step)), lra(step), rtol=1e-6, atol=0)
    assert float(sched(0)) == 0.0  # the first update does not move the parameters, as in the LRA code
    np.testing.assert_allclose(float(sched(warmup)), base / np.sqrt(warmup), rtol=1e-6)  # the peak


def test_rsqrt_schedule_is_fairseqs_inverse_sqrt():
    """fairseq/optim/lr_scheduler/inverse_square_root_schedule.py (warmup_init_lr 0): lr(n) = n·lr/w below the
    warmup, lr·√w/√n after; `learning_rate` = fairseq's lr · √w. fairseq's k-th update uses lr(k − 1)."""
    lr, w = 5e-4, 4000
    sched = make_schedule(train_config(schedule="rsqrt", learning_rate=lr * np.sqrt(w), warmup_steps=w))
    for n in (0, 1, 3999, 4000, 4001, 40000):
        fairseq = n * lr / w if n < w else lr * np.sqrt(w) / np.sqrt(n)
        np.testing.assert_allclose(float(sched(n)), fairseq, rtol=1e-6, atol=1e-12)


def test_cosine_and_constant_schedules():
    cos = make_schedule(train_config(schedule="cosine", learning_rate=1e-3, warmup_steps=10, steps=110))
    np.testing.assert_allclose(float(cos(10)), 1e-3, rtol=1e-5)
    assert float(cos(110)) < 1e-9 and float(cos(5)) == pytest.approx(5e-4)
    const = make_schedule(train_config(schedule="constant", learning_rate=2e-3, warmup_steps=4))
    np.testing.assert_allclose([float(const(s)) for s in (2, 4, 50)], [1e-3, 2e-3, 2e-3], rtol=1e-5)
    with pytest.raises(ValueError, match=r"train.schedule='linear' is unknown; valid: rsqrt, cosine, constant"):
        make_schedule(train_config(schedule="linear"))


def _setup(accum=1, dtype="float32", label_smoothing=0.0, dropout=0.0, mixer="relu", rows_seen=None, **mixer_options):
    cfg = models.model_config(
        num_layers=1, d_model=32, num_heads=4, mlp_dim=32, max_length=10, dtype=dtype, dropout=dropout, mixer=mixer
    )
    cfg.mixer_options[mixer].update(mixer_options)
    model = models.SequenceClassifier(cfg, vocab_size=12, num_classes=5, rngs=nnx.Rngs(0))
    opt = nnx.Optimizer(model, make_optimizer(train_config(learning_rate=1e-2, warmup_steps=0)), wrt=nnx.Param)
    graphdef, state = nnx.split((model, opt))
    mesh = mesh_lib.make_mesh(mesh_config())
    sh = mesh_lib.step_shardings(mesh, mesh_lib.state_shardings(state, mesh))
    loss = classification_loss(label_smoothing)

    def train_loss(model, batch, rngs, train):
        if rows_seen is not None:  # the rows of each batch the train step's loss is traced with
            rows_seen.append(batch["inputs"].shape[0])
        return loss(model, batch, rngs, train)

    return (
        graphdef,
        state,
        make_train_step(graphdef, train_loss, accum_steps=accum, **sh),
        make_eval_step(graphdef, loss, **sh),
    )


def _batch(n=8, seed=0):
    rng = np.random.default_rng(seed)
    inputs = rng.integers(1, 12, size=(n, 10)).astype(np.int32)
    inputs[:, 7:] = 0
    return {
        "inputs": inputs,
        "targets": rng.integers(0, 5, size=(n,)).astype(np.int32),
        "weights": np.ones((n,), np.float32),
    }


def tiny_loop_run(steps: int, *, batch=None, loss_fn=None, **task_fields):
    """(config, Task) of a one-layer classifier trained by the real loop on random batches (`batch(i)`)."""
    import grain

    from zoo.training import Task

    batch = batch or (lambda i: _batch(seed=int(i)))
    cfg = models.model_config(num_layers=1, d_model=16, num_heads=2, mlp_dim=16, max_length=10, dropout=0.0)
    config = ml_collections.ConfigDict(
        {
            "seed": 0,
            "mesh": mesh_config(),
            "model": cfg,
            "train": train_config(steps=steps, batch_size=8, log_every=2, checkpoint_every=2, eval_every=0),
        }
    )
    example = batch(0)
    task_fields.setdefault(
        "batch_spec",
        lambda n: {k: jax.ShapeDtypeStruct((n, *v.shape[1:]), v.dtype) for k, v in example.items()},
    )
    task = Task(
        build_model=lambda rngs: models.SequenceClassifier(cfg, vocab_size=12, num_classes=5, rngs=rngs),
        train_batches=lambda: grain.MapDataset.range(1000).map(batch).to_iter_dataset(),
        eval_batches=lambda split: [_batch()],
        loss_fn=loss_fn or classification_loss(),
        **task_fields,
    )
    return config, task


def test_gradient_accumulation_equals_one_big_batch():
    batch = _batch()
    rows1, rows4 = [], []
    _, s1, step1, _ = _setup(accum=1, rows_seen=rows1)
    _, s4, step4, _ = _setup(accum=4, rows_seen=rows4)
    key = jax.random.key(0)
    s1, m1 = step1(s1, batch, key)
    s4, m4 = step4(s4, batch, key)
    assert rows1 == [8] and rows4 and set(rows4) == {2}  # four micro-batches of 2 rows (the equality alone
    # would hold with accumulation switched off)
    chex.assert_trees_all_close(m1["loss"], m4["loss"], rtol=1e-5)
    chex.assert_trees_all_close(nnx.to_pure_dict(s1), nnx.to_pure_dict(s4), atol=1e-5, rtol=1e-4)


def test_train_step_reduces_loss_and_bf16_keeps_fp32_params():
    batch = _batch()
    for dtype in ("float32", "bfloat16"):
        _, state, step, eval_step = _setup(dtype=dtype)
        before = float(eval_step(state, batch)["loss"])
        for _ in range(20):
            state, metrics = step(state, batch, jax.random.key(1))
        chex.assert_tree_all_finite(metrics)
        assert float(eval_step(state, batch)["loss"]) < 0.5 * before, dtype
        for leaf in jax.tree.leaves(nnx.to_pure_dict(state)[0]):
            assert leaf.dtype == jnp.float32


def test_label_smoothing_only_in_training():
    batch = _batch()
    _, state, step, eval_step = _setup(label_smoothing=0.2)
    _, _, plain_step, plain_eval = _setup(label_smoothing=0.0)
    _, m_smooth = step(jax.tree.map(jnp.copy, state), batch, jax.random.key(0))
    _, m_plain = plain_step(jax.tree.map(jnp.copy, state), batch, jax.random.key(0))
    assert float(m_smooth["loss"]) != pytest.approx(float(m_plain["loss"]))
    chex.assert_trees_all_close(eval_step(state, batch), plain_eval(state, batch))


def test_dropout_keys_follow_the_step():
    batch = _batch()
    _, state, step, _ = _setup(dropout=0.5)
    a, ma = step(jax.tree.map(jnp.copy, state), batch, jax.random.key(0))
    _, mb = step(jax.tree.map(jnp.copy, state), batch, jax.random.key(0))
    chex.assert_trees_all_equal(ma, mb)  # same step, same key: identical
    _, mc = step(a, batch, jax.random.key(0))
    assert float(mc["loss"]) != float(ma["loss"])


def _records(tmp_path, n):
    path = tmp_path / "x.array_record"
    data_lib.write_records(path, ({"inputs": np.full((3,), i, np.int32), "targets": np.int32(i)} for i in range(n)))
    return data_lib.read_records(path)


def test_eval_batches_cover_every_example_once(tmp_path):
    ds = _records(tmp_path, 23)
    batches = list(data_lib.eval_batches(ds, global_batch=5))
    assert len(batches) == 5 and all(b["inputs"].shape == (5, 3) for b in batches)
    weights = np.concatenate([b["weights"] for b in batches])
    targets = np.concatenate([b["targets"] for b in batches])
    assert weights.sum() == 23
    np.testing.assert_array_equal(targets[weights > 0], np.arange(23))


def test_train_batches_are_seeded_and_resumable(tmp_path):
    ds = _records(tmp_path, 10)
    it = iter(data_lib.train_batches(ds, global_batch=4, seed=3))
    first = [next(it)["targets"] for _ in range(3)]
    state = it.get_state()
    rest = [next(it)["targets"] for _ in range(4)]
    again = iter(data_lib.train_batches(ds, global_batch=4, seed=3))
    assert all(np.array_equal(a, next(again)["targets"]) for a in first)
    resumed = iter(data_lib.train_batches(ds, global_batch=4, seed=3))
    resumed.set_state(state)
    assert all(np.array_equal(r, next(resumed)["targets"]) for r in rest)
    # Each epoch (10 examples, drop_remainder per epoch boundary does not apply: batches span epochs) is a permutation.
    seen = np.concatenate(first + rest)[:10]
    assert sorted(seen.tolist()) == list(range(10))
    with pytest.raises(ValueError, match="training split is empty"):
        data_lib.train_batches(ds[0:0], global_batch=4, seed=0)


def _cfg():
    return ml_collections.ConfigDict({"seed": 0, "model": {"d_model": 8}, "train": train_config()})


def test_resume_config_check_names_the_field_and_writes_nothing(tmp_path):
    write_config(_cfg(), tmp_path)
    (tmp_path / "checkpoints" / "10").mkdir(parents=True)  # the run got as far as a checkpoint
    before = (tmp_path / "config.json").read_text()
    changed = _cfg()
    changed.model.d_model = 16
    with pytest.raises(ConfigMismatchError, match=r"model.d_model: 8 -> 16"):
        check_resume_config(changed, tmp_path)
    assert (tmp_path / "config.json").read_text() == before
    longer = _cfg()
    longer.train.steps = 5000  # the cosine schedule decays to 0 at train.steps: the steps run would differ
    with pytest.raises(
        ConfigMismatchError, match=r"train.steps 1000 -> 5000 cannot change on resume with the 'cosine'"
    ):
        check_resume_config(longer, tmp_path)
    longer.model.d_model = 16  # and another field: both are named at once
    with pytest.raises(
        ConfigMismatchError, match=r"model.d_model: 8 -> 16\n  train.steps: 1000 -> 5000\n.*not with the"
    ):
        check_resume_config(longer, tmp_path)
    assert (tmp_path / "config.json").read_text() == before
    (tmp_path / "config.json").unlink()  # the record gone: a resume cannot be checked, so it is refused
    with pytest.raises(ConfigMismatchError, match=r"config.json is missing but the run there saved checkpoints"):
        check_resume_config(_cfg(), tmp_path)
    assert not (tmp_path / "config.json").exists()


@pytest.mark.parametrize("schedule", ["rsqrt", "constant"])
def test_resume_may_train_longer_where_the_schedule_allows_and_change_eval_batch(tmp_path, schedule):
    first = _cfg()
    first.train.schedule = schedule
    write_config(first, tmp_path)
    longer = _cfg()
    longer.train.update(schedule=schedule, steps=5000, eval_batch_size=7, log_every=3)
    check_resume_config(longer, tmp_path)
    write_config(longer, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["train"]["steps"] == 5000


def test_mesh_shape():
    assert mesh_lib.mesh_shape(mesh_config(), 8) == (8, 1, 1)
    assert mesh_lib.mesh_shape(mesh_config(data=2, fsdp=-1, tensor=2), 8) == (2, 2, 2)
    with pytest.raises(ValueError, match="at most one"):
        mesh_lib.mesh_shape(mesh_config(data=-1, fsdp=-1), 8)
    with pytest.raises(ValueError, match="does not divide 8 devices"):
        mesh_lib.mesh_shape(mesh_config(data=3), 8)
    with pytest.raises(ValueError, match="needs 4 devices, have 8"):
        mesh_lib.mesh_shape(mesh_config(data=2, fsdp=2, tensor=1), 8)


@pytest.mark.parametrize("poisoned, kept", [(5, "The last good checkpoint (step 4) is kept"), (1, "No checkpoint")])
def test_non_finite_loss_is_never_checkpointed(tmp_path, poisoned, kept):
    """A loss that turns NaN at step 6 stops the run; checkpoint 4 stays the latest and restores. At step 2,
    before any checkpoint, the message says there is none."""
    from zoo.training import train_and_evaluate
    from zoo.training.checkpoints import Checkpointer

    def batch(i):
        b = _batch(seed=int(i))
        b["poison"] = np.full((8,), i >= poisoned, bool)  # batch `poisoned` (step poisoned + 1) poisons the loss
        return b

    base_loss = classification_loss()

    def loss_fn(model, b, rngs, train):
        total, sums = base_loss(model, b, rngs, train)
        nan = jnp.where(b["poison"].any(), jnp.nan, 0.0)
        return total + nan, {**sums, "loss": sums["loss"] + nan}

    config, task = tiny_loop_run(10, batch=batch, loss_fn=loss_fn)
    config.train.log_every = 4
    with pytest.raises(
        FloatingPointError, match=rf"not finite .* at step {poisoned + 1}; refusing .* {re.escape(kept)}"
    ):
        train_and_evaluate(config, tmp_path, task)
    ckpt = Checkpointer(tmp_path / "checkpoints", max_to_keep=3)
    assert ckpt.latest_step() == (4 if poisoned == 5 else None)
    assert not (tmp_path / "results.json").exists()


def test_the_loop_tells_its_hooks_every_step_and_final_evaluation_and_resumes_after_a_crash(tmp_path):
    """EVENT_HOOKS (where tests inject faults) hear each finished step after its checkpoint started, then each
    final evaluation; an exception raised from a hook at step 5 leaves checkpoint 4, and re-running ends
    with the uninterrupted run's results."""
    from zoo.training import loop, train_and_evaluate

    config, task = tiny_loop_run(6, eval_splits=("valid", "test"))
    heard = []

    class Crash(Exception):
        pass

    def crash_at_5(event):
        heard.append((event.step, event.split))
        if event.step == 5 and event.split is None and len(heard) == 5:  # the first run only
            event.wait_for_checkpoints()
            raise Crash

    loop.EVENT_HOOKS.append(crash_at_5)
    try:
        with pytest.raises(Crash):
            train_and_evaluate(config, tmp_path / "crashed", task)
        assert heard == [(s, None) for s in range(1, 6)]
        heard.clear()
        resumed = train_and_evaluate(config, tmp_path / "crashed", task)
        assert heard == [(5, None), (6, None), (6, "valid"), (6, "test")]
    finally:
        loop.EVENT_HOOKS.remove(crash_at_5)
    assert resumed["resumed_at_step"] == 4.0
    full = train_and_evaluate(config, tmp_path / "full", task)
    for key in ("valid_loss", "test_loss", "valid_accuracy"):
        assert resumed[key] == full[key], key
    # Each train line logs the rate of its last update: the schedule at step − 1 (jitted in the loop: float32
    # rounding differs from the eager schedule's by a few parts in a million).
    from zoo.training import make_schedule

    logged = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    rates = {m["step"]: m["learning_rate"] for m in logged if m["split"] == "train"}
    assert sorted(rates) == [2, 4, 6]
    for step, rate in rates.items():
        assert rate == pytest.approx(float(make_schedule(config.train)(step - 1)), rel=1e-5), step


@pytest.mark.parametrize("accum", [1, 2])
def test_non_parameter_state_updates_reach_the_returned_state(accum):
    """FAVOR+ with redraw: each training forward draws new features; the step must keep them."""
    _, state, step, _ = _setup(accum=accum, mixer="linear", feature_map="favor", num_features=16, favor_redraw=True)

    def omega(state):
        model_state = nnx.to_pure_dict(state)[0]
        return model_state["encoder"]["encoder"]["blocks"][0]["mixer"]["feature_map"]["omega"]

    before = np.asarray(omega(state))
    state, _ = step(state, _batch(), jax.random.key(0))
    after = np.asarray(omega(state))
    assert not np.allclose(before, after)
    state, _ = step(state, _batch(), jax.random.key(0))
    assert not np.allclose(after, np.asarray(omega(state)))


@pytest.mark.parametrize("num_processes", [2, 4])
def test_batches_do_not_depend_on_the_number_of_processes(tmp_path, monkeypatch, num_processes):
    """Process p reads rows [p·B/P, (p+1)·B/P) of each global batch: together they are the 1-process batch."""
    ds = _records(tmp_path, 13)
    single_train = iter(data_lib.train_batches(ds, global_batch=8, seed=5))
    expected_train = [next(single_train)["targets"] for _ in range(5)]
    expected_eval = [b["targets"] for b in data_lib.eval_batches(ds, global_batch=8)]
    per_process_train, per_process_eval = [], []
    monkeypatch.setattr(jax, "process_count", lambda: num_processes)
    for p in range(num_processes):
        monkeypatch.setattr(jax, "process_index", lambda p=p: p)
        it = iter(data_lib.train_batches(ds, global_batch=8, seed=5))
        per_process_train.append([next(it)["targets"] for _ in range(5)])
        per_process_eval.append([(b["targets"], b["weights"]) for b in data_lib.eval_batches(ds, global_batch=8)])
    for i, expected in enumerate(expected_train):
        np.testing.assert_array_equal(np.concatenate([rows[i] for rows in per_process_train]), expected)
    assert all(len(rows) == len(expected_eval) for rows in per_process_eval)
    for i, expected in enumerate(expected_eval):
        targets = np.concatenate([rows[i][0] for rows in per_process_eval])
        weights = np.concatenate([rows[i][1] for rows in per_process_eval])
        np.testing.assert_array_equal(targets[weights > 0], expected[: int(weights.sum())])


def test_a_mesh_that_does_not_fit_fails_before_writing_the_workdir(tmp_path):
    from zoo.training import Task, train_and_evaluate

    cfg = models.model_config(num_layers=1, d_model=16, num_heads=2, mlp_dim=16, max_length=10)
    config = ml_collections.ConfigDict(
        {"seed": 0, "mesh": mesh_config(data=2), "model": cfg, "train": train_config(steps=2, batch_size=8)}
    )
    task = Task(
        build_model=lambda rngs: models.SequenceClassifier(cfg, vocab_size=12, num_classes=5, rngs=rngs),
        train_batches=lambda: None,
        eval_batches=lambda split: [],
        loss_fn=classification_loss(),
    )
    with pytest.raises(ValueError, match=r"does not divide 1 devices"):
        train_and_evaluate(config, tmp_path / "run", task)
    assert not (tmp_path / "run").exists()


def test_evaluate_stops_after_max_batches_and_counts_examples():
    mesh = mesh_lib.make_mesh(mesh_config())
    pulled = []

    def batches():
        for i in range(10):
            pulled.append(i)
            yield {"x": np.full((4,), i, np.float32)}

    def step(state, batch):
        return {"count": jnp.float32(4.0), "correct": jnp.sum(batch["x"] > 1).astype(jnp.float32)}

    limited = evaluate(step, None, batches(), mesh, max_batches=3)
    assert limited == {"accuracy": 4 / 12, "examples": 12.0} and pulled == [0, 1, 2]
    pulled.clear()
    assert evaluate(step, None, batches(), mesh)["examples"] == 40.0 and len(pulled) == 10


def test_train_batch_size_has_one_meaning_and_token_batched_tasks_use_row_multiple():
    fixed = Task(build_model=None, train_batches=None, eval_batches=None, loss_fn=None)
    by_tokens = Task(build_model=None, train_batches=None, eval_batches=None, loss_fn=None, row_multiple=6)
    assert check_batch_rows(train_config(batch_size=32), fixed) == (32, "train.batch_size")
    assert check_batch_rows(train_config(batch_size=0, grad_accum_steps=2), by_tokens) == (6, "data.row_multiple")
    with pytest.raises(ValueError, match=r"train.batch_size=0 must be at least 1"):
        check_batch_rows(train_config(batch_size=0), fixed)
    with pytest.raises(ValueError, match=r"train.batch_size=8: this task batches by tokens .*leave train.batch_size"):
        check_batch_rows(train_config(batch_size=8), by_tokens)
    with pytest.raises(ValueError, match=r"data.row_multiple=6 is not divisible by train.grad_accum_steps=4"):
        check_batch_rows(train_config(batch_size=0, grad_accum_steps=4), by_tokens)


def test_a_run_written_before_a_model_field_existed_resumes_unless_the_field_changes(tmp_path):
    """config.json of an older version lacks fields added since (here gMLP's sgu_variant): at their defaults
    (the computation the run did) resuming is allowed; set to anything else it is refused, naming the field."""
    from zoo.models import model_config

    config = ml_collections.ConfigDict({"seed": 0, "model": model_config(mixer="gmlp"), "train": train_config()})
    write_config(config, tmp_path)
    (tmp_path / "checkpoints" / "10").mkdir(parents=True)  # the run got as far as a checkpoint
    stored = json.loads((tmp_path / "config.json").read_text())
    del stored["model"]["mixer_options"]["gmlp"]["sgu_variant"]
    (tmp_path / "config.json").write_text(json.dumps(stored))
    check_resume_config(config, tmp_path)
    config.model.mixer_options.gmlp.sgu_variant = "additive"
    with pytest.raises(ConfigMismatchError, match=r"sgu_variant: 'split_multiplicative' -> 'additive'"):
        check_resume_config(config, tmp_path)


def test_a_damaged_records_file_is_named_with_what_to_do(tmp_path):
    path = tmp_path / "train-abc.array_record"
    data_lib.write_records(path, ({"x": np.arange(3)} for _ in range(5)))
    whole = path.read_bytes()
    path.write_bytes(whole[:100])  # cut short: a full disk, a copy interrupted
    with pytest.raises(data_lib.DataFormatError, match=rf"{path} is not a readable ArrayRecord file .*delete it"):
        data_lib.read_records(path)
    damaged = bytearray(whole)
    damaged[200] ^= 0xFF  # a flipped byte inside the records: found only when they are read
    path.write_bytes(bytes(damaged))
    batches = iter(data_lib.train_batches(data_lib.read_records(path), global_batch=5, seed=0))
    with pytest.raises(data_lib.DataFormatError, match=rf"{path} has a damaged record \d .*delete it"):
        next(batches)  # read by the input pipeline's threads, raised here with the file named
