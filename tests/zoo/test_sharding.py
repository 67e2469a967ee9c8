"""Sharding rules, and train steps on 8 fake CPU devices that agree with a single device."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import chex
import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from zoo.training import mesh as mesh_lib
from zoo.training import mesh_config


class _FakeMesh:
    shape: ClassVar[dict[str, int]] = {"data": 2, "fsdp": 2, "tensor": 4}


def test_logical_rules_and_divisibility_fallback():
    mesh = _FakeMesh()
    assert mesh_lib.logical_to_spec(("embed", "heads"), (64, 64), mesh) == P("fsdp", "tensor")
    assert mesh_lib.logical_to_spec(("mlp", "embed"), (6, 64), mesh) == P(None, "fsdp")  # 6 % 4 != 0
    assert mesh_lib.logical_to_spec(("heads", None, None), (8, 3, 3), mesh) == P("tensor", None, None)
    assert mesh_lib.logical_to_spec(None, (5,), mesh) == P()
    assert mesh_lib.logical_to_spec(("heads", "mlp"), (8, 8), mesh) == P("tensor", None)  # one axis once
    with pytest.raises(ValueError, match="do not match parameter shape"):
        mesh_lib.logical_to_spec(("embed",), (4, 4), mesh)


def test_state_shardings_follow_metadata_on_one_device():
    from zoo import models

    mesh = mesh_lib.make_mesh(mesh_config())
    cfg = models.model_config(d_model=16, num_heads=2, mlp_dim=16, max_length=4)
    state = nnx.state(nnx.eval_shape(lambda: models.Encoder(cfg, rngs=nnx.Rngs(0))))
    shardings = mesh_lib.state_shardings(state, mesh)
    specs = {s.spec for s in jax.tree.leaves(shardings)}
    assert all(all(axis is None for axis in spec) for spec in specs), specs  # every axis has size 1


@pytest.mark.slow
def test_train_steps_on_8_fake_devices_match_one_device():
    # The device count added to conftest's flags (its fast compile settings included).
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    run = subprocess.run(
        # relu on every mesh; linear (its own state and projections) on the one that splits all three axes
        [sys.executable, "-m", "tests.zoo.multidevice_check", "relu", "linear=d2_f2_t2"],
        capture_output=True, text=True, env=env, timeout=900, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert set(result) == {"relu/data8", "relu/d2_f2_t2", "linear/d2_f2_t2"}
    for key, r in result.items():
        # Same data, same initialisation: only the order of floating-point reductions differs.
        assert max(abs(a - b) for a, b in zip(r["losses"], r["ref_losses"], strict=True)) < 1e-5, (key, r)
        # Adam divides by √v, which magnifies rounding where gradients are tiny; 5e-5 is still 1/240 of the most
        # a parameter moves in these 4 steps (4 × lr 3e-3), where a sharding error moves it by ~1e-3.
        assert r["max_param_diff"] < 5e-5, (key, r["max_param_diff"])
    q_spec, q_shard = result["relu/d2_f2_t2"]["shardings"]["query_kernel"]
    assert q_spec == "P('fsdp', 'tensor')" and q_shard == [16, 16]  # 32×32 split 2 × 2
    wo_spec, wo_shard = result["relu/d2_f2_t2"]["shardings"]["ffn_wo_kernel"]
    assert wo_spec == "P('tensor', 'fsdp')" and wo_shard == [32, 16]  # 64×32
    assert result["relu/data8"]["shardings"]["query_kernel"][0] == "P(None, None)"  # pure data parallel


def _abstract_params(**model):
    from zoo import models

    cfg = models.model_config(**{"num_layers": 2, "d_model": 32, "num_heads": 4, "mlp_dim": 64, **model})
    return nnx.state(
        nnx.eval_shape(lambda: models.SequenceClassifier(cfg, vocab_size=16, num_classes=5, rngs=nnx.Rngs(0))),
        nnx.Param,
    )


def test_sharding_report_names_what_the_mesh_axis_cannot_split_and_the_tolerance_refuses_it():
    class Fsdp4:
        shape: ClassVar[dict[str, int]] = {"data": 1, "fsdp": 4, "tensor": 1}

    even = mesh_lib.sharding_report(_abstract_params(d_model=256, mlp_dim=1024), Fsdp4())
    assert even["unsplit"] == [] and 0 < even["excess_fraction"] < 0.03  # only norms and tensor-axis biases
    tiny = mesh_lib.sharding_report(_abstract_params(), Fsdp4())
    assert tiny["unsplit"] == [] and tiny["excess_fraction"] > 0.1  # at d_model 32 those are 14%
    assert even["per_device"] > even["parameters"] / 4
    odd = mesh_lib.sharding_report(_abstract_params(d_model=30, num_heads=3, mlp_dim=60), Fsdp4())
    assert odd["excess_fraction"] == pytest.approx(0.75)  # d_model 30 on fsdp 4: nothing splits, 1 − 1/4
    assert any("mixer/query/kernel (30, 30): embed → fsdp of size 4" in u for u in odd["unsplit"]), odd["unsplit"]
    assert "not split" in mesh_lib.check_sharding(odd, tolerance=1.0)
    with pytest.raises(ValueError, match=r"exceeds mesh.sharding_tolerance=0.05"):
        mesh_lib.check_sharding(odd, tolerance=0.05)
    # Rules come from the config: with embed mapped to nothing, FSDP splits nothing and says so by the fraction.
    cfg = mesh_config()
    cfg.rules.embed = ""
    none = mesh_lib.sharding_report(_abstract_params(d_model=256), Fsdp4(), mesh_lib.rules_from_config(cfg))
    assert none["excess_fraction"] == pytest.approx(0.75) and none["unsplit"] == []


def test_rules_in_the_config_change_the_specs():
    mesh = _FakeMesh()
    cfg = mesh_config()
    cfg.rules.heads = "fsdp"
    cfg.rules.embed = ""
    rules = mesh_lib.rules_from_config(cfg)
    assert mesh_lib.logical_to_spec(("embed", "heads"), (64, 64), mesh, rules) == P(None, "fsdp")
    assert mesh_lib.logical_to_spec(("embed", "heads"), (64, 64), mesh) == P("fsdp", "tensor")


def test_a_mesh_that_splits_too_little_is_refused_before_the_workdir_is_written(tmp_path):
    workdir = tmp_path / "run"
    cmd = [sys.executable, "-m", "lra_flax", "--config=lra_flax/configs/listops.py:demo", f"--workdir={workdir}"]
    cmd += ["--fake_cpu_devices=4", "--config.mesh.data=1", "--config.mesh.fsdp=4", "--config.train.batch_size=8"]
    cmd += ["--config.model.d_model=30", "--config.model.num_heads=3", "--config.model.mlp_dim=60"]
    cmd += [f"--config.data.dir={tmp_path / 'data'}"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr[-3000:]
    assert "exceeds mesh.sharding_tolerance=0.05" in run.stderr and "embed → fsdp of size 4" in run.stderr
    assert not workdir.exists() and not (tmp_path / "data").exists()
    bad = subprocess.run([*cmd, "--config.mesh.rules.embed=batch"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "mesh.rules.embed='batch' must be one of fsdp, tensor or ''" in bad.stderr


def test_activations_are_pinned_to_the_batch_axes_at_every_block_boundary():
    from zoo import models
    from zoo.training import classification_loss, train_config
    from zoo.training.state import create_train_state, state_builder
    from zoo.training.steps import make_eval_step, make_train_step

    mesh = mesh_lib.make_mesh(mesh_config())
    cfg = models.model_config(num_layers=3, d_model=16, num_heads=2, mlp_dim=16, max_length=8)
    build = state_builder(
        lambda rngs: models.SequenceClassifier(cfg, vocab_size=16, num_classes=5, rngs=rngs), train_config(), 0
    )
    graphdef, state, sharding = create_train_state(build, mesh)
    shardings = mesh_lib.step_shardings(mesh, sharding)
    batch = {
        "inputs": jax.ShapeDtypeStruct((4, 8), "int32"),
        "targets": jax.ShapeDtypeStruct((4,), "int32"),
        "weights": jax.ShapeDtypeStruct((4,), "float32"),
    }
    constraint = 'sdy.sharding_constraint %[0-9]+ <@mesh, \\[\\{"data", "fsdp"\\}, \\{\\}, \\{\\}\\]>'
    train = make_train_step(graphdef, classification_loss(), accum_steps=1, **shardings)
    text = train.lower(state, batch, jax.random.key(0)).as_text()
    assert len(re.findall(constraint, text)) == 6, text.count("sharding_constraint")  # forward and gradient
    evaluate = make_eval_step(graphdef, classification_loss(), **shardings)
    assert len(re.findall(constraint, evaluate.lower(state, batch).as_text())) == 3
    # Outside the steps (no mesh: one device, decoding) the model has no constraint at all.
    model = nnx.merge(graphdef, state)[0]
    model.eval()
    text = jax.jit(lambda x: model(x)).lower(jax.ShapeDtypeStruct((4, 8), "int32")).as_text()
    assert "sharding_constraint" not in text


def test_on_one_device_the_state_is_built_operation_by_operation_with_the_jitted_initialisers_values():
    """A one-device mesh has nothing to shard: the state is built eagerly (its operations compile once per shape in
    a process, not once per run), with what the jitted initialiser makes and on the planned shardings."""
    from zoo import models
    from zoo.training import train_config
    from zoo.training.state import create_train_state, state_builder

    traced = []

    def build_model(rngs):
        traced.append(isinstance(jnp.zeros(()) + 0, jax.core.Tracer))
        return models.SequenceClassifier(cfg, vocab_size=16, num_classes=5, rngs=rngs)

    cfg = models.model_config(mixer="linear", num_layers=2, d_model=16, num_heads=2, mlp_dim=16, max_length=8)
    build = state_builder(build_model, train_config(), 3)
    _, state, sharding = create_train_state(build, mesh_lib.make_mesh(mesh_config()))
    assert traced == [True, False]  # the abstract build (eval_shape), then the state's, eagerly
    jitted = jax.jit(lambda: nnx.state(build()), out_shardings=sharding)()
    chex.assert_trees_all_close(state, jitted, atol=0, rtol=1e-6)
    assert jax.tree.leaves(jax.tree.map(lambda x, s: x.sharding == s, state, sharding)) == [True] * len(
        jax.tree.leaves(state)
    )
