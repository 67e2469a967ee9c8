"""LRA Pathfinder and Path-X: are the two markers joined by one dashed contour? (docs/tasks.md)

Images (32×32 for Pathfinder, 128×128 = 16,384 tokens for Path-X) are read row by row, one token per grey
value 0..255, no padding id (`model.pad_id = -1`; black is a real token).

Files: LRA's release layout under data.dir — `pathfinder{32,128}/<difficulty dir>/metadata/<batch>.npy` (text
lines `imgs/<batch> sample_<i>.png <i> <label> …`) and the PNGs they name; difficulty dirs `curv_baseline`
(easy), `curv_contour_length_9` (intermediate), `curv_contour_length_14` (hard, LRA's). A downloaded
`lra_release` folder works as data.dir as it is. When the difficulty folder has no metadata and
`data.generate` is set, `data.num_images` images are generated there first (`lra_flax.pathfinder_generator`,
the published algorithm with LRA's parameters; `lra-data pathfinder` does the same by hand).

Splits as LRA: the examples in metadata order (batches by number, lines in order), 80% train, 10% valid, 10%
test. Empty image files are skipped, as LRA's pipeline does; a metadata line naming a missing file, a label
other than 0/1, or a PNG that does not decode is an error naming the file (and line).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np
from PIL import Image, UnidentifiedImageError

from lra_flax import generator_record, input_pipeline, pathfinder_generator
from lra_flax.configs.pathfinder import CONFIG_SECTIONS
from lra_flax.input_pipeline import DataFormatError
from lra_flax.tasks.image import PIXEL_VOCAB_SIZE, check_pixel_model
from lra_flax.tasks.spec import DataFlag, TaskSpec
from zoo.training import Task

NUM_CLASSES = 2
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)

Example = tuple[str, Path, int]  # (metadata file:line, image path, label)


def dataset_dir(root: str | os.PathLike, resolution: int, difficulty: str) -> Path:
    """`root/pathfinder<resolution>/<difficulty dir>` (LRA's release layout)."""
    return Path(root) / f"pathfinder{resolution}" / pathfinder_generator.DIFFICULTY_DIRS[difficulty]


def metadata_files(directory: Path) -> list[Path]:
    """`directory/metadata/*.npy` in batch order (numeric names first); empty when there are none."""
    files = (Path(directory) / "metadata").glob("*.npy")
    return sorted(files, key=lambda path: (int(path.stem), "") if path.stem.isdigit() else (1 << 62, path.stem))


def read_metadata(directory: str | os.PathLike) -> list[Example]:
    """Every example the metadata files of one difficulty folder name, in order; empty images skipped."""
    directory = Path(directory)
    files = metadata_files(directory)
    if not files:
        raise FileNotFoundError(f"{directory} has no metadata/*.npy (LRA's Pathfinder release layout)")
    examples = []
    for meta in files:
        try:
            text = meta.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise DataFormatError(f"{meta}: not a text metadata file (LRA's are text lines despite .npy)") from None
        for line_no, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{meta}:{line_no}"
            fields = line.split()
            if len(fields) < 4:
                raise DataFormatError(f"{where}: expected 'imgs/<batch> sample_<i>.png <i> <label> …', got {line!r}")
            image = directory / fields[0] / fields[1]
            if not image.exists():
                raise DataFormatError(f"{where}: names {image}, which does not exist")
            if image.stat().st_size == 0:
                continue  # LRA skips empty images
            examples.append((where, image, input_pipeline.parse_label(fields[3], NUM_CLASSES, where)))
    return examples


# PIL modes of 8 bits per channel: converted to greyscale ("L") as they are. 16- and 32-bit ones are refused.
EIGHT_BIT_MODES = frozenset({"L", "1", "P", "LA", "RGB", "RGBA"})


def read_png(path: Path, resolution: int) -> np.ndarray:
    """An 8-bit greyscale PNG of resolution² pixels as uint8; anything else names the file."""
    try:
        with Image.open(path) as image:
            # Size and depth from the header, before any pixel is decoded (a huge image is refused unread).
            if image.size != (resolution, resolution):
                raise DataFormatError(
                    f"{path}: image is {image.size[1]}×{image.size[0]}, expected {resolution}×{resolution}"
                )
            if image.mode not in EIGHT_BIT_MODES:
                raise DataFormatError(
                    f"{path}: pixel format {image.mode!r} is not 8-bit; Pathfinder images are 8-bit greyscale "
                    "(converting would clip or drop values)"
                )
            image.load()
            pixels = np.asarray(image.convert("L") if image.mode != "L" else image)
    except (OSError, UnidentifiedImageError, SyntaxError, Image.DecompressionBombError) as e:
        raise DataFormatError(f"{path}: not a readable PNG ({e})") from None
    if pixels.shape != (resolution, resolution):
        raise DataFormatError(f"{path}: image is {pixels.shape}, expected {resolution}×{resolution}")
    return pixels


def split_examples(examples: list[Example]) -> dict[str, list[Example]]:
    """LRA's split: first 80% train, next 10% valid, last 10% test."""
    n = len(examples)
    a, b = int(SPLIT_FRACTIONS[0] * n), int((SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1]) * n)
    return {"train": examples[:a], "valid": examples[a:b], "test": examples[b:]}


def _generated_batches(record: dict) -> int:
    """How many metadata files the recorded generation writes (one per batch of images)."""
    return -(-int(record.get("num_images", 0)) // max(1, int(record.get("images_per_batch", 1000))))


def prepare(config: ml_collections.ConfigDict) -> dict[str, Path]:
    """Generates (if asked) and caches the splits as pixel tokens (the loop runs it on process 0 first)."""
    data, resolution = config.data, config.data.resolution
    check_pixel_model(config.model, resolution * resolution)
    directory = dataset_dir(data.dir, resolution, data.difficulty)

    record = generator_record.read(directory)  # None for LRA's release, or any data not generated here
    batches_there = len(metadata_files(directory))  # before any generation (read again after it, below)
    if not batches_there and not data.generate:
        raise FileNotFoundError(
            f"{directory} has no metadata/*.npy: point data.dir at LRA's release (lra_release) or set "
            "data.generate=True"
        )
    if data.generate and (record is not None or not batches_there):
        # Generated here before: the same settings are required, and batches a stopped run left out are written.
        # Never into a folder of images this project did not generate (a release whose metadata went missing).
        if record is None and next((directory / "imgs").rglob("*.png"), None) is not None:
            raise ValueError(
                f"{directory} holds images but no metadata/*.npy and no {generator_record.RECORD}: not data generated "
                "here, and generating would write over its images. Restore its metadata/, or point data.dir at "
                "another folder"
            )
        params = pathfinder_generator.lra_params(resolution, data.difficulty)
        stats = pathfinder_generator.write_dataset(
            directory, params, num_images=data.num_images, seed=data.seed, workers=data.workers or None,
            images_per_batch=record.get("images_per_batch", 1000) if record else 1000,
            remedy="set data.num_images and data.seed to what is there, or point data.dir at a new folder",
        )  # fmt: skip
        if stats["images"]:
            print(f"generated {stats['images']} images at {stats['images_per_s']:.1f} images/s", flush=True)
    elif record is not None and batches_there < (batches := _generated_batches(record)):
        raise ValueError(
            f"{directory} holds {batches_there} of the {batches} batches its generation was asked for (stopped "
            "before the end?): set data.generate=True to finish it"
        )
    splits = split_examples(read_metadata(directory))
    key = (str(directory.resolve()), *metadata_files(directory), resolution, "pixels-v1")
    caches = {}
    for split, examples in splits.items():
        if not examples:
            raise DataFormatError(f"{directory}: the {split} split is empty ({len(splits['train'])} train examples)")

        def rows(examples=examples):
            for _, path, label in examples:
                yield {"inputs": read_png(path, resolution).reshape(-1).astype(np.uint16), "targets": np.int32(label)}

        cache = input_pipeline.cache_path(
            data.cache_dir or data.dir, f"pathfinder{resolution}-{data.difficulty}-{split}", *key
        )
        caches[split] = input_pipeline.cache_examples(cache, rows, f"{directory} {split}")
    return caches


def make_task(config: ml_collections.ConfigDict) -> Task:
    def data_note():
        directory = dataset_dir(config.data.dir, config.data.resolution, config.data.difficulty)
        if (settings := generator_record.read(directory)) is not None:  # written beside metadata/ by the generator
            return f"generated here: {settings['num_images']} images, seed {settings['seed']} (LRA's parameters)"

    return input_pipeline.classification_task(
        config,
        lambda: prepare(config),
        vocab_size=PIXEL_VOCAB_SIZE,
        num_classes=NUM_CLASSES,
        data_note=data_note,
        config_sections=CONFIG_SECTIONS,
    )


def data_files(output_dir: str, flags: Mapping[str, Any]) -> list[Path]:
    """What `lra-data pathfinder` writes in `output_dir`: its resolution's and difficulty's release folder."""
    return [dataset_dir(output_dir, int(flags["resolution"]), flags["difficulty"])]


def write_data(output_dir: str, flags: Mapping[str, Any]) -> dict[str, Path]:
    """`lra-data pathfinder`: images in LRA's release layout (all cores unless flags["workers"] says)."""
    resolution = int(flags["resolution"])
    directory = dataset_dir(output_dir, resolution, flags["difficulty"])
    stats = pathfinder_generator.write_dataset(
        directory,
        pathfinder_generator.lra_params(resolution, flags["difficulty"]),
        num_images=flags["num_images"],
        seed=flags["seed"],
        images_per_batch=flags["images_per_batch"],
        workers=flags["workers"] or None,
    )
    print(f"{stats['images']} images in {stats['seconds']:.1f}s ({stats['images_per_s']:.2f} images/s)")
    return {"images": directory / "imgs", "metadata": directory / "metadata"}


_PATHFINDER = TaskSpec(
    "pathfinder",
    make_task,
    PIXEL_VOCAB_SIZE,
    NUM_CLASSES,
    column=5,
    demo_cut={"steps": 24, "eval_max_batches": 1},
    published={"LRA paper: Transformer": 71.40, "LRA paper: Linear Trans.": 75.30, "LRA paper: Performer": 77.05},
    write_data=write_data,
    data_files=data_files,
    data_flags=(
        DataFlag("resolution", "32", "32 (Pathfinder) or 128 (Path-X).", choices=("32", "128")),
        DataFlag("difficulty", "hard", "contour length 6 / 9 / 14.", choices=tuple(pathfinder_generator.DIFFICULTIES)),
        DataFlag("num_images", 10000, "images to generate."),
        DataFlag("workers", 0, "generator processes (0: all cores)."),
        DataFlag("images_per_batch", 1000, "images per imgs/<batch> folder."),
    ),
)
# Path-X: the same task at 128 × 128 (`lra-data pathfinder --resolution=128` writes it); every model of the LRA
# paper failed it (None: no accuracy above chance).
_PATHX = dataclasses.replace(
    _PATHFINDER, name="pathx", column=6, lra_preset="pathx", demo_preset=None, demo_cut={}, write_data=None,
    data_flags=(), published={"LRA paper: Transformer": None},
)  # fmt: skip
SPECS = (_PATHFINDER, _PATHX)

__all__ = ["dataset_dir", "make_task", "read_metadata", "read_png", "split_examples"]
