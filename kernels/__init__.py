"""Attention ops shared by the model zoo (ReLU, linear, and the softmax baseline): reference, blocked/chunked XLA
and Pallas implementations (Mosaic TPU, Triton, Mosaic GPU; `kernels.platforms` says which runs where), chosen and
tiled by each op's options dataclass (`kernels.options`). kernels/README.md: which module holds what.

This package imports only jax (and numpy), so its tests and benchmarks run on any machine with jax installed.
"""

from kernels.linear_attention.api import linear_attention, linear_attention_init_state, linear_attention_step
from kernels.linear_attention.mosaic_gpu import MgpuChunkSizes
from kernels.linear_attention.mosaic_tpu import TpuChunkSizes
from kernels.linear_attention.triton import LinearBlockSizes
from kernels.numerics import EPS_MODES
from kernels.options import IMPLS, LinearAttentionOptions, ReluAttentionOptions
from kernels.relu_attention.api import relu_attention, relu_attention_and_row_stats, relu_attention_row_stats
from kernels.relu_attention.mosaic_gpu import MgpuBlockSizes
from kernels.relu_attention.mosaic_tpu import TpuBlockSizes
from kernels.relu_attention.reference import visible_key_counts
from kernels.relu_attention.triton import PallasBlockSizes
from kernels.softmax_attention.api import SOFTMAX_IMPLS, SoftmaxAttentionOptions, softmax_attention
from kernels.softmax_attention.mosaic_tpu import SplashBlockSizes

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
