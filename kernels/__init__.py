"""Attention ops shared by the model zoo: reference, blocked XLA and (later) Pallas implementations.

This package imports only jax, so its tests and benchmarks run on any machine with jax installed.
"""

from kernels.relu_attention import (
    relu_attention,
    relu_attention_row_stats,
    visible_key_counts,
)

__all__ = ["relu_attention", "relu_attention_row_stats", "visible_key_counts"]
