"""Bad input, as a table: every case says what it feeds where and the outcome it must get.

Outcome classes:
  - `Error(type, pattern)`: raised with a message matching `pattern` (which names the field, flag or file);
    where a case has a workdir or an output folder, nothing was written there.
  - `Works(check)`: accepted, and `check(result)` holds (the input was legal, or is handled correctly).

Kinds: config fields (derived from their declarations: a new field joins the table by being declared), mixer
options, the translation decode section, paths and workdirs, data readers (text, retrieval, image, pathfinder,
wikipedia, wheels), kernels, and the command lines' exit statuses. A new reader, flag or field gets a row here,
not an ad-hoc test.
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import io
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from zoo.config_fields import Rule
from zoo.models import model_config
from zoo.training import mesh_config, train_config
from zoo.training.config import MESH_FIELDS, TRAIN_FIELDS
from zoo.training.validate import OPTION_RULES, config_problems

REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Error:
    type: type[BaseException] | tuple[type[BaseException], ...]
    pattern: str


@dataclasses.dataclass(frozen=True)
class Works:
    check: Callable[[Any], bool] = lambda result: True


@dataclasses.dataclass(frozen=True)
class Case:
    kind: str
    name: str
    run: Callable[[Path], Any]  # tmp_path → result (or raises)
    outcome: Error | Works
    untouched: str = ""  # a path under tmp_path that must not exist afterwards (nothing written)


def _expect(case: Case, tmp_path: Path) -> None:
    if isinstance(case.outcome, Error):
        with pytest.raises(case.outcome.type, match=case.outcome.pattern):
            case.run(tmp_path)
    else:
        result = case.run(tmp_path)
        assert case.outcome.check(result), result
    if case.untouched:
        assert not (tmp_path / case.untouched).exists(), f"{case.untouched} was written"


# ---------------------------------------------------------------------------------------------------------------
# Config fields, from their declarations
# ---------------------------------------------------------------------------------------------------------------


def _base_config() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(
        {"seed": 0, "train": train_config(), "mesh": mesh_config(), "model": model_config(mixer="relu")}
    )


def _bad_values(rule: Rule, default: Any) -> list[Any]:
    """Values the rule must refuse, chosen by the default's type and the rule's stated range."""
    values: list[Any] = []
    if isinstance(default, bool):
        return ["yes", 1, None]
    if isinstance(default, int | float):
        values += ["1", None, float("nan"), float("inf"), -1e30, 1e30]
        if isinstance(default, int):
            values += [True, 2.5]
        return [v for v in values if not rule.check(v)]
    if isinstance(default, str):
        return ["no-such-choice", 3, None]
    return []


def _field_cases() -> list[Case]:
    cases = []
    from zoo.models.config import MODEL_FIELDS

    for section, fields in (("train", TRAIN_FIELDS), ("model", MODEL_FIELDS), ("mesh", MESH_FIELDS)):
        for f in fields:
            if f.rule is None:
                continue
            for value in _bad_values(f.rule, f.default):

                def run(_tmp, section=section, f=f, value=value):
                    config = _base_config()
                    try:
                        config[section][f.name] = value
                    except TypeError as e:  # a value of another type: the config itself refuses it (type-safe)
                        return [f"{section}.{f.name}={value!r}: {e}"] if f.name in str(e) else [str(e)]
                    return config_problems(config)

                pattern = f"{section}.{f.name}="
                cases.append(
                    Case(
                        "config field",
                        f"{section}.{f.name}={value!r}",
                        run,
                        Works(lambda problems, p=pattern: any(line.startswith(p) for line in problems)),
                    )
                )
    return cases


def _option_cases() -> list[Case]:
    from zoo import mixers

    options = mixers.options_config()
    cases = []
    for name, rule in OPTION_RULES.items():
        mixer = next((m for m in mixers.names() if name in options[m]), None)
        if mixer is None:
            continue
        for value in [v for v in ("x", float("nan"), -1, 10**12) if not rule.check(v)][:2]:

            def run(_tmp, mixer=mixer, name=name, value=value):
                config = _base_config()
                config.model.mixer = mixer
                try:
                    config.model.mixer_options[mixer][name] = value
                except TypeError as e:  # refused by the type-safe config
                    return [f"model.mixer_options.{mixer}.{name}={value!r}: {e}"] if name in str(e) else [str(e)]
                return config_problems(config)

            pattern = f"model.mixer_options.{mixer}.{name}="
            check = Works(lambda problems, p=pattern: any(p in line for line in problems))
            cases.append(Case("mixer option", f"{mixer}.{name}={value!r}", run, check))
    return cases


def _config_file_modules():
    from zoo.config_fields import package_config_modules

    return [m for package in ("lra_flax.configs", "mt_flax.configs", "mlm_flax.configs")
            for m in package_config_modules(package)]  # fmt: skip


def _config_file_cases() -> list[Case]:
    """Every field a config file declares for itself (data, decode, pretrained), refused by the run's validation."""
    from zoo.config_fields import flat

    cases = []
    for module in _config_file_modules():
        preset = getattr(module, "PRESETS", ("polarity",))[0]
        file = module.__name__.rpartition(".")[2]
        for section, fields in module.CONFIG_SECTIONS.items():
            for name, f in flat(fields, section):
                for value in [v for v in (*_bad_values(f.rule, f.default), "") if not f.rule.check(v)][:3]:

                    def run(_tmp, module=module, preset=preset, name=name, value=value):
                        config = module.get_config(preset)
                        try:
                            config.update_from_flattened_dict({name: value})
                        except TypeError as e:  # a value of another type: refused by the type-safe config
                            return [f"{name}={value!r}: {e}"]
                        return config_problems(config, module.CONFIG_SECTIONS)

                    check = Works(lambda problems, p=f"{name}=": any(line.startswith(p) for line in problems))
                    cases.append(Case("task config field", f"{file}: {name}={value!r}", run, check))
    return cases


# ---------------------------------------------------------------------------------------------------------------
# Paths and workdirs
# ---------------------------------------------------------------------------------------------------------------


def _tiny_run(workdir_of: Callable[[Path], str], **train):
    def run(tmp):
        from tests.zoo.test_training import tiny_loop_run
        from zoo.training import train_and_evaluate

        config, task = tiny_loop_run(2)
        config.train.update(train)
        return train_and_evaluate(config, workdir_of(tmp), task)

    return run


def _file_at(name: str, then: str = "") -> Callable[[Path], str]:
    def make(tmp):
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text("a file")
        return str(tmp / name / then) if then else str(tmp / name)

    return make


def _dangling_link(tmp):
    (tmp / "run").symlink_to(tmp / "gone")
    return str(tmp / "run")


def _checkpoints_file(tmp):
    (tmp / "run").mkdir()
    (tmp / "run" / "checkpoints").write_text("not a directory")
    return str(tmp / "run")


def _path_cases() -> list[Case]:
    from zoo.files import MissingExtra, as_path, read_json

    def bad_json(tmp):
        (tmp / "cell.json").write_text("{not json")
        return read_json(tmp / "cell.json")

    return [
        Case(
            "path", "file:// is local", lambda tmp: as_path(f"file://{tmp}/x"), Works(lambda p: str(p).endswith("/x"))
        ),
        Case(
            "path", "memory://", lambda tmp: as_path("memory://x"), Error(ValueError, r"memory:// is not a supported")
        ),
        Case("path", "hdfs://", lambda tmp: as_path("hdfs://x/y"), Error(ValueError, r"hdfs:// is not a supported")),
        Case("path", "unreadable JSON names its file", bad_json, Error(ValueError, r"cell\.json: not a readable JSON")),
        Case(
            "workdir",
            "a file",
            _tiny_run(_file_at("run")),
            Error(ValueError, r"--workdir=.*run exists and is not a dir"),
        ),
        Case(
            "workdir",
            "inside a file",
            _tiny_run(_file_at("f", "run")),
            Error(ValueError, r"is a file, not a directory"),
            untouched="f/run",
        ),
        Case(
            "workdir",
            "a dangling symbolic link",
            _tiny_run(_dangling_link),
            Error(ValueError, r"--workdir=.*run is a symbolic link to .*gone, which does not exist"),
        ),
        Case(
            "workdir", "not UTF-8", _tiny_run(lambda tmp: str(tmp) + "/w\udcff"), Error(ValueError, "not valid UTF-8")
        ),
        Case(
            "workdir",
            "checkpoints is a file",
            _tiny_run(_checkpoints_file),
            Error(ValueError, r"checkpoints is a file"),
            untouched="run/config.json",
        ),
        Case(
            "workdir", "memory:// workdir", _tiny_run(lambda tmp: "memory://run"), Error(ValueError, "not a supported")
        ),
        Case(
            "workdir",
            "a step too big for the device",
            _tiny_run(lambda tmp: str(tmp / "run"), device_memory_gib=1e-6),
            Error(ValueError, r"GiB per device.*Nothing was written"),
            untouched="run",
        ),
        Case(
            "workdir",
            "file:// workdir trains",
            _tiny_run(lambda tmp: f"file://{tmp}/run"),
            Works(lambda results: results["steps"] == 2.0),
        ),
    ] + [
        Case(
            "path",
            f"{scheme}:// without its package",
            lambda tmp, s=scheme: as_path(f"{s}://bucket/run"),
            Error(MissingExtra, rf"{scheme}:// paths need {package}.*\[cloud\]"),
        )
        for scheme, package in (("gs", "gcsfs"), ("s3", "s3fs"))
        if not _installed(package)
    ]


def _installed(package: str) -> bool:
    try:
        __import__(package)
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------------------------------------------------------
# Data readers
# ---------------------------------------------------------------------------------------------------------------


def _acl(tmp, review: bytes, empty: str = ""):
    for split in ("train",):
        for polarity in ("neg", "pos"):
            (tmp / "acl" / split / polarity).mkdir(parents=True, exist_ok=True)
            if polarity != empty:
                (tmp / "acl" / split / polarity / "0_1.txt").write_bytes(b"a fine film")
    (tmp / "acl" / "train" / "pos" / "1_9.txt").write_bytes(review)
    from lra_flax.tasks import text

    return text.read_aclimdb_split(tmp / "acl", "train")


def _reviews_csv(tmp, body: str):
    (tmp / "r.csv").write_text("text,label,source\n" + body)
    from lra_flax.tasks import text

    return text.read_reviews_csv(tmp / "r.csv")


def _pairs(tmp, line: str, max_doc_bytes: int = 100):
    (tmp / "p.tsv").write_text(line + "\n")
    from lra_flax.tasks import retrieval

    return list(retrieval.read_pairs(tmp / "p.tsv", max_doc_bytes=max_doc_bytes))


def _max_doc_bytes(value: int) -> list[str]:
    """data.max_doc_bytes through the run's validation (the readers trust it)."""
    from lra_flax.configs import retrieval

    config = retrieval.get_config("demo")
    config.data.max_doc_bytes = value
    return config_problems(config, retrieval.CONFIG_SECTIONS)


def _idx(tmp, data: bytes):
    (tmp / "x.idx").write_bytes(data)
    from lra_flax.tasks import image

    return image.read_idx(tmp / "x.idx")


def _idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    return header + array.astype(np.uint8).tobytes()


def _mnist_5k(tmp, rows: list[list[int]]):
    text = "\n".join(",".join(map(str, row)) for row in rows)
    (tmp / "m.csv.gz").write_bytes(gzip.compress(text.encode()))
    from lra_flax.tasks import image

    return image.read_mnist_5k(tmp / "m.csv.gz")


def _png(tmp, mode: str, size: int, value: int):
    from PIL import Image

    Image.new(mode, (size, size), value).save(tmp / "p.png")
    from lra_flax.tasks import pathfinder

    return pathfinder.read_png(tmp / "p.png", 32)


def _gunzip(tmp, data: bytes, limit: int = 1 << 20):
    from lra_flax.tasks import image

    return image.gunzip_bounded(data, tmp / "x.gz", limit)


def _wiki(tmp, data: bytes, name: str = "w.xml.bz2"):
    (tmp / name).write_bytes(data)
    from mlm_flax.data import wiki_documents

    return wiki_documents(tmp / name)


WIKI = (
    b"<mediawiki><page><title>A</title><ns>0</ns><revision><text>Some text here, long enough to keep.</text>"
    b"</revision></page></mediawiki>"
)


def _wheel(tmp, data: bytes | None = None, members: dict[str, bytes] | None = None):
    from zoo.text.wheels import WheelFile, fetch_wheel_member

    spec = WheelFile("demo-pkg", "1.0", "demo/data.txt")
    path = tmp / "wheels" / "demo_pkg-1.0-py3-none-any.whl"
    path.parent.mkdir(parents=True, exist_ok=True)
    if data is None:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as zf:
            for name, body in (members or {}).items():
                zf.writestr(name, body)
        data = buffer.getvalue()
    path.write_bytes(data)
    return fetch_wheel_member(spec, tmp / "wheels").read_bytes()


def _corrupt_member_wheel() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("demo/data.txt", b"x" * 10_000)
    data = bytearray(buffer.getvalue())
    data[60:80] = b"\xff" * 20  # inside the compressed member
    return bytes(data)


def _reader_cases() -> list[Case]:
    from zoo.training.data import DataFormatError as Bad

    bomb = gzip.compress(b"\0" * (4 << 20))  # 4 MiB from a few KB
    row = [0] * 784
    idx = _idx_bytes(np.arange(12).reshape(3, 4))
    table = [
        # kind, name, run(tmp), outcome
        ("text", "aclImdb review empty", lambda t: _acl(t, b""), Error(Bad, r"1_9\.txt: the review is empty")),
        ("text", "aclImdb review blank", lambda t: _acl(t, b"  \n"), Error(Bad, "the review is empty")),
        ("text", "aclImdb review not UTF-8", lambda t: _acl(t, b"\xff\xfe"), Error(Bad, "not valid UTF-8")),
        ("text", "aclImdb good", lambda t: _acl(t, b"great"), Works(lambda r: len(r) == 3)),
        (
            "text",
            "aclImdb one class empty",
            lambda t: _acl(t, b"great", empty="neg"),
            Error(Bad, r"acl/train/neg: no reviews \(\*\.txt\); the release has both pos/ and neg/ reviews"),
        ),
        ("text", "csv empty review", lambda t: _reviews_csv(t, ",1,imdb\n"), Error(Bad, r"r\.csv:2: the review")),
        ("text", "csv label 7", lambda t: _reviews_csv(t, "good,7,imdb\n"), Error(Bad, r"label '7'")),
        ("text", "csv label x", lambda t: _reviews_csv(t, "good,x,imdb\n"), Error(Bad, r"label 'x'")),
        ("text", "csv two fields", lambda t: _reviews_csv(t, "good,1\n"), Error(Bad, "expected 3")),
        ("text", "csv no imdb rows", lambda t: _reviews_csv(t, "good,1,yelp\n"), Error(Bad, "no rows")),
        ("retrieval", "empty text1", lambda t: _pairs(t, "1\ta\tb\t\tsecond"), Error(Bad, r"p\.tsv:1: text1 is empty")),
        ("retrieval", "blank text2", lambda t: _pairs(t, "1\ta\tb\tfirst\t  "), Error(Bad, "text2 is empty")),
        ("retrieval", "four fields", lambda t: _pairs(t, "1\ta\tb\tfirst"), Error(Bad, r"p\.tsv:1")),
        ("retrieval", "label 2", lambda t: _pairs(t, "2\ta\tb\tx\ty"), Error(Bad, r"label '2'")),
        ("retrieval", "max_doc_bytes 0", lambda t: _max_doc_bytes(0), Works(lambda p: "max_doc_bytes=0 must" in p[0])),
        ("retrieval", "max_doc_bytes -5", lambda t: _max_doc_bytes(-5), Works(lambda p: "bytes=-5 must" in p[0])),
        (
            "retrieval",
            "cut to max_doc_bytes",
            lambda t: _pairs(t, "1\ta\tb\txyz\ty", 2),
            Works(lambda r: r[0][2:] == (b"xy", b"y")),
        ),
        ("image", "idx good", lambda t: _idx(t, idx), Works(lambda a: a.shape == (3, 4))),
        ("image", "idx gz good", lambda t: _idx(t, gzip.compress(idx)), Works(lambda a: a.shape == (3, 4))),
        ("image", "idx bad magic", lambda t: _idx(t, b"\1\2\3\4" + idx[4:]), Error(Bad, "wrong IDX magic")),
        ("image", "idx truncated gzip", lambda t: _idx(t, gzip.compress(idx)[:-12]), Error(Bad, "truncated|gzip")),
        ("image", "gzip bomb", lambda t: _gunzip(t, bomb), Error(Bad, "decompression bomb")),
        ("image", "gzip garbage", lambda t: _gunzip(t, b"\x1f\x8b" + b"\0" * 30), Error(Bad, "not a readable gzip")),
        ("image", "mnist_5k label 12", lambda t: _mnist_5k(t, [[*row, 1], [*row, 12]]), Error(Bad, r":2: label 12")),
        ("image", "mnist_5k label -1", lambda t: _mnist_5k(t, [[*row, -1]]), Error(Bad, "label -1")),
        ("image", "mnist_5k pixel 300", lambda t: _mnist_5k(t, [[300, *row[1:], 1]]), Error(Bad, "0..255")),
        ("image", "mnist_5k short row", lambda t: _mnist_5k(t, [[0, 1]]), Error(Bad, "expected 785")),
        ("image", "mnist_5k good", lambda t: _mnist_5k(t, [[*row, 3]]), Works(lambda r: int(r[1][0]) == 3)),
        ("pathfinder", "16-bit PNG", lambda t: _png(t, "I;16", 32, 30000), Error(Bad, "'I;16' is not 8-bit")),
        ("pathfinder", "8-bit RGB converted", lambda t: _png(t, "RGB", 32, (9, 9, 9)), Works(lambda a: a[0, 0] == 9)),
        ("pathfinder", "wrong size", lambda t: _png(t, "L", 40, 7), Error(Bad, r"40×40, expected 32×32")),
        ("pathfinder", "huge PNG refused unread", lambda t: _png(t, "L", 4000, 0), Error(Bad, "4000×4000")),
        (
            "pathfinder",
            "8-bit good",
            lambda t: _png(t, "L", 32, 7),
            Works(lambda a: a.dtype == np.uint8 and a[0, 0] == 7),
        ),
        ("pathfinder", "not a PNG", _not_a_png, Error(Bad, "not a readable PNG")),
        (
            "wikipedia",
            "good",
            lambda t: _wiki(t, bz2.compress(WIKI)),
            Works(lambda d: d[0].startswith("A\nSome text")),
        ),
        ("wikipedia", "truncated bz2", lambda t: _wiki(t, bz2.compress(WIKI)[:-20]), Error(Bad, "not a readable bz2")),
        ("wikipedia", "not bz2", lambda t: _wiki(t, b"plain bytes"), Error(Bad, "not a readable bz2")),
        ("wikipedia", "bad XML", lambda t: _wiki(t, b"<mediawiki><page>", "w.xml"), Error(Bad, "not well-formed")),
        (
            "wikipedia",
            "no articles",
            lambda t: _wiki(t, b"<mediawiki></mediawiki>", "w.xml"),
            Error(Bad, "no articles"),
        ),
        (
            "wheel",
            "member missing",
            lambda t: _wheel(t, members={"x.txt": b"x"}),
            Error(FileNotFoundError, "no member"),
        ),
        ("wheel", "good", lambda t: _wheel(t, members={"demo/data.txt": b"hello"}), Works(lambda b: b == b"hello")),
    ]
    cases = [Case(kind, name, run, outcome) for kind, name, run, outcome in table]
    unreadable = Error(ValueError, "not a readable wheel")
    member = "wheels/demo-pkg/1.0/demo/data.txt"
    cases.append(Case("wheel", "not a zip", lambda t: _wheel(t, b"random bytes"), unreadable, untouched=member))
    cases.append(
        Case("wheel", "corrupt member", lambda t: _wheel(t, _corrupt_member_wheel()), unreadable, untouched=member)
    )
    return cases


def _not_a_png(tmp):
    (tmp / "p.png").write_bytes(b"nope")
    return _read_png(tmp)


def _read_png(tmp):
    from lra_flax.tasks import pathfinder

    return pathfinder.read_png(tmp / "p.png", 32)


# ---------------------------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------------------------


def _linear(eps=1e-6, nan_in_masked=False, impl="xla", causal=False):
    from kernels import linear_attention
    from kernels.options import LinearAttentionOptions

    rng = np.random.default_rng(0)
    phi_q, phi_k = (jnp.asarray(rng.random((1, 8, 2, 4)), jnp.float32) for _ in range(2))
    v = jnp.asarray(rng.standard_normal((1, 8, 2, 4)), jnp.float32)
    mask = jnp.arange(8)[None] < 5
    if nan_in_masked:
        phi_k, v = phi_k.at[:, 6].set(jnp.nan), v.at[:, 6].set(jnp.nan)
    return linear_attention(phi_q, phi_k, v, key_mask=mask, causal=causal, eps=eps,
                            options=LinearAttentionOptions(impl=impl))  # fmt: skip


def _relu(nan_in_masked=False, impl="xla", causal=False):
    from kernels import relu_attention
    from kernels.options import ReluAttentionOptions

    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 8, 2, 4)), jnp.float32) for _ in range(3))
    mask = jnp.arange(8)[None] < 5
    if nan_in_masked:
        k, v = k.at[:, 6].set(jnp.nan), v.at[:, 6].set(jnp.nan)
    return relu_attention(q, k, v, key_mask=mask, causal=causal, options=ReluAttentionOptions(impl=impl))


def _finite(x) -> bool:
    return bool(jnp.isfinite(x).all())


def _kernel_cases() -> list[Case]:
    cases = [
        Case(
            "kernel",
            f"linear eps={eps!r}",
            lambda t, e=eps: _linear(eps=e),
            Error(ValueError, "must be a finite number > 0"),
        )
        for eps in (0.0, -1e-6, float("nan"), float("inf"))
    ]
    for impl in ("reference", "xla"):
        for causal in (False, True):
            cases += [
                Case("kernel", f"linear NaN in masked rows ({impl}, causal={causal})",
                     lambda t, i=impl, c=causal: _linear(nan_in_masked=True, impl=i, causal=c), Works(_finite)),
                Case("kernel", f"relu NaN in masked rows ({impl}, causal={causal})",
                     lambda t, i=impl, c=causal: _relu(nan_in_masked=True, impl=i, causal=c), Works(_finite)),
            ]  # fmt: skip
    return cases


# ---------------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------------


def _classifier(tie: str, cls: str = "SequenceClassifier"):
    from flax import nnx

    from zoo import models

    cfg = models.model_config(num_layers=1, d_model=8, num_heads=2, mlp_dim=8, max_length=8, tie_embeddings=tie)
    return getattr(models, cls)(cfg, vocab_size=5, num_classes=2, rngs=nnx.Rngs(0))


# Every public model's size arguments, each 2 (a valid size); a case sets one to a bad value.
MODEL_SIZES = {
    "SequenceClassifier": ("vocab_size", "num_classes"), "DualEncoder": ("vocab_size", "num_classes"),
    "TextClassifier": ("vocab_size", "num_classes"), "SequenceEncoder": ("vocab_size",),
    "TextEncoder": ("vocab_size",), "MaskedLM": ("vocab_size",), "CausalLM": ("vocab_size",),
    "EncoderDecoder": ("src_vocab", "tgt_vocab"), "Encoder": (), "Decoder": (),
}  # fmt: skip


def _model(cls: str, sizes: dict | None = None, options: Callable | None = None, **fields):
    """Builds `zoo.models.<cls>` from Python; `options(cfg.mixer_options)` edits the mixers' options first."""
    from flax import nnx

    from zoo import models

    cfg = models.model_config(**dict(num_layers=2, d_model=8, num_heads=2, mlp_dim=8, max_length=8) | fields)
    if options is not None:
        options(cfg.mixer_options)
    kwargs = {name: 2 for name in MODEL_SIZES[cls]} | (sizes or {})
    return getattr(models, cls)(cfg, **kwargs, rngs=nnx.Rngs(0))


def _model_cases() -> list[Case]:
    cases = [
        Case(
            "model",
            f"{cls} tie_embeddings={tie}",
            lambda t, c=cls, x=tie: _classifier(x, c),
            Error(ValueError, rf"model.tie_embeddings='{tie}' is not valid for a classifier"),
        )
        for cls in ("SequenceClassifier", "DualEncoder")
        for tie in ("decoder", "all")
    ]
    for cls, sizes in MODEL_SIZES.items():  # refused at the model's entry, not by jax once arrays are made
        cases.append(
            Case(
                "model",
                f"{cls} d_model=-1",
                lambda t, c=cls: _model(c, d_model=-1),
                Error(ValueError, r"^config field model.d_model=-1 must be an integer in \[1, 65,536\]$"),
            )
        )
        cases.append(
            Case(
                "model",
                f"{cls} an unknown mixer",
                lambda t, c=cls: _model(c, mixer="relux"),
                Error(ValueError, r"^config field model.mixer: unknown mixer 'relux'; valid mixers: amlp, .*, softmax"),
            )
        )
        cases += [Case("model", f"{cls} {size}={value}", lambda t, c=cls, s=size, v=value: _model(c, {s: v}),
                       Error(ValueError, rf"^{cls}: {size}={value!r} must be an integer ≥ 1$"))
                  for size in sizes for value in (0, -1, 2.5)]  # fmt: skip
    # Every mixer's options, the inactive ones' too, as the commands check them (model.mixer is relu).
    relu = (
        "variance_reduction, gamma_init, gamma_learnable, norm_loss_weight, entropy_loss_weight, entropy_margin, impl"
    )
    options = {
        "an inactive mixer's option out of its choices": (
            lambda o: setattr(o.linear, "feature_map", "gluu"),
            r"model.mixer_options.linear.feature_map='gluu' must be one of elu1, relu, favor",
        ),
        "an inactive mixer's unknown option": (
            lambda o: o.linear.__setitem__("feature_mapp", "glu"),
            r"model.mixer_options.linear has no field 'feature_mapp'; valid: feature_map, kernel_depth",
        ),
        "an unknown mixer's options": (
            lambda o: o.__setitem__("relux", {"gamma_init": 2.0}),
            r"model.mixer_options.relux: unknown mixer 'relux'; valid mixers: amlp, .*relu, relu_l",
        ),
        "the active mixer's unknown option": (
            lambda o: o.relu.__setitem__("norm_los_weight", 0.1),
            rf"model.mixer_options.relu has no field 'norm_los_weight'; valid: {relu}$",
        ),
    }
    for name, (edit, pattern) in options.items():
        for cls in ("SequenceClassifier", "Encoder", "EncoderDecoder"):
            cases.append(Case("model", f"{cls}: {name}", lambda t, c=cls, e=edit: _model(c, options=e),
                              Error(ValueError, rf"^config field {pattern}")))  # fmt: skip
        cases.append(Case("mixer option", f"validated: {name}", lambda t, e=edit: _validated(e),
                          Works(lambda problems, p=pattern: any(re.match(p, line) for line in problems))))  # fmt: skip
    for name, given, pattern in [
        ("a typo", {"relu": {"typo": 1}}, rf"relu has no field 'typo'; valid: {relu}$"),
        ("an unknown mixer", {"relux": {}}, r"relux: unknown mixer 'relux'; valid mixers: amlp, "),
        ("not a section", {"relu": 3}, rf"relu=3 must be a section of its options: {relu}$"),
    ]:  # fmt: skip
        cases.append(Case("model", f"model_config(mixer_options=...) with {name}",
                          lambda t, g=given: model_config(mixer_options=g),
                          Error(ValueError, rf"^model_config: model.mixer_options.{pattern}")))  # fmt: skip
    return cases


def _mixer(name: str, **fields):
    """Builds mixer `name` from Python (`zoo.mixers.build`), with `fields` over a small config."""
    from flax import nnx

    from zoo import mixers

    cfg = mixers.default_config(name)
    cfg.update(dict(d_model=8, num_heads=2, max_length=8) | fields)
    return mixers.build(cfg, rngs=nnx.Rngs(0))


def _mixer_cases() -> list[Case]:
    """The fields every mixer shares, by the model fields' rules (once jax's errors or a division by zero)."""
    bad = [
        ("relu", "d_model", -4, r"an integer in \[1, 65,536\]"),
        ("relu", "num_heads", 0, r"an integer in \[1, 4,096\]"),
        ("gmlp", "max_length", 0, r"an integer in \[1, 1,048,576\]"),
        ("softmax", "qkv_dim", -1, "an integer in"),
        ("softmax", "attention_dropout", 1.5, r"in \[0, 1\)"),
        ("linear", "layer_norm_eps", 0.0, "a number > 0"),
        ("relu", "dtype", "float8", "one of"),
        ("softmax", "attention_init", "he", "one of xavier_uniform, fairseq"),
    ]
    return [
        Case("mixer", f"{name} {field}={value!r}", lambda t, n=name, f=field, v=value: _mixer(n, **{f: v}),
             Error(ValueError, rf"^model.{field}={value!r} must be {what}"))
        for name, field, value, what in bad
    ]  # fmt: skip


def _validated(edit: Callable) -> list[str]:
    """What the commands' validation says of a config whose mixer options `edit` changed."""
    config = _base_config()
    edit(config.model.mixer_options)
    return config_problems(config)


# ---------------------------------------------------------------------------------------------------------------
# Command lines: one line on stderr, exit status 2, nothing written
# ---------------------------------------------------------------------------------------------------------------

LISTOPS = "lra_flax/configs/listops.py"
COMPARE = "lra_flax/configs/compare.py:demo"


def _command(args: list[str], status: int, pattern: str, writes: str = "w", env: dict[str, str] | None = None):
    def run(tmp):
        argv = [a.replace("{tmp}", str(tmp)) for a in args]
        environment = {**os.environ, **(env or {})}
        proc = subprocess.run(
            [sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True, timeout=300, env=environment
        )
        return proc

    def check(proc):
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        import re

        return proc.returncode == status and len(lines) == 1 and re.search(pattern, lines[0]) is not None

    return run, Works(check), writes


# The lra_code preset's model at toy size: its data checks, compiled in a second.
_TOY_MODEL = [f"--config.model.{k}={v}" for k, v in
              {"num_layers": 1, "d_model": 32, "mlp_dim": 32, "num_heads": 2, "max_length": 64}.items()]  # fmt: skip


def _cli_cases() -> list[Case]:
    rows = [
        ("unknown flag", ["lra_flax", f"--config={LISTOPS}", "--workdir={tmp}/w", "--nosuch=1"], "nosuch"),
        ("unknown field", ["lra_flax", f"--config={LISTOPS}", "--workdir={tmp}/w", "--config.model.d_modle=64"],
         r"unknown config field 'model\.d_modle'.*valid fields there: .*\bd_model\b"),
        ("unknown preset", ["lra_flax", f"--config={LISTOPS}:nosuch", "--workdir={tmp}/w"],
         "unknown ListOps preset 'nosuch'; valid presets: demo, lra_code, paper"),
        ("missing config file", ["lra_flax", "--config=nope.py", "--workdir={tmp}/w"], "no config file 'nope.py'"),
        ("missing --workdir", ["lra_flax", f"--config={LISTOPS}"], "--workdir is required"),
        ("extra argument", ["lra_flax", f"--config={LISTOPS}", "--workdir={tmp}/w", "extra"], "unexpected arguments"),
        ("bad field value", ["lra_flax", f"--config={LISTOPS}", "--workdir={tmp}/w", "--config.model.d_model=0"],
         r"model.d_model=0 must be an integer in \[1, 65,536\]"),
        ("huge batch", ["lra_flax", f"--config={LISTOPS}", "--workdir={tmp}/w", "--config.train.batch_size=1000000000"],
         r"train.batch_size=1000000000"),
        ("memory:// workdir", ["lra_flax", f"--config={LISTOPS}", "--workdir=memory://w"], "not a supported location"),
        ("bad --profile_steps", ["lra_flax", f"--config={LISTOPS}", "--workdir={tmp}/w", "--profile_steps=3,2"],
         r"--profile_steps='3,2': FIRST,LAST \(two step numbers\) needs 1 <= first <= second"),
        ("translation NaN length penalty", ["mt_flax", "--config=mt_flax/configs/translation.py", "--workdir={tmp}/w",
         "--config.decode.length_penalty=nan"], r"decode.length_penalty=nan must be a finite number"),
        ("lra-compare workdir is a file", ["lra_flax.compare_cli", "--config=lra_flax/configs/compare.py:demo",
         "--workdir=README.md", "--report_only"], "exists and is not a directory"),
        ("zoo.parameter_counts: unknown mixer",
         ["zoo.parameter_counts", f"--config={LISTOPS}", "--config.model.mixer=nosuch"],
         r"invalid config: model.mixer: unknown mixer 'nosuch'"),
        ("zoo.parameter_counts: zero width",
         ["zoo.parameter_counts", f"--config={LISTOPS}", "--config.model.d_model=0"],
         r"model.d_model=0 must be an integer"),
        ("zoo.parameter_counts: extra argument", ["zoo.parameter_counts", f"--config={LISTOPS}", "extra"],
         "unexpected arguments"),
        ("mlm-inspect --output a folder", ["mlm_flax.inspect_sgu", "--workdir={tmp}/w", "--output=lra_flax"],
         r"--output=lra_flax is a directory; give a file path"),
        ("mlm-inspect --output no figure", ["mlm_flax.inspect_sgu", "--workdir={tmp}/w", "--output={tmp}/w.txt"],
         r"the file name must end in one of .png, .pdf, .svg"),
        ("mlm-data --holdout_fraction negative", ["mlm_flax.data_cli", "wiki-sample", "--output_dir={tmp}/w",
         "--holdout_fraction=-0.1"], r"--holdout_fraction=-0.1 must be in \(0, 1\)"),
        ("mlm-data --holdout_fraction NaN", ["mlm_flax.data_cli", "wiki-sample", "--output_dir={tmp}/w",
         "--holdout_fraction=nan"], r"--holdout_fraction=nan must be in \(0, 1\)"),
        ("mlm-inspect --output exists", ["mlm_flax.inspect_sgu", "--workdir={tmp}/w",
         "--output=benchmarks/mlm/sgu_weights_markov_tiny.png"],
         r"--output=benchmarks/mlm/sgu_weights_markov_tiny.png exists; pass --overwrite to replace it"),
        ("mlm-inspect workdir a file, no --output", ["mlm_flax.inspect_sgu", "--workdir=README.md"],
         r"--workdir \(where sgu_weights.png goes without --output\)=\S*README.md exists and is not a directory"),
        ("efficiency --output a folder", ["lra_flax.efficiency", f"--config={LISTOPS}", "--output=lra_flax"],
         r"--output=lra_flax is a directory; give a file path"),
        ("mt-translate NaN --length_penalty", ["mt_flax.translate", "--workdir={tmp}/w", "--input=README.md",
         "--length_penalty=nan"], r"--length_penalty=nan must be a finite number"),
        ("mt-translate --input missing", ["mt_flax.translate", "--workdir={tmp}/w", "--input={tmp}/nonexist.de"],
         r"--input=\S*nonexist.de is not a file"),
        ("mt-translate --output exists", ["mt_flax.translate", "--workdir={tmp}/w", "--input=README.md",
         "--output=Makefile"], r"--output=Makefile exists; pass --overwrite to replace it"),
        ("lra-data: another sub-command's flag", ["lra_flax.data_cli", "listops", "--output_dir={tmp}/w",
         "--num_images=5"], r"lra-data listops does not use --num_images \(a pathfinder flag\)"),
        ("field added under an empty section", ["lra_flax.compare_cli", "--config=lra_flax/configs/compare.py:demo",
         "--workdir={tmp}/w", "--config.overrides.train.steps=5"], r"overrides is empty in this preset, and the "
         r"command line can set fields but not add them"),
        ("data.dir is a file", ["lra_flax", f"--config={LISTOPS}", "--workdir={tmp}/w", "--config.data.dir=README.md"],
         r"data.dir=README.md is a file, not a directory"),
        # A preset that names the release reads it: a mistyped data.dir is refused, nothing generated there.
        ("release preset, mistyped data.dir", ["lra_flax", "--config=lra_flax/configs/listops.py:lra_code",
         "--workdir={tmp}/w", "--config.data.dir={tmp}/lra_releas", *_TOY_MODEL],
         r"data.dir=\S*lra_releas has no ListOps TSVs .* or set data.generate=True"),
        ("negative --fake_cpu_devices", ["lra_flax", f"--config={LISTOPS}", "--workdir={tmp}/w",
         "--fake_cpu_devices=-1"], r"flag --fake_cpu_devices=-1: -1 is not a non-negative integer"),
        ("efficiency with no timed step", ["lra_flax.efficiency", f"--config={LISTOPS}", "--steps=0"],
         r"flag --steps=0: 0 is not a positive integer"),
        ("lra-compare --report_only, no sweep there", ["lra_flax.compare_cli",
         "--config=lra_flax/configs/compare.py:demo", "--workdir={tmp}/w", "--report_only"], "holds no sweep"),
        ("study --out unwritable", ["studies.variance", "--tiny", "--out=/proc/nope"], r"/proc/nope"),
        ("study --out another study's folder", ["studies.parameter_budget", "--tiny",
         "--out=benchmarks/studies/variance"],
         r"--out: \S*variance/result\.json is not a parameter_budget study's result \(it is variance's\)"),
        ("study --report another study's result", ["studies.stability", "--report",
         "--out=benchmarks/studies/variance"],
         r"--report: \S*variance/result\.json is not a stability study's result \(it is variance's\)"),
        # A config of another command: named as not the kind this one takes, before any field is read.
        ("lra-compare: a task config", ["lra_flax.compare_cli", f"--config={LISTOPS}", "--workdir={tmp}/w",
         "--cells"], r"--config is not an lra-compare sweep config \(lra_flax/configs/compare.py\): it has no tasks, "
         r"variants, seeds"),
        ("lra-compare: a translation config", ["lra_flax.compare_cli", "--config=mt_flax/configs/translation.py:demo",
         "--workdir={tmp}/w"], r"--config is not an lra-compare sweep config"),
        ("zoo.parameter_counts: a sweep config", ["zoo.parameter_counts", f"--config={COMPARE}"],
         r"--config is not a task config with a model section .*: it has no model\.mixer"),
        ("lra-train: a sweep config", ["lra_flax", f"--config={COMPARE}", "--workdir={tmp}/w"],
         r"--config is not an LRA task config \(lra_flax/configs/<task>.py\): it has no data\."),
        ("config file without get_config", ["lra_flax", "--config=lra_flax/configs/__init__.py", "--workdir={tmp}/w"],
         r"--config=lra_flax/configs/__init__.py: __init__.py has no get_config\(\)"),
        # The sweep config's own fields, refused before any cell runs (--cells too).
        ("lra-compare: efficiency.steps=0", ["lra_flax.compare_cli", f"--config={COMPARE}", "--workdir={tmp}/w",
         "--config.efficiency.steps=0"], r"invalid sweep config: efficiency.steps=0 must be an integer ≥ 1"),
        ("lra-compare: efficiency.task preset", ["lra_flax.compare_cli", f"--config={COMPARE}", "--workdir={tmp}/w",
         "--cells", "--config.efficiency.task=text:dmo"], r"efficiency.task='text:dmo': unknown Text preset 'dmo'"),
        ("lra-data: no task", ["lra_flax.data_cli"], r"no task given; usage: lra-data \{listops,"),
        ("lra-data: unknown task", ["lra_flax.data_cli", "listopz", "--output_dir={tmp}/w"],
         r"unknown task 'listopz'; valid: listops, retrieval, image, pathfinder"),
        ("lra-data: no --output_dir", ["lra_flax.data_cli", "listops"], r"--output_dir is required"),
        ("mt-data: unknown corpus", ["mt_flax.data_cli", "bibel", "--output_dir={tmp}/w"],
         r"unknown corpus 'bibel'; valid: bible"),
        ("mlm-data: no corpus", ["mlm_flax.data_cli", "--output_dir={tmp}/w"], r"no corpus given; usage: mlm-data"),
    ]  # fmt: skip
    cases = []
    for name, args, pattern in rows:
        run, outcome, writes = _command(args, 2, pattern)
        cases.append(Case("command", name, run, outcome, untouched=writes))
    bad_peak = {"ZOO_CPU_PEAK_TFLOPS": "fast"}  # the host's matmul rate from the environment, checked with the config
    run, outcome, writes = _command(
        ["lra_flax", f"--config={LISTOPS}", "--workdir={tmp}/w", "--config.data.dir={tmp}/w/data"],
        2,
        r"ZOO_CPU_PEAK_TFLOPS='fast' must be",
        env=bad_peak,
    )
    cases.append(Case("command", "bad ZOO_CPU_PEAK_TFLOPS", run, outcome, untouched=writes))
    # The listing (shard 1/70: image/gmlp/seed0 alone) holds a cell that will fail: one line and status 2.
    run, outcome, writes = _command(
        ["lra_flax.compare_cli", f"--config={COMPARE}", "--workdir={tmp}/w", "--cells", "--shard=1/70",
         "--config.variants.gmlp.mixer=nosuch"], 2, r"1 of the listed cells will fail \(each says why above\)",
    )  # fmt: skip
    cases.append(Case("command", "lra-compare --cells, a cell will fail", run, outcome, untouched=writes))
    for platform in ("cuda", "tpu"):  # a backend this CPU machine cannot start: one line, not jax's traceback
        run, outcome, writes = _command(
            ["lra_flax", f"--config={LISTOPS}", "--workdir={tmp}/w"], 2,
            rf"JAX_PLATFORMS='{platform}' names a backend this machine cannot start", env={"JAX_PLATFORMS": platform},
        )  # fmt: skip
        cases.append(Case("command", f"JAX_PLATFORMS={platform} on a CPU machine", run, outcome, untouched=writes))
    return cases


CASES = (
    _field_cases() + _option_cases() + _config_file_cases() + _path_cases() + _reader_cases() + _kernel_cases()
    + _model_cases() + _mixer_cases()
)  # fmt: skip
CLI_CASES = _cli_cases()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.kind}: {c.name}")
def test_bad_input(case, tmp_path):
    _expect(case, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("case", CLI_CASES, ids=lambda c: f"{c.kind}: {c.name}")
def test_bad_command_line(case, tmp_path):
    _expect(case, tmp_path)


def test_the_table_covers_every_kind_and_at_least_174_cases():
    kinds = {c.kind for c in CASES + CLI_CASES}
    assert {"config field", "mixer option", "task config field", "path", "workdir", "text", "retrieval", "image",
            "pathfinder", "wikipedia", "wheel", "kernel", "model", "command"} <= kinds  # fmt: skip
    assert len(CASES) + len(CLI_CASES) >= 174, len(CASES) + len(CLI_CASES)
    names = [(c.kind, c.name) for c in CASES + CLI_CASES]
    assert len(names) == len(set(names))  # ids are unique: a failure names its case
