"""Softmax attention, the baseline (SPEC §1.1), through `jax.nn.dot_product_attention` (cuDNN on GPU)."""

from __future__ import annotations

import jax

from zoo.mixers.attention import MultiHeadMixer
from zoo.mixers.registry import register


class SoftmaxAttention(MultiHeadMixer):
    def attend(self, q, k, v, mask, causal):
        bias_mask = None if mask is None else mask[:, None, None, :]
        return jax.nn.dot_product_attention(q, k, v, mask=bias_mask, is_causal=causal)


register("softmax", SoftmaxAttention, lambda: {})
