"""LRA Image readers on small files in their real layouts, the grey formula, and pixel 0 as a real token."""

import gzip
import io
import pickle
import tarfile

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lra_flax.configs import image as image_config
from lra_flax.input_pipeline import DataFormatError
from lra_flax.tasks import image
from zoo.models import SequenceClassifier, model_config


def _idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def _write_idx(folder, split, images, labels, gz=True):
    folder.mkdir(parents=True, exist_ok=True)
    for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
        data = _idx_bytes(array)
        name = f"{split}-{kind}-ubyte" + (".gz" if gz else "")
        (folder / name).write_bytes(gzip.compress(data) if gz else data)


def test_grey_is_tensorflows_rgb_to_grayscale_on_uint8():
    """tf.image.rgb_to_grayscale (tensorflow/python/ops/image_ops_impl.py): convert_image_dtype(uint8 → float32)
    multiplies by 1/255, the weights (0.2989, 0.5870, 0.1140) are summed in float32, and convert_image_dtype back
    scales by 255 + 0.5 and casts, truncating. Expected values worked out by hand from those steps."""
    cases = {
        (0, 0, 0): 0,
        (255, 255, 255): 255,  # 0.9999 · 255.5 = 255.47
        (255, 0, 0): 76,  # 0.2989 · 255.5 = 76.37
        (0, 255, 0): 149,  # 0.5870 · 255.5 = 149.98, truncated (rounding 0.587 · 255 = 149.69 would give 150)
        (0, 0, 255): 29,  # 0.1140 · 255.5 = 29.13
        (10, 20, 30): 18,  # (2.989 + 11.74 + 3.42) / 255 = 0.071173; · 255.5 = 18.18
    }
    rgb = np.array(list(cases), np.uint8)
    np.testing.assert_array_equal(image.to_grey(rgb), np.array(list(cases.values()), np.uint8))
    rgb = np.random.default_rng(0).integers(0, 256, (200, 4, 3), dtype=np.uint8)
    rounded = np.rint(rgb.astype(np.float64) @ np.array([0.2989, 0.587, 0.114]))
    assert 0 < np.mean(image.to_grey(rgb) != rounded) < 0.6  # truncation differs from rounding, by at most one
    assert np.max(np.abs(image.to_grey(rgb).astype(int) - rounded)) == 1


@pytest.mark.parametrize("gz", [True, False])
def test_idx_reader_round_trips_and_pads_to_32(tmp_path, gz):
    rng = np.random.default_rng(1)
    images, labels = rng.integers(0, 256, (7, 28, 28)), rng.integers(0, 10, 7)
    _write_idx(tmp_path, "train", images, labels, gz=gz)
    got_images, got_labels = image.read_idx_split(tmp_path, "train")
    np.testing.assert_array_equal(got_images, images)
    np.testing.assert_array_equal(got_labels, labels)
    padded = image.pad_to(got_images)
    assert padded.shape == (7, 32, 32)
    np.testing.assert_array_equal(padded[:, 2:30, 2:30], images)
    assert not padded[:, :2].any() and not padded[:, :, 30:].any()


def test_idx_wrong_magic_and_count_mismatch_name_the_file(tmp_path):
    _write_idx(tmp_path, "train", np.zeros((3, 28, 28)), np.zeros(4))
    with pytest.raises(DataFormatError, match=r"train-labels-idx1-ubyte.gz: \(4,\) labels for the 3 images"):
        image.read_idx_split(tmp_path, "train")
    bad = tmp_path / "t10k-images-idx3-ubyte"
    bad.write_bytes(b"\x00\x00\x0d\x03" + b"\x00" * 20)  # 0x0D: float data, not bytes
    with pytest.raises(DataFormatError, match="t10k-images-idx3-ubyte: wrong IDX magic number 00000d03"):
        image.read_idx(bad)
    short = tmp_path / "short"
    short.write_bytes(_idx_bytes(np.zeros((2, 3, 3)))[:-1])
    with pytest.raises(DataFormatError, match=r"short: IDX dims \(2, 3, 3\) need 18 bytes of data, the file has 17"):
        image.read_idx(short)


def _cifar_batch(path, rgb, labels):
    data = rgb.transpose(0, 3, 1, 2).reshape(len(rgb), -1)  # R, G, B planes, each row-major
    with path.open("wb") as f:
        pickle.dump({b"data": data, b"labels": list(labels), b"batch_label": b"x"}, f)


def test_cifar_python_folder_reads_planes_as_rgb_then_grey(tmp_path):
    rng = np.random.default_rng(2)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        rgb, labels = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, 3)
        _cifar_batch(tmp_path / name, rgb, labels)
        batches[name] = (rgb, labels)
    splits = image.read_cifar10_dir(tmp_path)
    train_rgb = np.concatenate([batches[f"data_batch_{i}"][0] for i in range(1, 6)])
    np.testing.assert_array_equal(splits["train"][0], image.to_grey(train_rgb))
    np.testing.assert_array_equal(splits["test"][1], batches["test_batch"][1])
    train, valid = image.split_train(splits["train"])
    assert len(train[0]) == 13 and len(valid[0]) == 2  # the last 10% of train (rounded) is valid


def test_cifar_batch_of_the_wrong_shape_names_the_file(tmp_path):
    with (tmp_path / "data_batch_1").open("wb") as f:
        pickle.dump({b"data": np.zeros((2, 1024), np.uint8), b"labels": [0, 1]}, f)
    with pytest.raises(DataFormatError, match=r"data_batch_1: data is uint8 \(2, 1024\), expected uint8 \[N, 3072\]"):
        image.read_cifar_batch(tmp_path / "data_batch_1")
    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py"):
        image.read_cifar10_dir(tmp_path)


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b.replace(b"numpy", b"numpx", 1),  # a garbled module name: ModuleNotFoundError when read
        lambda b: b[:2] + b"\x95" + (2**40).to_bytes(8, "little") + b[11:],  # a frame of a terabyte: MemoryError
        lambda b: b[: len(b) // 2],  # cut short
    ],
    ids=["module name", "frame length", "truncated"],
)
def test_a_damaged_cifar_batch_is_named_whatever_the_damage(tmp_path, damage):
    path = tmp_path / "data_batch_1"
    with path.open("wb") as f:
        pickle.dump({b"data": np.zeros((2, 3072), np.uint8), b"labels": np.array([0, 1])}, f, protocol=4)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DataFormatError, match=r"data_batch_1: not a CIFAR-10 python batch \("):
        image.read_cifar_batch(path)


def test_a_cifar_label_out_of_range_is_named_with_its_image(tmp_path):
    with (tmp_path / "data_batch_1").open("wb") as f:
        pickle.dump({b"data": np.zeros((3, 3072), np.uint8), b"labels": [0, 10, 1]}, f)
    with pytest.raises(DataFormatError, match=r"data_batch_1: label 10 of image 1 is outside \[0, 10\)"):
        image.read_cifar_batch(tmp_path / "data_batch_1")


def test_mnist_5k_csv(tmp_path):
    rows = [",".join(map(str, [*np.full(784, i * 10), i % 10])) for i in range(5)]
    path = tmp_path / "mnist_5k.csv.gz"
    path.write_bytes(gzip.compress(("\n".join(rows) + "\n").encode()))
    images, labels = image.read_mnist_5k(path)
    assert images.shape == (5, 28, 28) and images[3, 5, 5] == 30 and list(labels) == [0, 1, 2, 3, 4]
    path.write_bytes(gzip.compress(b"1,2,3\n"))
    with pytest.raises(DataFormatError, match=r"mnist_5k.csv.gz:1: expected 785"):
        image.read_mnist_5k(path)


def test_fashion_mnist_is_unpacked_from_a_debian_package_without_dpkg(tmp_path):
    tar_buffer = io.BytesIO()
    with tarfile.open(fileobj=tar_buffer, mode="w:xz") as tar:
        for name in ("t10k-labels-idx1-ubyte.gz", "train-images-idx3-ubyte.gz"):
            payload = b"content of " + name.encode()
            info = tarfile.TarInfo(f"./usr/share/datasets/fashion-mnist/{name}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        info = tarfile.TarInfo("./usr/share/doc/dataset-fashion-mnist/copyright")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"MIT"))

    def member(name, body):
        header = f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode()
        return header + body + (b"\n" if len(body) % 2 else b"")

    deb = tmp_path / "dataset-fashion-mnist_1_all.deb"
    deb.write_bytes(b"!<arch>\n" + member("debian-binary", b"2.0\n") + member("data.tar.xz", tar_buffer.getvalue()))
    out = tmp_path / "out"
    out.mkdir()
    image._unpack_deb_member_dir(deb, image.FASHION_MNIST_DIR, out)
    assert sorted(p.name for p in out.iterdir()) == ["t10k-labels-idx1-ubyte.gz", "train-images-idx3-ubyte.gz"]
    assert (out / "t10k-labels-idx1-ubyte.gz").read_bytes() == b"content of t10k-labels-idx1-ubyte.gz"


def _classifier(pad_id):
    cfg = model_config(
        mixer="relu",
        num_layers=1,
        d_model=16,
        num_heads=2,
        mlp_dim=16,
        max_length=1024,
        pooling="mean",
        pad_id=pad_id,
        dropout=0.0,
    )
    return SequenceClassifier(cfg, vocab_size=256, num_classes=10, rngs=nnx.Rngs(0))


def test_black_pixels_are_tokens_not_padding():
    """With pad_id=-1 the model sees all 1,024 pixels; with text's pad_id=0 trailing zeros would vanish."""
    one_pixel = jnp.array([[7]])
    then_black = jnp.zeros((1, 1024), jnp.int32).at[0, 0].set(7)
    text_model, pixel_model = _classifier(0), _classifier(-1)
    # The control: for text, zeros are padding and change nothing.
    chex.assert_trees_all_close(text_model(then_black), text_model(one_pixel), atol=1e-5)
    assert not np.allclose(pixel_model(then_black), pixel_model(one_pixel), atol=1e-3)
    all_black = jnp.zeros((1, 1024), jnp.int32)
    chex.assert_tree_all_finite(pixel_model(all_black))


def test_pixel_configs_refuse_padding_and_wrong_lengths():
    config = image_config.get_config("demo")
    assert config.model.pad_id == -1 and config.model.max_length == 1024
    image.check_pixel_model(config.model, 1024)
    with config.unlocked():
        config.model.max_length = 2048
    with pytest.raises(ValueError, match="model.max_length=2048 must equal the 1024 pixels"):
        image.check_pixel_model(config.model, 1024)
    with config.unlocked():
        config.model.max_length, config.model.pad_id = 1024, 0
    with pytest.raises(ValueError, match="model.pad_id=0 must be -1"):
        image.check_pixel_model(config.model, 1024)
