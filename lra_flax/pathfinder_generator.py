"""The Pathfinder generator (Linsley, Kim et al. 2018; `snakes2.py` as LRA ran it), written anew in numpy.

An image holds two target "snakes" — chains of short paddles whose direction changes smoothly — a few
distractor snakes and many single paddles, and two disk markers. Label 1: both markers sit on the two ends
of one snake; label 0: one marker is on an end of each snake. The algorithm, as published:

- Paddles are drawn as antialiased lines at `antialias_scale` × resolution and Lanczos-downsampled; each
  paddle also leaves an occupancy mask (the line dilated by a disk of radius `margin`) that later paddles
  may not overlap (max of the summed masks < 1.8).
- The two targets are seeded `seed_distance` apart away from the border and grown alternately. A new
  paddle is sampled on the circle of radius `paddle_length + margin` around the pivot one paddle ahead,
  each pixel of that circle weighted (1 − occupancy) · cos(min(|Δθ| · continuity, π/2))².
- Distractor snakes (`distractor_length` paddles) and then single paddles fill the canvas until less than 1%
  of it is free.
- Markers are disks of `marker_radius` drawn the same way. The image is byte-scaled to 0..255.

Every image is a function of (seed, index) alone — `np.random.default_rng([seed, index])` — so any number
of worker processes write the same files. Labels alternate with the index, so every split is balanced.

Output is LRA's release layout (`lra_flax.tasks.pathfinder` reads it): `DIR/imgs/<batch>/sample_<i>.png`
and `DIR/metadata/<batch>.npy`, a text file of lines `imgs/<batch> sample_<i>.png <i> <label> <continuity>
<contour_length> <distractor_length> <paddle_length> <paddle_thickness> <margin> <num_paddle_contrasts>`.
A batch's metadata file is written last, atomically: one that exists names a finished batch, so an
interrupted run resumes by writing only the batches without one.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import multiprocessing
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from lra_flax import generator_record
from zoo.files import atomic_open, atomic_write_bytes

DIFFICULTIES = {"easy": 6, "intermediate": 9, "hard": 14}  # contour length (paddles per target snake)
DIFFICULTY_DIRS = {"easy": "curv_baseline", "intermediate": "curv_contour_length_9", "hard": "curv_contour_length_14"}


@dataclasses.dataclass(frozen=True)
class PathfinderParams:
    """One Pathfinder data set's drawing parameters (names as in `snakes2.py`)."""

    window_size: int
    contour_length: int
    distractor_length: int
    num_distractor_snakes: int
    paddle_length: int
    paddle_thickness: float
    paddle_margins: tuple[int, ...]  # one drawn per image
    seed_distance: int
    marker_radius: float
    continuity: float
    snake_contrasts: tuple[float, ...]  # one drawn per target snake
    paddle_contrasts: tuple[float, ...] = (1.0,)  # one drawn per paddle
    padding: int = 1
    antialias_scale: int = 2
    single_paddles: bool = False  # snakes2_wrapper.py sets use_single_paddles = False, and LRA kept it
    max_distractor_retrials: int = 4
    max_paddle_retrials: int = 2


# Per resolution: what LRA's generator scripts set (the distractor count is this number // distractor length).
_LRA_RESOLUTIONS = {
    32: dict(
        distractor_budget=20, paddle_length=2, paddle_thickness=0.5, paddle_margins=(1,), seed_distance=7,
        marker_radius=1.5, continuity=1.0, snake_contrasts=(2.0,), paddle_contrasts=(0.75,),
    ),
    128: dict(
        distractor_budget=35, paddle_length=5, paddle_thickness=1.5, paddle_margins=(2, 3), seed_distance=20,
        marker_radius=3.0, continuity=1.8, snake_contrasts=(0.9,), paddle_contrasts=(1.0,),
    ),
}  # fmt: skip


def lra_params(resolution: int, difficulty: str = "hard") -> PathfinderParams:
    """The parameters of LRA's pathfinder32 and pathfinder128 (Path-X) data, at an LRA difficulty."""
    if resolution not in _LRA_RESOLUTIONS:
        raise ValueError(f"resolution={resolution}: LRA's Pathfinder is 32 (pathfinder32) or 128 (Path-X)")
    fields = dict(_LRA_RESOLUTIONS[resolution])
    contour = DIFFICULTIES[difficulty]
    distractor = contour // 3
    return PathfinderParams(
        window_size=resolution,
        contour_length=contour,
        distractor_length=distractor,
        num_distractor_snakes=fields.pop("distractor_budget") // distractor,
        **fields,
    )


def bytescale(image: np.ndarray) -> np.ndarray:
    """min..max → 0..255 uint8 (scipy.misc's bytescale, which both imresize and imsave applied)."""
    image = np.asarray(image, np.float64)
    low, high = image.min(), image.max()
    scale = 255.0 / (high - low) if high > low else 1.0
    return np.clip((image - low) * scale + 0.5, 0, 255).astype(np.uint8)


def lanczos_resize(image: np.ndarray, size: int) -> np.ndarray:
    """Byte-scaled then Lanczos-resized to size × size, uint8 (scipy.misc.imresize, which LRA's data used)."""
    return np.asarray(Image.fromarray(bytescale(image)).resize((size, size), Image.Resampling.LANCZOS))


def disk(radius: float) -> np.ndarray:
    """A (2r+1)² boolean disk, the dilation element of a margin."""
    r = math.ceil(radius)
    y, x = np.ogrid[-r : r + 1, -r : r + 1]
    return x**2 + y**2 <= radius**2


def dilate(image: np.ndarray, footprint: np.ndarray) -> np.ndarray:
    """Grey dilation: out[p] = max of image[p + k − centre] over the footprint's true k (OpenCV's convention)."""
    footprint = np.asarray(footprint, bool)
    if not footprint.any():  # an element too thin to survive the cut to whole pixels dilates by nothing
        return np.asarray(image, np.float64).copy()
    from scipy import ndimage  # here, not at the top: every lra-train process imports this module; scipy takes 0.4 s

    return ndimage.maximum_filter(np.asarray(image, np.float64), footprint=footprint, mode="constant", cval=0.0)


def translate(coord: Sequence[float], angle: float, distance: float) -> list[int]:
    """(y, x) moved `distance` along `angle`, rounded up to whole pixels."""
    return [int(np.ceil(coord[0] + distance * np.sin(angle))), int(np.ceil(coord[1] + distance * np.cos(angle)))]


def flip(angle: float) -> float:
    return angle + np.pi if angle < 0 else angle - np.pi


def random_angle(rng: np.random.Generator) -> float:
    """A whole number of degrees in [−180, 180), in radians."""
    return int(rng.integers(-180, 180)) * np.pi / 180


@functools.lru_cache(maxsize=65536)
def _paddle_window(angle: float, params: PathfinderParams, margin: int) -> tuple[np.ndarray, np.ndarray]:
    """A paddle from the centre of a (2·half+1)² window: (intensity, occupancy mask), both 0..1.

    Cached: seeds turn by whole degrees and extensions point at whole pixels, so few angles recur.
    """
    aa, length = params.antialias_scale, params.paddle_length
    half = length + math.ceil(params.paddle_thickness) + margin
    blown_size, blown_centre = 2 * half * aa + 1, half * aa
    head = translate([blown_centre, blown_centre], angle, length * aa)
    blown = Image.new("F", (blown_size, blown_size), 0.0)
    ImageDraw.Draw(blown).line(
        [(blown_centre, blown_centre), (head[1], head[0])], fill=255.0, width=round(params.paddle_thickness * aa)
    )
    blown = np.asarray(blown)
    size = 2 * half + 1
    line = lanczos_resize(blown, size).astype(np.float32) / 255.0
    mask = lanczos_resize(dilate(blown, disk(margin * aa)).astype(np.uint8), size).astype(np.float32) / 255.0
    line.flags.writeable = mask.flags.writeable = False
    return line, mask


def draw_paddle(
    shape: tuple[int, int],
    start: Sequence[int],
    angle: float,
    params: PathfinderParams,
    margin: int,
    contrast: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """A paddle from `start` along `angle` on a zero canvas: (intensity × contrast, occupancy mask in 0..1)."""
    line, mask = _paddle_window(float(angle), params, margin)
    half = line.shape[0] // 2
    # Paste the window centred on `start`, clipped at the canvas border.
    line_canvas, mask_canvas = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    top, left = start[0] - half, start[1] - half
    y0, y1 = max(top, 0), min(start[0] + half, shape[0] - 1)
    x0, x1 = max(left, 0), min(start[1] + half, shape[1] - 1)
    if y0 <= y1 and x0 <= x1:
        window = (slice(y0 - top, y1 - top + 1), slice(x0 - left, x1 - left + 1))
        line_canvas[y0 : y1 + 1, x0 : x1 + 1] = line[window] * np.float32(contrast)
        mask_canvas[y0 : y1 + 1, x0 : x1 + 1] = mask[window]
    return line_canvas, mask_canvas


def draw_disk(shape: tuple[int, int], centre: Sequence[int], radius: float, aa: int) -> np.ndarray:
    """A marker: a disk drawn at aa × resolution and Lanczos-downsampled, 0..1."""
    y, x = np.ogrid[-centre[0] * aa : (shape[0] - centre[0]) * aa, -centre[1] * aa : (shape[1] - centre[1]) * aa]
    blown = (x**2 + y**2 <= (radius * aa) ** 2).astype(np.float32)
    return np.asarray(Image.fromarray(bytescale(blown)).resize(shape[::-1], Image.Resampling.LANCZOS)) / 255.0


def with_border(mask: np.ndarray, width: int) -> np.ndarray:
    """A copy of `mask` with its outer `width` pixels set to 1 (taken)."""
    out = mask.copy()
    out[:width], out[-width:], out[:, :width], out[:, -width:] = 1, 1, 1, 1
    return out


def free_pixels(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) where a mask is below 0.3 (a pixel counts as taken from 0.3 up)."""
    return np.nonzero(np.ceil(mask - 0.3) == 0)


@dataclasses.dataclass
class Snake:
    """A growing snake: the pivot for its next paddle, its direction, and its last paddle's mask."""

    pivot: list[int]
    angle: float
    last_mask: np.ndarray
    image: np.ndarray
    tip: list[int]  # the free end of the first paddle (where a marker may go)
    end: list[int] | None = None  # the head of the last paddle


@functools.lru_cache(maxsize=64)
def _common_element(params: PathfinderParams, margin: int) -> np.ndarray:
    """The pixels every seed element has, whatever its angle (for `no_room`)."""
    elements = [_seed_element(deg * np.pi / 180, params, margin) for deg in range(-180, 180)]
    common = np.logical_and.reduce(elements)
    common.flags.writeable = False
    return common


def _seed_element(angle: float, params: PathfinderParams, margin: int) -> np.ndarray:
    """Where a paddle seeded at the window's centre-plus-one along `angle` would sit (full-mask pixels)."""
    half = params.paddle_length + margin
    _, element = draw_paddle((2 * half + 1,) * 2, [half + 1] * 2, angle, params, margin)
    return element >= 1.0


@functools.lru_cache(maxsize=4096)
def _blind_seed_angle(angle: float, params: PathfinderParams, margin: int) -> bool:
    """True when a seed element at `angle` leaves canvas pixels that read only outside the image.

    OpenCV's dilation gives such pixels −FLT_MAX, and the published code then reports no free pixel at all
    (`find_available_coordinates` returns none when the minimum is negative): a seed at such an angle always
    fails. This happens for elements that miss their own anchor, i.e. for most seed directions; LRA's data
    carries that bias in where snakes start, so this generator keeps it (it depends on the angle only).
    """
    shape = (params.window_size, params.window_size)
    element = _seed_element(angle, params, margin)
    from scipy import ndimage  # as in `dilate`

    reach = ndimage.maximum_filter(np.zeros(shape), footprint=element, mode="constant", cval=-np.inf)
    return bool(element.any()) and bool(np.min(reach) < 0)


def no_room(mask: np.ndarray, params: PathfinderParams, margin: int, border: int) -> bool:
    """True when no seed can be placed now or later (the mask only grows): a shortcut past futile attempts.

    A seed at angle θ needs a free pixel after dilating by its element E_θ ⊇ ∩θ E_θ, so no free pixel
    after dilating by the intersection means none for any θ.
    """
    if len(free_pixels(mask)[0]) / mask.size < 0.01:
        return True
    return len(free_pixels(dilate(with_border(mask, border), _common_element(params, margin)))[0]) == 0


def _pick(rng: np.random.Generator, values: Sequence[float]) -> float:
    return values[int(rng.integers(len(values)))] if len(values) > 1 else values[0]


def seed_paddle(
    rng: np.random.Generator,
    canvas: np.ndarray,
    mask: np.ndarray,
    params: PathfinderParams,
    margin: int,
    contrast: float,
    *,
    border: int,
    stop_below: float | None = None,
) -> Snake | None:
    """A first paddle on a free spot at least `border` pixels inside; None when there is no room."""
    length, shape = params.paddle_length, mask.shape
    if stop_below is not None and len(free_pixels(mask)[0]) / mask.size < stop_below:
        return None  # the canvas is full
    bordered = with_border(mask, border)
    for _ in range(params.max_paddle_retrials + 1):
        angle = random_angle(rng)
        if _blind_seed_angle(angle, params, margin):
            return None
        # Where a paddle's tail may go: free pixels after dilating the taken ones by the paddle's own mask.
        rows, cols = free_pixels(dilate(bordered, _seed_element(angle, params, margin)))
        if len(rows) == 0:
            return None
        pick = int(rng.integers(len(rows)))
        tail = [int(rows[pick]), int(cols[pick])]
        head = translate(tail, angle, length)
        pivot = translate(head, flip(angle), length + margin)
        if all(0 <= c < s for c, s in zip(head + pivot, shape + shape, strict=True)):
            break
    else:
        return None
    line, paddle_mask = draw_paddle(shape, tail, angle, params, margin, contrast)
    return Snake(pivot=pivot, angle=angle, last_mask=paddle_mask, image=np.maximum(canvas, line), tip=tail)


@functools.lru_cache(maxsize=64)
def _circle_offsets(radius: int) -> np.ndarray:
    """Whole-pixel offsets of the circle of `radius`, sampled one pixel of arc apart, unique, sorted (y, x)."""
    step = 360.0 / (2 * radius * np.pi)
    theta = np.arange(0, 360, step) * np.pi / 180
    # The published code truncates pivot + offset; for the in-canvas (non-negative) points that is
    # pivot + floor(offset), so the offsets can be computed once.
    offsets = np.unique(np.floor(np.stack([radius * np.sin(theta), radius * np.cos(theta)], axis=1)), axis=0)
    offsets = offsets.astype(int)
    offsets.flags.writeable = False
    return offsets


@functools.lru_cache(maxsize=64)
def _disk_offsets(radius: int) -> np.ndarray:
    offsets = np.argwhere(disk(radius)) - radius
    offsets.flags.writeable = False
    return offsets


def dilated_at(mask: np.ndarray, coords: np.ndarray, radius: int) -> np.ndarray:
    """`dilate(mask, disk(radius))` read at `coords` only (the same values, without dilating everything)."""
    points = coords[:, None, :] + _disk_offsets(radius)[None]
    inside = (points >= 0).all(-1) & (points[..., 0] < mask.shape[0]) & (points[..., 1] < mask.shape[1])
    values = mask[np.clip(points[..., 0], 0, mask.shape[0] - 1), np.clip(points[..., 1], 0, mask.shape[1] - 1)]
    return np.where(inside, values, 0.0).max(axis=1)


def next_paddle_candidates(
    pivot: Sequence[int], angle: float, radius: int, mask: np.ndarray, margin: int, continuity: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Pixels on the circle of `radius` around `pivot`, their directions and cumulative sampling weights.

    A pixel's weight is (1 − the mask dilated by a disk of `margin`) · cos(min(|turn| · continuity, π/2))².
    """
    coords = np.asarray(pivot) + _circle_offsets(radius)
    inside = (coords >= 0).all(axis=1) & (coords[:, 0] < mask.shape[0]) & (coords[:, 1] < mask.shape[1])
    coords = coords[inside]
    if len(coords) == 0:
        return None
    offsets = coords - np.asarray(pivot)
    directions = np.arctan2(offsets[:, 0], offsets[:, 1])
    turn = np.abs(directions - angle)
    turn = np.minimum(np.minimum(turn, 2 * np.pi - turn) * continuity, 0.5 * np.pi)
    weights = (1 - dilated_at(mask, coords, margin)) * np.maximum(np.cos(turn), 0) ** 2
    total = weights.sum()
    if total < 1e-4:
        return None
    return coords, directions, np.cumsum(weights / total)


def extend(
    rng: np.random.Generator,
    snake: Snake,
    mask: np.ndarray,
    params: PathfinderParams,
    margin: int,
    contrast: float,
) -> tuple[Snake, np.ndarray] | None:
    """The snake one paddle longer and the mask with its previous paddle added; None at a dead end."""
    length = params.paddle_length
    pivot = translate(snake.pivot, snake.angle, length + 2 * margin)
    candidates = next_paddle_candidates(pivot, snake.angle, length + margin, mask, margin, params.continuity)
    if candidates is None:
        return None
    coords, directions, cmf = candidates
    for _ in range(params.max_paddle_retrials + 1):
        index = int(np.argmax(cmf - rng.random() > 0))
        head, angle = [int(c) for c in coords[index]], float(directions[index])
        line, paddle_mask = draw_paddle(mask.shape, head, flip(angle), params, margin, contrast)
        if np.max(mask + paddle_mask) < 1.8:  # no overlap with what is drawn
            grown = Snake(pivot, angle, paddle_mask, np.maximum(snake.image, line), snake.tip, end=head)
            return grown, np.maximum(mask, snake.last_mask)
    return None


def two_targets(
    rng: np.random.Generator, params: PathfinderParams, margin: int
) -> tuple[list[Snake], np.ndarray] | None:
    """The two target snakes grown alternately from seeds `seed_distance` apart, and the occupancy mask."""
    size, pad = params.window_size, params.padding
    shape = (size, size)
    contrasts = list(params.snake_contrasts) * 2
    rng.shuffle(contrasts)
    mask = with_border(np.zeros(shape, np.float32), pad)
    blank = np.zeros(shape, np.float32)

    contrast = _pick(rng, params.paddle_contrasts) * contrasts[0]
    # The first target's tail at least 2 × seed_distance from the border.
    first = seed_paddle(rng, blank, mask, params, margin, contrast, border=2 * params.seed_distance)
    if first is None:
        return None
    contrast = _pick(rng, params.paddle_contrasts) * contrasts[1]
    for _ in range(params.max_paddle_retrials + 1):
        angle = random_angle(rng)
        around = int(rng.integers(0, 360)) * np.pi / 180
        tail = [
            int(np.round(first.tip[0] + params.seed_distance * np.sin(around))),
            int(np.round(first.tip[1] + params.seed_distance * np.cos(around))),
        ]
        head = translate(tail, angle, params.paddle_length)
        pivot = translate(head, flip(angle), params.paddle_length + margin)
        if all(0 <= c < size for c in head + pivot):
            break
    else:
        return None
    line, paddle_mask = draw_paddle(shape, tail, angle, params, margin, contrast)
    snakes = [first, Snake(pivot=pivot, angle=angle, last_mask=paddle_mask, image=np.maximum(blank, line), tip=tail)]

    for _ in range(params.contour_length - 1):
        contrast = _pick(rng, params.paddle_contrasts)
        for i in range(2):
            grown = extend(rng, snakes[i], mask, params, margin, contrast * contrasts[i])
            if grown is None:
                return None
            snakes[i], mask = grown
    return snakes, np.maximum(mask, snakes[-1].last_mask)


def add_snakes(
    rng: np.random.Generator,
    image: np.ndarray,
    mask: np.ndarray,
    params: PathfinderParams,
    margin: int,
    *,
    count: int,
    num_paddles: int,
    retrials: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Up to `count` more snakes of `num_paddles` paddles; a snake that finds no room is skipped."""
    for _ in range(count):
        if no_room(mask, params, margin, border=1):
            break  # every further attempt would fail: the published generator tried them all, to no effect
        for _ in range(retrials + 1):
            contrast = _pick(rng, params.snake_contrasts)
            snake = seed_paddle(rng, image, mask, params, margin, contrast, border=1, stop_below=0.01)
            snake_mask = mask
            for _ in range(num_paddles - 1):
                if snake is None:
                    break
                grown = extend(rng, snake, snake_mask, params, margin, _pick(rng, params.snake_contrasts))
                snake, snake_mask = grown if grown is not None else (None, snake_mask)
            if snake is not None:
                image, mask = snake.image, np.maximum(snake_mask, snake.last_mask)
                break
    return image, mask


@dataclasses.dataclass(frozen=True)
class Sample:
    image: np.ndarray  # [size, size] uint8
    label: int  # 1: the markers are on one snake
    margin: int
    markers: tuple[tuple[int, int], tuple[int, int]]  # (y, x) of the two markers
    target_pixels: tuple[np.ndarray, np.ndarray]  # each target snake's drawn intensity (for checks and figures)


def generate_image(params: PathfinderParams, seed: int, index: int) -> Sample:
    """Image `index` of the data set with `seed`: a function of (params, seed, index) alone."""
    rng = np.random.default_rng([seed, index])
    label = index % 2
    margin = int(_pick(rng, params.paddle_margins))
    total_paddles = int(150 / ((7.5 + 13 * margin + 4 * margin * margin) / 123.5))
    for _ in range(100_000):  # the published generator retries until the targets fit (at 32 px ~1 in 300 does)
        if (targets := two_targets(rng, params, margin)) is not None:
            break
    else:
        raise RuntimeError(f"pathfinder image {index}: no room for two target snakes in 100,000 tries with {params}")
    snakes, mask = targets
    image = np.maximum(snakes[0].image, snakes[1].image)
    image, mask = add_snakes(
        rng,
        image,
        mask,
        params,
        margin,
        count=params.num_distractor_snakes,
        num_paddles=params.distractor_length,
        retrials=params.max_distractor_retrials,
    )
    if params.single_paddles:
        count = total_paddles - 2 * params.contour_length - params.num_distractor_snakes * params.distractor_length
        image, _ = add_snakes(
            rng, image, mask, params, margin, count=count, num_paddles=1, retrials=params.max_paddle_retrials
        )
    origin = int(rng.integers(0, 2))
    other = origin if label == 1 else 1 - origin
    start, end = snakes[origin].tip, snakes[other].end
    shape = image.shape
    markers = np.maximum(
        draw_disk(shape, start, params.marker_radius, params.antialias_scale),
        draw_disk(shape, end, params.marker_radius, params.antialias_scale),
    )
    return Sample(
        image=bytescale(np.maximum(image, markers)),
        label=label,
        margin=margin,
        markers=(tuple(start), tuple(end)),
        target_pixels=(snakes[0].image, snakes[1].image),
    )


def write_batch(output_dir: str, params: PathfinderParams, seed: int, batch: int, start: int, count: int) -> int:
    """Images start..start+count−1 as batch `batch`; its metadata file last (atomically). Returns count."""
    out = Path(output_dir)
    lines = []
    for i in range(count):
        sample = generate_image(params, seed, start + i)
        path = out / "imgs" / str(batch) / f"sample_{i}.png"
        with atomic_open(path, "wb") as f:
            Image.fromarray(sample.image, mode="L").save(f, format="PNG")
        lines.append(
            f"imgs/{batch} sample_{i}.png {i} {sample.label} {params.continuity} {params.contour_length} "
            f"{params.distractor_length} {params.paddle_length} {params.paddle_thickness} {sample.margin} "
            f"{len(params.paddle_contrasts)}"
        )
    metadata = out / "metadata" / f"{batch}.npy"
    atomic_write_bytes(metadata, ("\n".join(lines) + "\n").encode())
    return count


def _write_batch_star(args) -> int:
    return write_batch(*args)


def write_dataset(
    output_dir: str | os.PathLike,
    params: PathfinderParams,
    *,
    num_images: int,
    seed: int = 0,
    images_per_batch: int = 1000,
    workers: int | None = None,
    progress: bool = True,
    remedy: str = "use a new output_dir or delete it",
) -> dict[str, float]:
    """`num_images` images in LRA's layout under `output_dir`, over `workers` processes (default: all cores).

    Batches whose metadata file exists are kept (so a stopped run resumes). Returns images written and images/s.
    A folder generated with other settings is refused (`remedy` says what to do).
    """
    from zoo.progress import WorkProgress

    if num_images < 1 or images_per_batch < 1:
        raise ValueError(f"num_images={num_images} and images_per_batch={images_per_batch} must be positive")
    out = Path(output_dir)
    (out / "metadata").mkdir(parents=True, exist_ok=True)
    settings = {"generator": "lra_flax.pathfinder_generator", "seed": seed, "num_images": num_images}
    settings["images_per_batch"] = images_per_batch
    settings["params"] = dataclasses.asdict(params)
    generator_record.check(out, settings, where=str(out), what="images", named="settings", remedy=remedy)
    generator_record.write(out, settings)
    jobs = []
    for batch, start in enumerate(range(0, num_images, images_per_batch)):
        if not (out / "metadata" / f"{batch}.npy").exists():
            jobs.append((str(out), params, seed, batch, start, min(images_per_batch, num_images - start)))
    total = sum(job[-1] for job in jobs)
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs) or 1))
    begin = time.perf_counter()
    bar = WorkProgress(f"pathfinder{params.window_size}", total=total, unit="img") if progress else None
    update = bar.update if bar is not None else lambda n: None
    if workers == 1:
        for job in jobs:
            update(write_batch(*job))
    else:
        # fork would copy the parent's JAX threads; spawn starts clean interpreters.
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            for done in pool.imap_unordered(_write_batch_star, jobs):
                update(done)
    if bar is not None:
        bar.close()
    seconds = time.perf_counter() - begin
    return {"images": total, "seconds": seconds, "images_per_s": total / max(seconds, 1e-9)}


__all__ = [
    "DIFFICULTIES",
    "DIFFICULTY_DIRS",
    "PathfinderParams",
    "Sample",
    "generate_image",
    "lra_params",
    "write_dataset",
]
