"""Pathfinder: the generator (determinism, labels checked independently), the LRA-layout reader, bad files."""

import subprocess

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from lra_flax import pathfinder_generator as gen
from lra_flax.input_pipeline import DataFormatError
from lra_flax.tasks import pathfinder

PARAMS32 = gen.lra_params(32, "hard")


def _files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_the_same_seed_writes_the_same_files_with_any_number_of_workers(tmp_path):
    for workers in (1, 2):
        stats = gen.write_dataset(
            tmp_path / f"w{workers}", PARAMS32, num_images=6, images_per_batch=2, workers=workers, progress=False
        )
        assert stats["images"] == 6
    one, two = _files(tmp_path / "w1"), _files(tmp_path / "w2")
    assert len(one) == 6 + 3 + 1 and one == two  # PNGs, 3 metadata files, generator.json
    # A re-run keeps finished batches and refuses other settings in the same folder.
    assert gen.write_dataset(tmp_path / "w1", PARAMS32, num_images=6, images_per_batch=2, progress=False)["images"] == 0
    with pytest.raises(ValueError, match=r"holds images generated with other settings \(seed: 0 there, 1 asked\)"):
        gen.write_dataset(tmp_path / "w1", PARAMS32, num_images=6, seed=1, images_per_batch=2, progress=False)


def test_images_depend_on_seed_and_index_only_and_labels_alternate():
    a, b = gen.generate_image(PARAMS32, 3, 5), gen.generate_image(PARAMS32, 3, 5)
    np.testing.assert_array_equal(a.image, b.image)
    assert not np.array_equal(a.image, gen.generate_image(PARAMS32, 4, 5).image)
    assert a.image.dtype == np.uint8 and a.image.shape == (32, 32) and a.image.max() == 255 and a.image.min() == 0
    assert [gen.generate_image(PARAMS32, 0, i).label for i in range(4)] == [0, 1, 0, 1]


def _owner(sample, marker):
    """Independent of the generator's labelling: the target snake whose drawn pixels are nearest a marker."""
    distances = [ndimage.distance_transform_edt(snake <= 0.25)[tuple(marker)] for snake in sample.target_pixels]
    return int(np.argmin(distances)), min(distances)


@pytest.mark.parametrize("index", range(12))
def test_labels_agree_with_which_snake_each_marker_sits_on(index):
    sample = gen.generate_image(PARAMS32, 11, index)
    (first, d_first), (second, d_second) = (_owner(sample, m) for m in sample.markers)
    assert d_first <= 1.5 and d_second <= 1.5  # each marker is on a target snake
    assert (first == second) == bool(sample.label)
    for y, x in sample.markers:  # and drawn at full brightness
        assert sample.image[y, x] >= 150


def test_path_x_parameters_and_validation():
    params = gen.lra_params(128, "hard")
    assert (params.window_size, params.contour_length, params.distractor_length) == (128, 14, 4)
    assert params.num_distractor_snakes == 8 and params.paddle_margins == (2, 3)
    assert gen.lra_params(32, "easy").contour_length == 6 and gen.lra_params(32, "intermediate").contour_length == 9
    with pytest.raises(ValueError, match="resolution=64"):
        gen.lra_params(64)


def test_blind_seed_quirk_matches_opencv_semantics():
    """The published code's seeds fail for elements that miss their anchor (OpenCV gives −FLT_MAX there)."""
    blind = [gen._blind_seed_angle(d * np.pi / 180, PARAMS32, 1) for d in range(-180, 180)]
    for deg, is_blind in zip(range(-180, 180), blind, strict=True):
        element = gen._seed_element(deg * np.pi / 180, PARAMS32, 1)
        centre = element.shape[0] // 2
        assert is_blind == (not element[centre, centre]), deg
    assert 0 < sum(blind) < len(blind)


# ----------------------------------------------------------------------------------------------
# Reader (LRA's release layout)
# ----------------------------------------------------------------------------------------------


def _release(root, n=20, resolution=32):
    folder = pathfinder.dataset_dir(root, resolution, "hard")
    rng = np.random.default_rng(0)
    lines = {}
    for i in range(n):
        batch = i // 10
        (folder / "imgs" / str(batch)).mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (resolution, resolution), dtype=np.uint8)
        Image.fromarray(pixels, mode="L").save(folder / "imgs" / str(batch) / f"sample_{i % 10}.png")
        lines.setdefault(batch, []).append(f"imgs/{batch} sample_{i % 10}.png {i % 10} {i % 2} 1.0 14 4 2 0.5 1 1")
    (folder / "metadata").mkdir()
    for batch, batch_lines in lines.items():
        (folder / "metadata" / f"{batch}.npy").write_text("\n".join(batch_lines) + "\n")
    return folder


def test_reader_orders_by_batch_skips_empty_images_and_splits_80_10_10(tmp_path):
    folder = _release(tmp_path)
    (folder / "imgs" / "1" / "sample_3.png").write_bytes(b"")  # LRA skips empty files
    examples = pathfinder.read_metadata(folder)
    assert len(examples) == 19
    assert examples[0][1].name == "sample_0.png" and examples[10][1].parent.name == "1"
    splits = pathfinder.split_examples(examples)
    assert [len(splits[s]) for s in ("train", "valid", "test")] == [15, 2, 2]
    pixels = pathfinder.read_png(examples[0][1], 32)
    assert pixels.shape == (32, 32) and pixels.dtype == np.uint8


def test_reader_errors_name_the_file(tmp_path):
    folder = _release(tmp_path)
    with (folder / "metadata" / "1.npy").open("a") as f:
        f.write("imgs/1 sample_99.png 99 1 1.0 14 4 2 0.5 1 1\n")
    with pytest.raises(DataFormatError, match=r"metadata/1.npy:11: names .*sample_99.png, which does not exist"):
        pathfinder.read_metadata(folder)
    png = folder / "imgs" / "0" / "sample_0.png"
    png.write_bytes(png.read_bytes()[:60])
    with pytest.raises(DataFormatError, match=r"sample_0.png: not a readable PNG"):
        pathfinder.read_png(png, 32)
    with pytest.raises(DataFormatError, match=r"sample_1.png: image is 32×32, expected 128×128"):
        pathfinder.read_png(folder / "imgs" / "0" / "sample_1.png", 128)
    with pytest.raises(FileNotFoundError, match="no metadata"):
        pathfinder.read_metadata(tmp_path / "nowhere")


def test_example_figure_is_written(tmp_path):
    from lra_flax import pathfinder_figure

    out = pathfinder_figure.draw(tmp_path / "examples.png", per_label=2, seed=0, resolutions=(32,))
    with Image.open(out) as figure:
        assert figure.format == "PNG" and figure.size[0] > 200 and figure.size[1] > 200


@pytest.mark.slow  # starts a command
def test_lra_data_pathfinder_writes_the_release_layout_that_the_reader_reads(tmp_path):
    import sys

    cmd = [sys.executable, "-m", "lra_flax.data_cli", "pathfinder", f"--output_dir={tmp_path}", "--num_images=4"]
    run = subprocess.run([*cmd, "--images_per_batch=3", "--workers=1"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "4 images in" in run.stdout and "images/s" in run.stdout
    examples = pathfinder.read_metadata(tmp_path / "pathfinder32" / "curv_contour_length_14")
    assert [label for _, _, label in examples] == [0, 1, 0, 1]
    assert [path.relative_to(tmp_path).as_posix().split("/", 2)[2] for _, path, _ in examples] == [
        "imgs/0/sample_0.png",
        "imgs/0/sample_1.png",
        "imgs/0/sample_2.png",
        "imgs/1/sample_0.png",
    ]


def _generated_config(tmp_path, num_images=6, generate=True):
    from lra_flax.configs import pathfinder as pathfinder_config

    config = pathfinder_config.get_config("demo")
    config.data.update(dir=str(tmp_path / "pf"), cache_dir=str(tmp_path / "cache"), num_images=num_images, workers=1)
    config.data.generate = generate
    return config, pathfinder.dataset_dir(config.data.dir, config.data.resolution, config.data.difficulty)


def test_a_generation_cut_short_is_finished_and_other_settings_are_refused(tmp_path):
    config, folder = _generated_config(tmp_path)
    gen.write_dataset(folder, gen.lra_params(32, config.data.difficulty), num_images=6, images_per_batch=2,
                      workers=1, progress=False)  # fmt: skip
    (folder / "metadata" / "2.npy").unlink()  # the last batch never finished
    with pytest.raises(ValueError, match=r"holds 2 of the 3 batches its generation was asked for .*data.generate=True"):
        pathfinder.prepare(_generated_config(tmp_path, generate=False)[0])
    pathfinder.prepare(config)  # generates the missing batch
    assert len(pathfinder.read_metadata(folder)) == 6
    other, _ = _generated_config(tmp_path, num_images=40)
    with pytest.raises(ValueError, match=r"other settings \(num_images: 6 there, 40 asked\): set data.num_images"):
        pathfinder.prepare(other)


def test_generation_never_writes_over_images_it_did_not_generate(tmp_path):
    config, folder = _generated_config(tmp_path)
    gen.write_dataset(folder, gen.lra_params(32, config.data.difficulty), num_images=2, workers=1, progress=False)
    for name in ("metadata", gen.generator_record.RECORD):  # a release folder whose metadata went missing
        path = folder / name
        path.unlink() if path.is_file() else [p.unlink() for p in path.iterdir()]
    own = folder / "imgs" / "0" / "sample_1.png"
    own.write_bytes(b"a user's own file")
    with pytest.raises(ValueError, match=r"holds images but no metadata/\*.npy and no generator.json"):
        pathfinder.prepare(config)
    assert own.read_bytes() == b"a user's own file"
