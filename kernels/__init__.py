"""Attention ops shared by the model zoo: reference, blocked/chunked XLA and Pallas implementations
(Mosaic TPU, Triton, Mosaic GPU; `kernels.platforms` says which runs where).

This package imports only jax, so its tests and benchmarks run on any machine with jax installed.
"""

from kernels.linear_attention import linear_attention, linear_attention_init_state, linear_attention_step
from kernels.numerics import EPS_MODES
from kernels.relu_attention import (
    relu_attention,
    relu_attention_and_row_stats,
    relu_attention_row_stats,
    visible_key_counts,
)

__all__ = [
    "EPS_MODES",
    "linear_attention",
    "linear_attention_init_state",
    "linear_attention_step",
    "relu_attention",
    "relu_attention_and_row_stats",
    "relu_attention_row_stats",
    "visible_key_counts",
]
