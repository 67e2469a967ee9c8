"""Models assembled from zoo layers and mixers."""

from zoo.models.blocks import Block
from zoo.models.builder import ModelBuilder, model_class
from zoo.models.classifiers import DualEncoder, SequenceClassifier, SequenceEncoder
from zoo.models.config import mixer_config, model_config, stored_model_config
from zoo.models.encoder import Decoder, Encoder
from zoo.models.masked_lm import MaskedLM, TextClassifier, TextEncoder
from zoo.models.seq2seq import CausalLM, EncoderDecoder

__all__ = [
    "Block",
    "CausalLM",
    "Decoder",
    "DualEncoder",
    "Encoder",
    "EncoderDecoder",
    "MaskedLM",
    "ModelBuilder",
    "SequenceClassifier",
    "SequenceEncoder",
    "TextClassifier",
    "TextEncoder",
    "mixer_config",
    "model_class",
    "model_config",
    "stored_model_config",
]
