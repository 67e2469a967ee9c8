"""ListOps generator, tokenizer and TSV pipeline."""

import hashlib
import json
import statistics
import subprocess
import sys

import numpy as np
import pytest

from lra_flax import input_pipeline
from lra_flax.configs import listops as listops_config
from lra_flax.tasks import listops
from zoo.training import data as data_lib


def _independent_value(source: str) -> int:
    """Stack evaluation straight from the text, sharing nothing with the generator's evaluator."""
    stack: list[list] = []
    result = None
    for tok in source.replace("(", " ").replace(")", " ").split():
        if tok.startswith("["):
            stack.append([tok])
        elif tok == "]":
            op, *args = stack.pop()
            value = {
                "[MIN": min,
                "[MAX": max,
                "[MED": lambda a: int(statistics.median(a)),
                "[SM": lambda a: sum(a) % 10,
            }[op](args)
            if stack:
                stack[-1].append(value)
            else:
                result = value
        else:
            stack[-1].append(int(tok)) if stack else None
            result = int(tok) if not stack else result
    return result


@pytest.mark.parametrize("bounds", [dict(min_length=20, max_length=128, max_depth=6, max_args=6), dict()])
def test_labels_match_independent_evaluation_and_lengths_respect_bounds(bounds):
    rows = listops.generate(300 if bounds else 40, seed=1, **bounds)
    lo, hi = bounds.get("min_length", 500), bounds.get("max_length", 2000)
    assert len({s for s, _ in rows}) == len(rows)  # distinct
    for source, label in rows:
        assert label == _independent_value(source)
        assert lo < len(listops.tokenize(source)) < hi
    assert len({label for _, label in rows}) == 10  # every class occurs


def test_median_truncates_and_sum_is_mod_10():
    assert listops.apply_operator("[MED", [1, 2]) == 1  # median 1.5 → 1
    assert listops.apply_operator("[MED", [3, 8, 9, 4]) == 6  # 6.0
    assert listops.apply_operator("[SM", [9, 8, 7]) == 4


def test_same_seed_gives_byte_identical_files(tmp_path):
    kw = dict(num_train=50, num_valid=10, num_test=10, min_length=10, max_length=60, max_depth=5, max_args=5)
    a = listops.write_dataset(tmp_path / "a", seed=7, **kw)
    b = listops.write_dataset(tmp_path / "b", seed=7, **kw)
    c = listops.write_dataset(tmp_path / "c", seed=8, **kw)
    for split in ("train", "valid", "test"):
        assert a[split].read_bytes() == b[split].read_bytes()
    assert a["train"].read_bytes() != c["train"].read_bytes()
    lines = a["train"].read_text().splitlines()
    assert lines[0] == "Source\tTarget" and len(lines) == 51
    assert (tmp_path / "a" / "basic_val.tsv").exists()
    # Splits are disjoint, as in LRA (all examples are generated at once, then split).
    sources = [set(p.read_text().splitlines()[1:]) for p in a.values()]
    assert not (sources[0] & sources[1]) and not (sources[0] & sources[2])


@pytest.mark.slow  # starts a command
def test_generator_in_fresh_process_matches(tmp_path):
    code = (
        "from lra_flax.tasks import listops; import hashlib;"
        "print(listops.VOCAB);"
        "rows = listops.generate(30, seed=3, min_length=10, max_length=80, max_depth=5, max_args=5);"
        "print(hashlib.sha256(repr(rows).encode()).hexdigest())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == str(listops.VOCAB)
    rows = listops.generate(30, seed=3, min_length=10, max_length=80, max_depth=5, max_args=5)
    assert out[1] == hashlib.sha256(repr(rows).encode()).hexdigest()


def test_vocabulary_is_fixed_and_sorted():
    assert listops.VOCAB[0] == "<pad>"
    assert list(listops.VOCAB[1:]) == sorted(listops.VOCAB[1:])
    assert listops.encode("( ( [MAX 2 ) 9 ) ]") == [listops.TOKEN_IDS[t] for t in ("[MAX", "2", "9", "]")]


def _write(path, text):
    path.write_bytes(text.encode("utf-8", "surrogateescape"))  # "\udcff" writes the byte 0xff, not UTF-8
    return path


def _cache(path, max_length=20, truncate=False):
    return input_pipeline.cache_classification_split(
        path, encode=listops.encode, vocab=listops.VOCAB, num_classes=10, max_length=max_length, truncate=truncate
    )


def test_cached_split_round_trips(tmp_path):
    tsv = _write(tmp_path / "basic_train.tsv", "Source\tTarget\n( ( [MAX 2 ) 9 ) ]\t9\n( ( [MIN 2 ) 9 ) ]\t2\n")
    ds = data_lib.read_records(_cache(tsv))
    assert len(ds) == 2
    # Stored unpadded (uint16); the task pads every example to model.max_length when it reads it.
    np.testing.assert_array_equal(ds[0]["inputs"], listops.encode("[MAX 2 9 ]"))
    assert ds[0]["inputs"].dtype == np.uint16
    assert int(ds[1]["targets"]) == 2
    config = listops_config.get_config("demo")
    config.model.max_length, config.train.eval_batch_size = 20, 4
    task = input_pipeline.classification_task(
        config, lambda: {"test": _cache(tsv)}, vocab_size=len(listops.VOCAB), num_classes=10, model_cls=None
    )
    batch = next(iter(task.eval_batches("test")))
    assert batch["inputs"].shape == (4, 20) and batch["inputs"].dtype == np.int32
    np.testing.assert_array_equal(batch["inputs"][1, :5], [*listops.encode("[MIN 2 9 ]"), 0])
    np.testing.assert_array_equal(batch["weights"], [1, 1, 0, 0])


@pytest.mark.parametrize(
    "body, message",
    [
        ("( ( [MAX 2 ) 9 ) ]\t9\nonly-one-field\n", r"basic_train.tsv:3: expected 2 tab-separated fields"),
        ("( ( [MAX 2 ) 9 ) ]\t12\n", r"basic_train.tsv:2: label '12' is not a class id"),
        ("( ( [MAXX 2 ) 9 ) ]\t9\n", r"basic_train.tsv:2: unknown ListOps token '\[MAXX'"),
        ("[MAX 2 9 ]\t9\n\t3\n", r"basic_train.tsv:3: the Source field holds no token"),
        ("[MAX 2 9 ]\t9\n\udcff\t3\n", r"basic_train.tsv:3: not valid UTF-8 \(byte 1 of the line"),
    ],
)
def test_malformed_tsv_names_file_and_line(tmp_path, body, message):
    tsv = _write(tmp_path / "basic_train.tsv", "Source\tTarget\n" + body)
    with pytest.raises(input_pipeline.DataFormatError, match=message):
        _cache(tsv)
    assert not list((tmp_path / "cache").glob("*.array_record"))  # nothing half-written is left as a cache


def test_bad_header(tmp_path):
    tsv = _write(tmp_path / "basic_train.tsv", "Input\tLabel\n1\t1\n")
    with pytest.raises(input_pipeline.DataFormatError, match=r"basic_train.tsv:1: expected header 'Source\\tTarget'"):
        _cache(tsv)


def test_input_longer_than_max_length_errors_unless_truncating(tmp_path):
    tsv = _write(tmp_path / "basic_train.tsv", "Source\tTarget\n( ( ( [SM 1 ) 2 ) 3 ) ]\t6\n")
    with pytest.raises(input_pipeline.DataFormatError, match=r":2: input has 5 tokens, more than model.max_length=4"):
        _cache(tsv, max_length=4)
    ds = data_lib.read_records(_cache(tsv, max_length=4, truncate=True))
    np.testing.assert_array_equal(ds[0]["inputs"], listops.encode("[SM 1 2 3"))


@pytest.mark.slow  # starts a command
def test_empty_split_is_refused_before_writing(tmp_path):
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "lra_flax.data_cli", "listops", f"--output_dir={tmp_path / 'out'}", "--num_train=-5"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2 and "ListOps split sizes must be at least 1: num_train=-5" in run.stderr
    assert not (tmp_path / "out").exists()


def test_cache_dir_keeps_a_read_only_data_dir_untouched(tmp_path):
    config = listops_config.get_config("demo")
    config.unlock()
    config.data.dir, config.data.cache_dir = str(tmp_path / "release"), str(tmp_path / "caches")
    config.data.generator.update(num_train=20, num_valid=4, num_test=4)
    listops.write_dataset(config.data.dir, **config.data.generator.to_dict())
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / "release").iterdir()}
    caches = listops.prepare(config)
    assert all(path.parent == tmp_path / "caches" / "cache" for path in caches.values())
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / "release").iterdir()}
    assert after == before  # the release folder gained nothing and changed nothing


def test_generated_data_is_reused_only_with_the_settings_it_was_generated_with(tmp_path, capsys):
    config = listops_config.get_config("demo")
    data = config.data
    data.dir = str(tmp_path / "data")
    data.generator.update(num_train=20, num_valid=5, num_test=5, min_length=10, max_length=50)
    listops.ensure_data(data)
    written = (tmp_path / "data" / "basic_train.tsv").read_bytes()
    assert json.loads((tmp_path / "data" / "generator.json").read_text())["num_train"] == 20
    listops.ensure_data(data)  # the same settings: the files are used as they are
    assert (tmp_path / "data" / "basic_train.tsv").read_bytes() == written
    (tmp_path / "data" / "basic_train.tsv").write_bytes(written[: len(written) // 2])  # cut short after generation
    with pytest.raises(ValueError, match=rf"basic_train.tsv has {len(written) // 2:,} bytes but had {len(written):,} "
                       r"when generated \(generator.json\): it was changed or cut short since"):  # fmt: skip
        listops.ensure_data(data)  # it would train on what is left while the record says the full size
    (tmp_path / "data" / "basic_train.tsv").write_bytes(written)
    data.generator.update(num_train=40, seed=7)
    with pytest.raises(ValueError, match=r"other data.generator settings \(num_train: 20 there, 40 asked, seed: 0"):
        listops.ensure_data(data)  # the run would train on data its config.json does not describe
    (tmp_path / "data" / "generator.json").unlink()  # files from elsewhere (a release's): used, and said so
    capsys.readouterr()
    listops.ensure_data(data)
    assert "not written by the generator, used as they are" in capsys.readouterr().out


@pytest.mark.slow
def test_a_data_folder_emptied_mid_run_is_still_evaluated(tmp_path, monkeypatch):
    import shutil

    from zoo.training import periodic, train_and_evaluate

    config = listops_config.get_config("demo")
    config.data.dir = str(tmp_path / "data")
    config.data.generator.update(num_train=64, num_valid=16, num_test=16, max_length=48)
    config.model.update(num_layers=1, d_model=32, num_heads=2, mlp_dim=32, max_length=48)
    config.train.update(steps=4, batch_size=8, log_every=2, eval_every=2, checkpoint_every=4, eval_batch_size=16)

    def empty_the_data_folder(event):
        if event.step == 1:
            shutil.rmtree(tmp_path / "data")  # the TSVs and the cached splits beside them

    monkeypatch.setattr(periodic, "EVENT_HOOKS", [empty_the_data_folder])
    results = train_and_evaluate(config, tmp_path / "run", listops.make_task(config))
    assert not (tmp_path / "data").exists() and 0 <= results["test_accuracy"] <= 1
