"""Layers shared by every model: FFN variants, embeddings, heads, dropout, dtype helpers."""

from zoo.layers.common import AuxLoss, compute_dtype, dense, logical
from zoo.layers.dropout import Dropout
from zoo.layers.embeddings import (
    LearnedPositions,
    TokenEmbedding,
    add_positions,
    check_indices,
)
from zoo.layers.ffn import FFN_KINDS, FeedForward
from zoo.layers.heads import ClassificationHead

__all__ = [
    "FFN_KINDS",
    "AuxLoss",
    "ClassificationHead",
    "Dropout",
    "FeedForward",
    "LearnedPositions",
    "TokenEmbedding",
    "add_positions",
    "check_indices",
    "compute_dtype",
    "dense",
    "logical",
]
