"""The check that incremental decoding reproduces the full forward, shared by the decoding tests."""

import chex
import jax
from flax import nnx


def assert_encoder_decoder_decodes_like_its_full_forward(model: nnx.Module, src: jax.Array, tgt: jax.Array) -> None:
    """Feeding `tgt` one token at a time through the decoder's cache gives the full forward's logits. Both run as
    one compiled program: eagerly, each of the model's operations is lowered on its own, which costs the test suite
    more than compiling the whole."""

    @jax.jit
    def full_and_stepwise(src, tgt):
        enc, src_mask = model.encode(src)

        def step(cache, token):
            logits, cache = model.decode(token[:, None], cache, enc, src_mask)
            return cache, logits[:, 0]

        _, steps = jax.lax.scan(step, model.init_cache(src.shape[0]), tgt.T)
        return model(src, tgt), steps.transpose(1, 0, 2)

    full, stepwise = full_and_stepwise(src, tgt)
    chex.assert_trees_all_close(stepwise, full, atol=2e-4, rtol=2e-4)
