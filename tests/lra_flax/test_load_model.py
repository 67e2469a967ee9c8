"""`zoo.training.load_model`: a training workdir gives back its model and config, with no task code, and refuses a
workdir it cannot read with a line naming the file."""

import json

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lra_flax.configs import listops as listops_config
from lra_flax.tasks import listops
from zoo import models
from zoo.training import load_model, train_and_evaluate
from zoo.training.state import restore_model


@pytest.mark.slow
def test_a_workdir_gives_back_its_model_as_the_task_builds_it(tmp_path):
    config = listops_config.get_config("demo")
    config.data.dir = str(tmp_path / "data")
    config.data.generator.update(num_train=64, num_valid=16, num_test=16, max_length=48)
    config.model.update(mixer="relu_l", num_layers=1, d_model=32, num_heads=2, mlp_dim=32, max_length=48)
    config.train.update(steps=4, batch_size=8, log_every=2, eval_every=0, checkpoint_every=4, eval_batch_size=16)
    task = listops.make_task(config)
    workdir = tmp_path / "run"
    train_and_evaluate(config, workdir, task)

    model, loaded_config = load_model(workdir)
    assert isinstance(model, models.SequenceClassifier) and loaded_config.model.mixer == config.model.mixer
    spec = json.loads((workdir / "model.json").read_text())
    assert spec == {"class": "zoo.models.classifiers.SequenceClassifier", "kwargs": task.build_model.built_with}
    expected, step = restore_model(task.build_model, config.train, workdir / "checkpoints")
    assert step == 4
    chex.assert_trees_all_equal(nnx.state(model, nnx.Param), nnx.state(expected, nnx.Param))
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 10, (2, 48)), jnp.int32)
    expected.eval()
    chex.assert_trees_all_equal(model(tokens), expected(tokens))  # in eval mode: no dropout

    # config.json edited to another mixer with the same parameter tree (relu_l → softmax): refused, not run.
    stored = json.loads((workdir / "config.json").read_text())
    (workdir / "config.json").write_text(json.dumps({**stored, "model": {**stored["model"], "mixer": "softmax"}}))
    message = r"checkpoints/4 was trained with another model config than the run's config.json: model.mixer: 'relu_l'"
    with pytest.raises(ValueError, match=message + r" \(trained\) -> 'softmax'"):
        load_model(workdir)
    (workdir / "config.json").write_text(json.dumps(stored))

    (workdir / "model.json").write_text(json.dumps({"class": "os.system", "kwargs": {}}))
    with pytest.raises(ValueError, match="model class 'os.system' is not one of zoo.models' classes"):
        load_model(workdir)
    (workdir / "model.json").unlink()
    with pytest.raises(FileNotFoundError, match="model.json does not exist: a workdir of a run from before"):
        load_model(workdir)
    with pytest.raises(FileNotFoundError, match="config.json does not exist"):
        load_model(tmp_path / "nothing")
