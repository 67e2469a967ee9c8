"""MLM and fine-tuning data: text readers, wiki markup, the wheel-shipped corpora, packing, GLUE files."""

import bz2
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from mlm_flax import data, glue, input_pipeline
from mlm_flax.configs import pretrain
from mlm_flax.input_pipeline import SpecialIds, pack
from zoo.training.data import DataFormatError


def test_documents_blank_line_and_line_modes(tmp_path):
    f = tmp_path / "train.txt"
    f.write_text("first doc line one\nline  two\n\n\nsecond doc\n\n")
    assert data.read_documents(f) == ["first doc line one\nline two", "second doc"]
    assert data.read_documents(f, "lines") == ["first doc line one", "line two", "second doc"]


def test_bad_text_files_are_named(tmp_path):
    empty = tmp_path / "train.txt"
    empty.write_text("\n  \n\n")
    with pytest.raises(DataFormatError, match=r"train.txt: empty corpus"):
        data.read_documents(empty)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nalso fine\n\xff broken\n")
    with pytest.raises(DataFormatError, match=r"bad.txt:3: not valid UTF-8"):
        data.read_documents(bad)
    with pytest.raises(FileNotFoundError, match="train.txt does not exist"):
        data.text_splits(tmp_path / "nowhere", "blank_lines", 0.1)


def test_holdout_is_whole_documents_seeded_and_disjoint():
    docs = [f"doc {i}" for i in range(100)]
    a, b = data.holdout_split(docs, 0.05), data.holdout_split(docs, 0.05)
    assert a == b
    assert len(a["valid"]) == len(a["test"]) == 5 and len(a["train"]) == 90
    assert sorted(a["train"] + a["valid"] + a["test"]) == sorted(docs)
    with pytest.raises(ValueError, match="holdout_fraction"):
        data.holdout_split(docs, 0.6)


WIKI = """The '''cat''' is a [[domestic animal|domesticated]] species of small [[carnivore]].<ref>Some source</ref>
{{Infobox animal|name={{nested|x}}|legs=4}}
[[File:Cat.jpg|thumb|A [[cat]] sitting]]
It was described by [[Carl Linnaeus]] in 1758.<ref name="x"/> See [http://example.com the site] for more.
{| class="wikitable"
| cell || cell
|}
== Behaviour ==
* Cats sleep for long hours during the day, often twelve or more.
<!-- a hidden comment that is long enough to count -->
== References ==
{{reflist}}
A line after the references section that must be dropped entirely.
[[Category:Cats]]"""


def test_wiki_markup_is_stripped():
    text = data.strip_wiki_markup(WIKI)
    assert text.split("\n") == [
        "The cat is a domesticated species of small carnivore.",
        "It was described by Carl Linnaeus in 1758. See the site for more.",
        "Cats sleep for long hours during the day, often twelve or more.",
    ]


REDIRECT = '<redirect title="x"/>'


def _wiki_xml(pages):
    body = "".join(
        f"<page><title>{t}</title><ns>{ns}</ns>{REDIRECT if redirect else ''}"
        f'<revision><text xml:space="preserve">{text}</text></revision></page>'
        for t, ns, redirect, text in pages
    )
    return f'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">{body}</mediawiki>'.encode()


def test_wiki_xml_keeps_articles_only(tmp_path):
    xml = _wiki_xml(
        [
            ("Cat", 0, False, "The '''cat''' is a small carnivorous mammal kept as a pet."),
            ("Kitty", 0, True, "#REDIRECT [[Cat]]"),
            ("Talk:Cat", 1, False, "A discussion page that is not an article at all."),
            ("Dog", 0, False, "The dog is a [[domestic animal|domesticated]] descendant of the wolf."),
        ]
    )
    path = tmp_path / "dump.xml.bz2"
    path.write_bytes(bz2.compress(xml))
    assert data.wiki_documents(path) == [
        "Cat\nThe cat is a small carnivorous mammal kept as a pet.",
        "Dog\nThe dog is a domesticated descendant of the wolf.",
    ]
    broken = tmp_path / "broken.xml"
    broken.write_bytes(b"<mediawiki><page>\n<title>x</title>\n</mediawiki>")
    with pytest.raises(DataFormatError, match=r"broken.xml:3: not well-formed XML"):
        data.wiki_documents(broken)


def _fake_gensim_wheel(cache, pages):
    """A local wheel with the members the offline corpora read, so no download is needed."""
    cache.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(cache / "gensim-4.4.0-py3-none-any.whl", "w") as zf:
        zf.writestr(data.WIKI_WHEEL.member, bz2.compress(_wiki_xml(pages)))
        lines = [f"__label__{'pos' if i % 2 else 'neg'} sentence number {i} of the sample" for i in range(200)]
        zf.writestr(glue.POLARITY_WHEEL.member, "\n".join(lines).encode("latin-1"))


@pytest.mark.slow  # starts a command
def test_mlm_data_writes_the_wiki_sample_from_a_local_wheel(tmp_path):
    pages = [
        (f"Page {i}", 0, False, f"Article {i} is about [[topic {i}|subject]] number {i} in detail.") for i in range(40)
    ]
    _fake_gensim_wheel(tmp_path / "wheels", pages)
    out = tmp_path / "wiki"
    cmd = [sys.executable, "-m", "mlm_flax.data_cli", "wiki-sample", f"--output_dir={out}"]
    proc = subprocess.run([*cmd, f"--wheel_cache={tmp_path / 'wheels'}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    splits = {s: data.read_documents(out / f"{s}.txt") for s in data.SPLITS}
    assert [len(splits[s]) for s in data.SPLITS] == [36, 2, 2]
    assert "Page 0\nArticle 0 is about subject number 0 in detail." in [d for docs in splits.values() for d in docs]
    written = {s: (out / f"{s}.txt").read_bytes() for s in data.SPLITS}
    again = subprocess.run(
        [*cmd, "--holdout_fraction=0.2", f"--wheel_cache={tmp_path / 'wheels'}"], capture_output=True, text=True
    )
    assert again.returncode == 2 and "already holds" in again.stderr and "--overwrite" in again.stderr, again.stderr
    assert {s: (out / f"{s}.txt").read_bytes() for s in data.SPLITS} == written  # nothing replaced
    proc = subprocess.run([*cmd[:3], "shakespeare", f"--output_dir={out}"], capture_output=True, text=True)
    assert proc.returncode != 0 and "usage: mlm-data" in proc.stderr


def test_polarity_sample_from_a_local_wheel(tmp_path):
    _fake_gensim_wheel(tmp_path, [])
    splits = glue.load_splits(
        "polarity", "polarity_sample", "", wheel_cache=str(tmp_path), tfds_data_dir="", valid_size=0
    )
    assert [len(splits[s]) for s in ("train", "valid", "test")] == [140, 30, 30]
    for (text,), label in [d for docs in splits.values() for d in docs]:
        assert label == int(text.split()[2]) % 2  # __label__pos ↔ 1


def test_packing_keeps_every_token_in_order():
    ids = SpecialIds(mask=4, cls=5, sep=6)
    docs = [list(range(10, 10 + n)) for n in (5, 17, 1, 30)]
    seqs = list(pack(iter(docs), 8, ids))
    assert all(s.shape == (8,) and s[0] == ids.cls for s in seqs)
    stream = np.concatenate([s[1:] for s in seqs])
    stream = stream[stream != 0]
    expected = [t for d in docs for t in [*d, ids.sep]]
    np.testing.assert_array_equal(stream, expected)
    assert (seqs[-1][1 + len(expected) % 7 :] == 0).all()  # only the last sequence is padded


def _mnli_tsv(path, rows):
    header = "index\tpromptID\tsentence1\tsentence2\tgold_label"
    path.write_text(header + "\n" + "".join(f"{i}\t0\t{a}\t{b}\t{label}\n" for i, (a, b, label) in enumerate(rows)))


def test_glue_tsv_reader_and_errors(tmp_path):
    f = tmp_path / "dev_matched.tsv"
    _mnli_tsv(f, [("A man sleeps.", "A person rests.", "entailment"), ("It rains.", "It is dry.", "contradiction")])
    assert glue.read_tsv(f, glue.TASKS["mnli"]) == [
        (("A man sleeps.", "A person rests."), 0),
        (("It rains.", "It is dry."), 2),
    ]
    _mnli_tsv(f, [("A.", "B.", "entailment"), ("C.", "D.", "maybe")])
    with pytest.raises(DataFormatError, match=r"dev_matched.tsv:3: label 'maybe'"):
        glue.read_tsv(f, glue.TASKS["mnli"])
    with pytest.raises(DataFormatError, match=r"dev_matched.tsv:1: header has no column\(s\) \['sentence'"):
        glue.read_tsv(f, glue.TASKS["sst2"])
    with pytest.raises(FileNotFoundError, match="train.tsv does not exist"):
        glue.read_tsv(tmp_path / "train.tsv", glue.TASKS["mnli"])
    sst = tmp_path / "dev.tsv"
    sst.write_bytes("sentence\tlabel\nfine\t1\nfa\xe7ade\t0\n".encode("latin-1"))
    with pytest.raises(DataFormatError, match=r"dev.tsv:3: not valid UTF-8"):
        glue.read_tsv(sst, glue.TASKS["sst2"])


class _CharTokenizer:
    def encode(self, text):
        return [ord(c) for c in text]


def test_pair_encoding_truncates_the_longer_text_first():
    out = glue.encode(("abcdefghij", "xyz"), _CharTokenizer(), cls_id=5, sep_id=6, max_length=12)
    assert out.tolist() == [5, *map(ord, "abcdef"), 6, *map(ord, "xyz"), 6]
    out = glue.encode(("ab",), _CharTokenizer(), cls_id=5, sep_id=6, max_length=6)
    assert out.tolist() == [5, ord("a"), ord("b"), 6, 0, 0]


def test_text_files_in_data_dir_with_another_source_are_refused_not_ignored(tmp_path):
    config = pretrain.get_config("gmlp_tiny")
    config.data.update(dir=str(tmp_path), wheel_cache=str(tmp_path / "no-wheels"))
    (tmp_path / "train.txt").write_text("ein Dokument\n")
    for source in ("wiki_sample", "kjv", "tfds"):
        config.data.source = source
        with pytest.raises(ValueError, match=rf"data.dir={tmp_path} holds train.txt, but data.source='{source}'"):
            input_pipeline.load_documents(config, "train")
    assert not (tmp_path / "no-wheels").exists()  # refused before fetching the corpus


def test_unigram_perplexity_is_add_one_unigram_perplexity_worked_out_by_hand():
    # Vocabulary of 5; ids 1 and 4 are not scored. Train counts of the scored ids 0, 2, 3: 3, 0, 1 → add-one
    # probabilities 4/7, 1/7, 2/7. Held out: id 0 twice, id 3 once (and unscored tokens, ignored).
    train, held_out = np.array([3, 9, 0, 1, 9]), np.array([2, 5, 0, 1, 5])
    expected = np.exp(-(2 * np.log(4 / 7) + np.log(2 / 7)) / 3)
    got = input_pipeline.unigram_perplexity(train, held_out, np.array([0, 2, 3]))
    assert got == pytest.approx(expected, rel=1e-12)
