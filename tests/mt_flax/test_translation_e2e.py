"""`mt-train` end to end on a synthetic copy task: SentencePiece, token batches, training, beam search, BLEU."""

import json
import random
import subprocess
import sys

import pytest
import sacrebleu

from tests.xla_flags import optimised_env
from zoo.text import load_tokenizer

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


def _copy_task(d, counts=(("train", 3000), ("valid", 60), ("test", 100))):
    """Target = source upper-cased: a learnable 'translation' with a real (SentencePiece) vocabulary."""
    d.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    for split, n in counts:
        src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n)]
        (d / f"{split}.src").write_text("".join(s + "\n" for s in src))
        (d / f"{split}.tgt").write_text("".join(s.upper() + "\n" for s in src))


def _run(module, *args, env=None):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=900, env=env)


@pytest.mark.slow
def test_copy_task_reaches_high_bleu_and_reports_sacrebleu(tmp_path):
    data = tmp_path / "copy"
    _copy_task(data)
    long = " ".join(WORDS * 5)  # longer than model.max_length: left out of the scores, and said so
    for name, text in (("test.src", long), ("test.tgt", long.upper())):
        with open(data / name, "a") as f:
            f.write(text + "\n")
    workdir = tmp_path / "run"
    flags = [
        "--config=mt_flax/configs/translation.py:tiny",
        f"--workdir={workdir}",
        "--config.data.source=text",
        f"--config.data.dir={data}",
        "--config.data.src_lang=src",
        "--config.data.tgt_lang=tgt",
        "--config.data.vocab_size=128",
        "--config.train.eval_every=150",
    ]
    proc = _run("mt_flax", *flags, env=optimised_env())  # its training steps, not compilation, take the time
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((workdir / "results.json").read_text())
    assert results["bleu"] > 90, results
    assert results["chrf"] > 90
    assert results["sacrebleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert (results["examples_scored"], results["pairs_dropped"]) == (100, 1)
    assert "test: BLEU and chrF of 100 of 101 sentence pairs; 1 longer than model.max_length" in proc.stdout
    assert (workdir / "spm.model").exists()
    # The test loss is a mean over target tokens, and their number is reported as such (EOS included).
    spm = load_tokenizer(workdir / "spm.model")
    kept = (data / "test.tgt").read_text().splitlines()[:100]
    assert results["test_tokens"] == sum(len(spm.encode(t)) + 1 for t in kept) and "test_examples" not in results
    # The reported BLEU is sacreBLEU's corpus_bleu of the written files.
    hyps = (workdir / "test.hyp.txt").read_text().splitlines()
    refs = (workdir / "test.ref.txt").read_text().splitlines()
    assert len(hyps) == len(refs) == 100
    assert refs == (data / "test.tgt").read_text().splitlines()[:100]
    assert results["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)
    assert results["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score, abs=1e-9)
    # Valid BLEU was measured during training too.
    lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert any(x["split"] == "valid" and x["step"] == 150 and "bleu" in x for x in lines)
    # mt-translate with the checkpoint reproduces the test hypotheses.
    out, scored = tmp_path / "out.txt", tmp_path / "scored.src"
    scored.write_text("".join(line + "\n" for line in (data / "test.src").read_text().splitlines()[:100]))
    proc = _run("mt_flax.translate", f"--workdir={workdir}", f"--input={scored}", f"--output={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.read_text().splitlines() == hyps


@pytest.mark.slow
def test_document_level_run_and_bad_input(tmp_path):
    data = tmp_path / "copy"
    _copy_task(data, (("train", 200), ("valid", 20), ("test", 20)))
    # Documents: blank lines every 5 pairs (both sides).
    for split in ("train", "valid", "test"):
        for side in ("src", "tgt"):
            path = data / f"{split}.{side}"
            lines = path.read_text().splitlines()
            path.write_text("".join(x + "\n" + ("\n" if i % 5 == 4 else "") for i, x in enumerate(lines)))
    base = [
        "--config=mt_flax/configs/translation.py:tiny",
        "--config.data.source=text",
        f"--config.data.dir={data}",
        "--config.data.src_lang=src",
        "--config.data.tgt_lang=tgt",
        "--config.data.vocab_size=128",
        # What is checked here is the data and the commands, not the model: one small layer compiles quickly.
        "--config.model.num_layers=1",
        "--config.model.d_model=32",
        "--config.model.mlp_dim=32",
        "--config.model.num_heads=2",
        "--config.train.steps=4",
        "--config.train.checkpoint_every=4",
        "--config.decode.beam_size=2",
    ]
    proc = _run("mt_flax", *base, f"--workdir={tmp_path / 'doc'}", "--config.data.doc_length=48")
    assert proc.returncode == 0, proc.stderr[-3000:]
    refs = (tmp_path / "doc" / "test.ref.txt").read_text().splitlines()
    assert 4 <= len(refs) < 20  # sentences were joined into documents (20 pairs, 4 documents of 5)
    # mt-translate keeps the blank document-separator lines blank and translates every other line.
    out = tmp_path / "translations" / "doc.out"  # a folder that does not exist yet is made
    translate = ["mt_flax.translate", f"--workdir={tmp_path / 'doc'}", f"--input={data / 'test.src'}"]
    proc = _run(*translate, f"--output={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    source, translated = (data / "test.src").read_text().splitlines(), out.read_text().splitlines()
    assert len(translated) == len(source) == 24
    assert (
        [i for i, x in enumerate(translated) if not x] == [i for i, x in enumerate(source) if not x] == [5, 11, 17, 23]
    )
    # Bad options and inputs: one line, exit 2, before any decoding; the output file is not touched.
    for extra, message in (
        (["--beam_size=0", f"--output={out}"], "--beam_size=0 must be at least 1"),
        ([f"--output={tmp_path}"], f"--output={tmp_path} is a directory"),
        ([f"--output={data / 'test.src'}"], "is the --input file"),
        ([f"--output={out}"], f"--output={out} exists; pass --overwrite to replace it"),
    ):
        proc = _run(*translate, *extra)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert out.read_text().splitlines() == translated  # refused, not replaced
    out.write_text("stale\n")
    proc = _run(*translate, f"--output={out}", "--overwrite")
    assert proc.returncode == 0 and out.read_text().splitlines() == translated, proc.stderr[-3000:]
    assert (data / "test.src").read_text().splitlines() == source  # the input survived being named as output
    (tmp_path / "latin1.src").write_bytes("alpha\nfa\xe7ade bravo\n".encode("latin-1"))
    proc = _run("mt_flax.translate", f"--workdir={tmp_path / 'doc'}", f"--input={tmp_path / 'latin1.src'}")
    assert proc.returncode == 2 and f"{tmp_path / 'latin1.src'}:2: not valid UTF-8" in proc.stderr, proc.stderr
    # A split missing, and misaligned files: clear errors, exit 2, nothing written to the workdir.
    good_valid = (data / "valid.tgt").read_text()
    (data / "valid.tgt").write_text("only one line\n")
    proc = _run("mt_flax", *base, f"--workdir={tmp_path / 'bad'}", "--config.data.cache_dir=" + str(tmp_path / "c2"))
    assert proc.returncode == 2
    assert "valid.src has 24 lines but" in proc.stderr and "valid.tgt has 1" in proc.stderr
    assert not (tmp_path / "bad").exists()
    (data / "valid.tgt").write_text(good_valid)
    (data / "test.src").unlink()
    proc = _run("mt_flax", *base, f"--workdir={tmp_path / 'bad'}", "--config.data.cache_dir=" + str(tmp_path / "c3"))
    assert proc.returncode == 2 and "split 'test' is missing" in proc.stderr


@pytest.mark.slow
def test_a_data_folder_emptied_mid_run_is_still_evaluated(tmp_path, monkeypatch):
    import shutil

    from mt_flax.configs.translation import get_config
    from mt_flax.task import make_task
    from zoo.training import periodic, train_and_evaluate

    _copy_task(tmp_path / "copy", counts=(("train", 200), ("valid", 8), ("test", 8)))
    config = get_config("tiny")
    config.data.update(source="text", dir=str(tmp_path / "copy"), src_lang="src", tgt_lang="tgt", vocab_size=64)
    config.train.update(steps=4, log_every=2, eval_every=2, checkpoint_every=4)

    def empty_the_data_folder(event):
        if event.step == 1:
            shutil.rmtree(tmp_path / "copy")  # the corpus and its cached splits, lengths and references

    monkeypatch.setattr(periodic, "EVENT_HOOKS", [empty_the_data_folder])
    results = train_and_evaluate(config, tmp_path / "run", make_task(config))
    assert not (tmp_path / "copy").exists() and 0 <= results["bleu"] <= 100 and results["examples_scored"] == 8
