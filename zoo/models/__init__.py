"""Models assembled from zoo layers and mixers."""

from zoo.models.classifier import SequenceClassifier
from zoo.models.config import mixer_config, model_config
from zoo.models.encoder import Encoder, EncoderBlock

__all__ = ["Encoder", "EncoderBlock", "SequenceClassifier", "mixer_config", "model_config"]
