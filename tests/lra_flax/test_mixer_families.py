"""A short ListOps run with every registered mixer (each family and its main options) trains without NaNs."""

import math

import pytest

from lra_flax.configs import listops as listops_config
from lra_flax.tasks import listops
from zoo import mixers
from zoo.training import train_and_evaluate

VARIANTS = [(name, {}) for name in mixers.names()] + [
    ("relu", {"norm_loss_weight": 0.05, "entropy_loss_weight": 0.05}),
    ("linear", {"feature_map": "favor", "num_features": 32, "favor_redraw": True}),
    ("linear", {"feature_map": "aoglu", "kernel_depth": 3}),
    ("gmlp", {"toeplitz": True}),
]


@pytest.mark.slow
def test_every_mixer_trains_on_listops_without_nans(tmp_path):
    failures = []
    for i, (name, options) in enumerate(VARIANTS):
        config = listops_config.get_config("demo")
        config.data.dir = str(tmp_path / "data")
        config.data.generator.update(num_train=64, num_valid=16, num_test=16, max_length=48)
        config.model.update(num_layers=1, d_model=32, num_heads=2, mlp_dim=32, max_length=48)
        config.model.mixer = name
        config.model.mixer_options[name].update(options)
        if name in ("gmlp", "amlp"):
            config.model.ffn = "none"
            config.model.mixer_options[name].d_ffn = 64
        config.train.update(steps=6, batch_size=8, log_every=3, eval_every=0, checkpoint_every=6, eval_batch_size=16)
        results = train_and_evaluate(config, tmp_path / f"run{i}", listops.make_task(config))
        if not all(math.isfinite(v) for v in results.values() if isinstance(v, float)):
            failures.append((name, options, results))
    assert not failures, failures
