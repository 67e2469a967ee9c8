"""Translation data: readers, the Bible corpus, documents, tokenised caches and token-based batches."""

import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from mt_flax import data, input_pipeline
from mt_flax.configs import translation
from zoo.text import BOS_ID, EOS_ID, PAD_ID
from zoo.training.data import DataFormatError


def _write(d, split, src, tgt, src_lang="de", tgt_lang="en"):
    (d / f"{split}.{src_lang}").write_text("".join(s + "\n" for s in src))
    (d / f"{split}.{tgt_lang}").write_text("".join(t + "\n" for t in tgt))


@pytest.mark.parametrize("seed", range(5))
def test_documents_respect_boundaries_and_length(seed):
    rng = np.random.default_rng(seed)
    n = 300
    lengths = rng.integers(1, 60, n).tolist()
    doc_ids = np.cumsum(rng.random(n) < 0.1).tolist()
    doc_length = 100
    docs, too_long = data.build_documents(lengths, doc_ids, doc_length)
    used = sorted([i for d in docs for i in d] + too_long)
    assert used == list(range(n))  # every sentence exactly once
    for d in docs:
        assert len({doc_ids[i] for i in d}) == 1  # never crosses a document boundary
        assert sum(lengths[i] for i in d) <= doc_length
        assert d == list(range(d[0], d[-1] + 1))  # consecutive sentences, in order
    for i in too_long:
        assert lengths[i] > doc_length


def test_documents_are_maximal():
    # Greedy filling: a document is closed only when the next sentence of the same doc does not fit.
    docs, _ = data.build_documents([3, 3, 3, 5, 2], [0, 0, 0, 0, 1], 7)
    assert docs == [[0, 1], [2], [3], [4]]


def test_read_parallel_documents_from_blank_lines(tmp_path):
    _write(tmp_path, "train", ["a", "b", "", "c"], ["A", "B", "", "C"])
    corpus = data.read_parallel(tmp_path, "train", "de", "en")
    assert corpus.source == ["a", "b", "c"] and corpus.target == ["A", "B", "C"]
    assert corpus.doc_ids[0] == corpus.doc_ids[1] != corpus.doc_ids[2]
    assert corpus.line_numbers == [1, 2, 4]


def test_read_parallel_docids_file(tmp_path):
    _write(tmp_path, "train", ["a", "b", "c"], ["A", "B", "C"])
    (tmp_path / "train.docids").write_text("x\ny\ny\n")
    corpus = data.read_parallel(tmp_path, "train", "de", "en")
    assert corpus.doc_ids[0] != corpus.doc_ids[1] == corpus.doc_ids[2]


def test_line_count_mismatch_names_both_files(tmp_path):
    _write(tmp_path, "train", ["a", "b", "c"], ["A", "B"])
    with pytest.raises(DataFormatError, match=r"train\.de has 3 lines but .*train\.en has 2"):
        data.read_parallel(tmp_path, "train", "de", "en")


def test_missing_split_and_empty_corpus(tmp_path):
    _write(tmp_path, "train", ["a"], ["A"])
    with pytest.raises(FileNotFoundError, match=r"split 'valid' is missing: no .*valid\.de"):
        data.read_parallel(tmp_path, "valid", "de", "en")
    _write(tmp_path, "test", [], [])
    with pytest.raises(DataFormatError, match="no sentence pairs"):
        data.read_parallel(tmp_path, "test", "de", "en")


def _fake_bible(path):
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE bible (id INTEGER, bbName TEXT, bNumber INT, cNumber INT, vNumber INT, vText TEXT)")
        rows = []
        for code, word in (("e", "wort"), ("k", "word")):
            for b in (1, 2, 3):
                for c in (1, 2):
                    for v in (1, 2, 3):
                        rows.append((len(rows), code, b, c, v, f"{word} {b} {c}  {v}"))
        rows.append((len(rows), "k", 3, 2, 4, "only english"))  # no German counterpart: skipped
        conn.executemany("INSERT INTO bible VALUES (?, ?, ?, ?, ?, ?)", rows)


def test_bible_corpus_split_by_books_with_chapter_documents(tmp_path):
    db = tmp_path / "bible.db"
    _fake_bible(db)
    corpus = data.bible_corpus(db, [1, 3])
    assert len(corpus) == 12
    assert corpus.source[0] == "wort 1 1 1" and corpus.target[0] == "word 1 1 1"  # whitespace normalised
    assert len(set(corpus.doc_ids)) == 4  # 2 books × 2 chapters
    data.write_parallel(corpus, tmp_path / "out", "train", "de", "en")
    again = data.read_parallel(tmp_path / "out", "train", "de", "en")
    assert again.source == corpus.source and again.target == corpus.target
    assert len(set(again.doc_ids)) == 4
    with pytest.raises(ValueError, match="no translation 'x'; present: e, k"):
        data.bible_corpus(db, [1], src_code="x")


def _config(tmp_path, **data_overrides):
    config = translation.get_config("tiny")
    config.unlock()
    config.data.update(source="text", dir=str(tmp_path), tokenizer="pretokenized", vocab_size=0, **data_overrides)
    return config


def test_too_long_pairs_filtered_and_counted_or_error(tmp_path, capsys):
    long = " ".join(["w"] * 70)
    _write(tmp_path, "train", ["a b", long, "c"], ["A B", "L", "C"])
    config = _config(tmp_path)
    tok, path = input_pipeline.load_or_train_tokenizer(config)
    records = input_pipeline.cache_split(config, "train", tok, path)
    assert "dropped 1 of 3 sentence pairs" in capsys.readouterr().out
    assert len(np.load(records.with_suffix(".lengths.npy"))) == 2
    assert input_pipeline.split_pairs(records) == {"pairs": 3, "dropped": 1}
    config.data.too_long = "error"
    with pytest.raises(
        DataFormatError, match=r"line 2 of .*train\.de.*71 tokens with EOS, more than model.max_length=64"
    ):
        input_pipeline.cache_split(config, "train", tok, path)


def test_the_data_is_checked_before_the_tokenizer_is_trained_or_a_split_cached(tmp_path):
    """A missing file of any split, or documents longer than the model, is said before minutes of work."""
    from mt_flax.task import make_task

    for split in ("train", "valid"):
        _write(tmp_path, split, ["a b"], ["A B"])
    (tmp_path / "test.de").write_text("a b\n")  # test.en is missing
    config = _config(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"split 'test' is missing: no .*test\.en"):
        make_task(config).prepare()
    config.data.doc_length = config.model.max_length + 1
    with pytest.raises(ValueError, match=rf"^data.doc_length={config.model.max_length + 1} exceeds model.max_length="):
        make_task(config).prepare()
    assert not (tmp_path / "cache").exists()


def test_references_have_bpe_undone_as_hypotheses_do(tmp_path):
    """fairseq removes BPE from hypotheses and references alike (--remove-bpe): a reference left with "@@ "
    could never match a word BPE split, so a perfect translation would not score 100."""
    from mt_flax import bleu

    _write(
        tmp_path, "train", ["das haus ist sehr groß", "das ist gut"], ["the hou@@ se is very big", "that is go@@ od"]
    )
    config = _config(tmp_path)
    tok, path = input_pipeline.load_or_train_tokenizer(config)
    records_path = input_pipeline.cache_split(config, "train", tok, path)
    from zoo.training.data import read_records

    refs = input_pipeline.references(records_path)
    assert refs == ["the house is very big", "that is good"]
    hyps = [tok.decode(r["tgt"]) for r in read_records(records_path)]  # the targets, decoded as a beam's output
    assert hyps == refs
    assert bleu.score(hyps, refs)["bleu_tokenized"] == pytest.approx(100.0)


def test_document_examples_and_references(tmp_path):
    _write(tmp_path, "train", ["a b", "c", "", "d e f"], ["A B", "C", "", "D E F"])
    config = _config(tmp_path, doc_length=6)
    tok, path = input_pipeline.load_or_train_tokenizer(config)
    records_path = input_pipeline.cache_split(config, "train", tok, path)
    from zoo.training.data import read_records

    records = read_records(records_path)
    assert input_pipeline.references(records_path) == ["A B C", "D E F"]
    assert tok.decode(records[0]["src"]) == "a b c" and records[0]["src"][-1] == EOS_ID
    assert len(records[1]["tgt"]) == 4


def test_batch_plan_covers_everything_within_token_budget():
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 200, 1000)
    plan = input_pipeline.batch_plan(lengths, max_length=256, max_tokens=2048, row_multiple=4, seed=None)
    seen = np.concatenate([idx[idx >= 0] for _, idx in plan])
    assert sorted(seen.tolist()) == list(range(1000))
    for length, idx in plan:
        assert len(idx) % 4 == 0
        assert len(idx) * length <= 2048 or len(idx) == 4
        assert np.all(lengths[idx[idx >= 0]] <= length)
    shuffled = input_pipeline.batch_plan(lengths, max_length=256, max_tokens=2048, row_multiple=4, seed=1, epoch=3)
    again = input_pipeline.batch_plan(lengths, max_length=256, max_tokens=2048, row_multiple=4, seed=1, epoch=3)
    other = input_pipeline.batch_plan(lengths, max_length=256, max_tokens=2048, row_multiple=4, seed=1, epoch=4)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(shuffled, again, strict=True))
    assert len(shuffled) == len(plan) and not all(
        np.array_equal(a[1], b[1]) for a, b in zip(shuffled, other, strict=True)
    )


def test_make_batch_shifts_targets_and_weights_padding():
    records = [{"src": np.array([5, 6, EOS_ID]), "tgt": np.array([7, EOS_ID])}]
    batch = input_pipeline.make_batch(records, 4, np.array([0, -1]))
    np.testing.assert_array_equal(batch["src"][0], [5, 6, EOS_ID, PAD_ID])
    np.testing.assert_array_equal(batch["tgt_in"][0], [BOS_ID, 7, PAD_ID, PAD_ID])
    np.testing.assert_array_equal(batch["tgt_out"][0], [7, EOS_ID, PAD_ID, PAD_ID])
    np.testing.assert_array_equal(batch["weights"], [1.0, 0.0])
    assert not batch["src"][1].any()


@pytest.mark.parametrize("source", ["text", "bible", "tfds"])
def test_one_language_on_both_sides_is_refused_before_reading_or_writing(tmp_path, source):
    config = _config(tmp_path)
    config.data.update(source=source, src_lang="en", tgt_lang="en")
    before = sorted(tmp_path.rglob("*"))
    for prepare, args in (
        (input_pipeline.load_or_train_tokenizer, (config,)),  # the task's two ways in: the tokenizer,
        (input_pipeline.cache_split, (config, "train", None, tmp_path / "spm.model")),  # and a split's cache
    ):
        with pytest.raises(ValueError, match=r"data.src_lang and data.tgt_lang are both 'en': a translation needs"):
            prepare(*args)
    assert sorted(tmp_path.rglob("*")) == before  # the Bible source wrote nothing


def test_unprepared_tfds_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="TFDS dataset 'wmt14_translate/de-en' is not prepared in "):
        data.tfds_corpus("wmt14_translate/de-en", "valid", "de", "en", data_dir=str(tmp_path))


@pytest.mark.slow  # starts a command
def test_mt_data_does_not_replace_parallel_text_already_there(tmp_path):
    _write(tmp_path, "train", ["ein eigener Satz"], ["a sentence of one's own"])
    command = [sys.executable, "-m", "mt_flax.data_cli", "bible", f"--output_dir={tmp_path}"]
    run = subprocess.run([*command, f"--wheel_cache={tmp_path / 'no-wheels'}"], capture_output=True, text=True)
    assert run.returncode == 2 and "already holds" in run.stderr and "train.de" in run.stderr, run.stderr
    assert "--overwrite" in run.stderr and "Traceback" not in run.stderr
    assert (tmp_path / "train.de").read_text() == "ein eigener Satz\n"
    assert not (tmp_path / "no-wheels").exists()  # refused before fetching anything


def test_a_tokenizer_model_that_is_no_vocabulary_is_named_with_its_field(tmp_path):
    text = tmp_path / "sentences.de"
    text.write_text("ein Satz\nnoch einer\n")
    config = translation.get_config("tiny")
    config.data.tokenizer_model = str(text)
    with pytest.raises(
        ValueError, match=rf"data.tokenizer_model: vocabulary file {text}: a word vocabulary must start"
    ):
        input_pipeline.load_or_train_tokenizer(config)


def test_the_bible_source_fills_an_empty_directory_whole_and_never_replaces_a_file(tmp_path, monkeypatch):
    db = tmp_path / "bible.db"
    _fake_bible(db)

    def write_bible(output_dir, books, cache_dir, src_lang, tgt_lang, fail_after=None):
        for i, (split, split_books) in enumerate(books.items()):
            if i == fail_after:
                raise OSError("cut short")
            data.write_parallel(data.bible_corpus(db, split_books), output_dir, split, src_lang, tgt_lang)

    config = translation.get_config("tiny")
    config.data.update(source="bible", dir=str(tmp_path / "bible"))
    config.data.bible_books.update(train=[1], valid=[3], test=[3])
    monkeypatch.setattr(data, "write_bible", lambda *a: write_bible(*a, fail_after=2))
    with pytest.raises(OSError, match="cut short"):
        input_pipeline.load_corpus(config, "train")
    assert [p.name for p in (tmp_path / "bible").iterdir()] == []  # nothing half-written is left to be refused
    monkeypatch.setattr(data, "write_bible", write_bible)
    assert len(input_pipeline.load_corpus(config, "train")) == 6
    assert sorted(p.name for p in (tmp_path / "bible").iterdir()) == [
        f"{s}.{lang}" for s in ("test", "train", "valid") for lang in ("de", "en")
    ]

    own = tmp_path / "own"  # a user's text files, but data.source left at 'bible'
    own.mkdir()
    _write(own, "train", ["ein eigener Satz"], ["a sentence of one's own"])
    config.data.dir = str(own)
    with pytest.raises(ValueError, match=r"holds train\.de, train\.en but not valid\.de, .*data\.source='text'"):
        input_pipeline.load_corpus(config, "train")
    assert sorted(p.name for p in own.iterdir()) == ["train.de", "train.en"]
    assert (own / "train.de").read_text() == "ein eigener Satz\n"
