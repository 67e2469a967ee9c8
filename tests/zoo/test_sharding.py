"""Sharding rules, and train steps on 8 fake CPU devices that agree with a single device."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import jax
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
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    script = Path(__file__).with_name("multidevice_check.py")
    run = subprocess.run(
        [sys.executable, str(script), "relu", "linear"], capture_output=True, text=True, env=env, timeout=900
    )
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[7:])
    for key, r in result.items():
        # Same data, same initialisation: only the order of floating-point reductions differs.
        assert max(abs(a - b) for a, b in zip(r["losses"], r["ref_losses"], strict=True)) < 1e-5, (key, r)
        assert r["max_param_diff"] < 2e-5, (key, r["max_param_diff"])
    q_spec, q_shard = result["relu/d2_f2_t2"]["shardings"]["query_kernel"]
    assert q_spec == "P('fsdp', 'tensor')" and q_shard == [16, 16]  # 32×32 split 2 × 2
    wo_spec, wo_shard = result["relu/d2_f2_t2"]["shardings"]["ffn_wo_kernel"]
    assert wo_spec == "P('tensor', 'fsdp')" and wo_shard == [32, 16]  # 64×32
    assert result["relu/data8"]["shardings"]["query_kernel"][0] == "P(None, None)"  # pure data parallel
