"""`python -m tests.zoo.multidevice_check MIXER[=MESH,...]...` with 8 fake CPU devices (see test_sharding.py): train
steps on several meshes (all of `MESHES` but one device, or those named) agree with one device.

Prints one JSON object: per mesh, the losses, the largest parameter difference from the 1-device run,
and the sharding of a few parameters.
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from zoo import models
from zoo.training import classification_loss, mesh_config, train_config
from zoo.training import mesh as mesh_lib
from zoo.training.state import create_train_state, state_builder
from zoo.training.steps import make_train_step

MESHES = {"one_device": dict(data=1), "data8": dict(data=8), "d2_f2_t2": dict(data=2, fsdp=2, tensor=2)}


def batches(n, size=16):
    rng = np.random.default_rng(0)
    for _ in range(n):
        inputs = rng.integers(1, 16, size=(size, 12)).astype(np.int32)
        inputs[: size // 2, 9:] = 0
        yield {
            "inputs": inputs,
            "targets": rng.integers(0, 5, size=(size,)).astype(np.int32),
            "weights": np.ones((size,), np.float32),
        }


def run(mesh_fields, mixer):
    devices = jax.devices()[: int(np.prod(list(mesh_fields.values())))]
    mesh = mesh_lib.make_mesh(mesh_config(**mesh_fields), devices=devices)
    cfg = models.model_config(
        mixer=mixer, num_layers=2, d_model=32, num_heads=4, mlp_dim=64, max_length=12, dropout=0.1
    )
    train = train_config(learning_rate=3e-3, warmup_steps=0, grad_accum_steps=2)

    def build_model(rngs):
        return models.SequenceClassifier(cfg, vocab_size=16, num_classes=5, rngs=rngs)

    graphdef, state, sharding = create_train_state(state_builder(build_model, train, seed=0), mesh)
    step = make_train_step(graphdef, classification_loss(), accum_steps=2, **mesh_lib.step_shardings(mesh, sharding))
    losses = []
    for batch in batches(4):
        state, sums = step(state, mesh_lib.put_batch(batch, mesh), jax.random.key(0))
        losses.append(float(sums["loss"] / sums["count"]))
    model_state = nnx.state(nnx.merge(graphdef, state)[0], nnx.Param)
    block = model_state["encoder"]["encoder"]["blocks"][0]
    shardings = {
        "query_kernel": [
            str(block["mixer"]["query"]["kernel"][...].sharding.spec),
            block["mixer"]["query"]["kernel"][...].addressable_shards[0].data.shape,
        ],
        "ffn_wo_kernel": [
            str(block["ffn"]["wo"]["kernel"][...].sharding.spec),
            block["ffn"]["wo"]["kernel"][...].addressable_shards[0].data.shape,
        ],
        "embedding": [str(model_state["encoder"]["embed"]["embed"]["embedding"][...].sharding.spec), None],
    }
    params = jax.tree.map(lambda x: np.asarray(jax.device_get(x)), nnx.to_pure_dict(model_state))
    return losses, params, shardings


def main():
    assert jax.device_count() == 8, jax.device_count()
    out = {}
    for arg in sys.argv[1:]:
        mixer, _, named = arg.partition("=")
        meshes = named.split(",") if named else [name for name in MESHES if name != "one_device"]
        ref_losses, ref_params, _ = run(MESHES["one_device"], mixer)
        for name in meshes:
            fields = MESHES[name]
            losses, params, shardings = run(fields, mixer)
            diff = max(jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(a - b).max()), params, ref_params)))
            out[f"{mixer}/{name}"] = {
                "losses": losses,
                "ref_losses": ref_losses,
                "max_param_diff": diff,
                "shardings": shardings,
            }
    print("RESULT " + json.dumps(out, default=str))


if __name__ == "__main__":
    jnp.zeros(())  # start the backend with the forced device count
    main()
