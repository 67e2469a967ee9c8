"""Attention ops shared by the model zoo (ReLU, linear, and the softmax baseline): reference, blocked/chunked XLA
and Pallas implementations
(Mosaic TPU, Triton, Mosaic GPU; `kernels.platforms` says which runs where), chosen and tiled by each op's
options dataclass (`kernels.options`). kernels/README.md: which module holds what.

This package imports only jax (and numpy), so its tests and benchmarks run on any machine with jax installed.
"""

from kernels.linear_attention import linear_attention, linear_attention_init_state, linear_attention_step
from kernels.linear_attention_mgpu import MgpuChunkSizes
from kernels.linear_attention_pallas import LinearBlockSizes
from kernels.linear_attention_tpu import TpuChunkSizes
from kernels.numerics import EPS_MODES
from kernels.options import IMPLS, LinearAttentionOptions, ReluAttentionOptions
from kernels.relu_attention import (
    relu_attention,
    relu_attention_and_row_stats,
    relu_attention_row_stats,
    visible_key_counts,
)
from kernels.relu_attention_mgpu import MgpuBlockSizes
from kernels.relu_attention_pallas import PallasBlockSizes
from kernels.relu_attention_tpu import TpuBlockSizes
from kernels.softmax_attention import SOFTMAX_IMPLS, SoftmaxAttentionOptions, softmax_attention
from kernels.softmax_attention_tpu import SplashBlockSizes

__all__ = [
    "EPS_MODES",
    "IMPLS",
    "SOFTMAX_IMPLS",
    "LinearAttentionOptions",
    "LinearBlockSizes",
    "MgpuBlockSizes",
    "MgpuChunkSizes",
    "PallasBlockSizes",
    "ReluAttentionOptions",
    "SoftmaxAttentionOptions",
    "SplashBlockSizes",
    "TpuBlockSizes",
    "TpuChunkSizes",
    "linear_attention",
    "linear_attention_init_state",
    "linear_attention_step",
    "relu_attention",
    "relu_attention_and_row_stats",
    "relu_attention_row_stats",
    "softmax_attention",
    "visible_key_counts",
]
