"""A figure of generated Pathfinder (32×32) and Path-X (128×128) images, positives beside negatives.

    python -m lra_flax.pathfinder_figure --output=benchmarks/pathfinder/examples.png

People judge a generator by looking at it: label 1 means the two disks sit on the two ends of one
dashed contour, label 0 that each sits on a different contour.
"""

from __future__ import annotations

from pathlib import Path

from absl import app, flags

from lra_flax import pathfinder_generator as gen
from zoo.plots import pyplot, save_figure
from zoo.training import cli

_OUTPUT = flags.DEFINE_string("output", "benchmarks/pathfinder/examples.png", "Where to write the PNG.")
_PER_LABEL = flags.DEFINE_integer("per_label", 3, "Images of each label per resolution.")
_SEED = flags.DEFINE_integer("seed", 0, "Generator seed.")


def draw(output: str | Path, *, per_label: int = 3, seed: int = 0, resolutions: tuple[int, ...] = (32, 128)) -> Path:
    plt = pyplot()
    rows = [(resolution, label) for resolution in resolutions for label in (1, 0)]
    fig, axes = plt.subplots(len(rows), per_label, figsize=(2.2 * per_label, 2.3 * len(rows)), squeeze=False)
    for row, (resolution, label) in enumerate(rows):
        params = gen.lra_params(resolution, "hard")
        # Labels alternate with the index: index 2k + label has that label.
        for col in range(per_label):
            sample = gen.generate_image(params, seed, 2 * col + label)
            ax = axes[row, col]
            ax.imshow(sample.image, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if col == 0:
                name = "Pathfinder 32×32" if resolution == 32 else "Path-X 128×128"
                ax.set_ylabel(f"{name}\n{'joined (1)' if label else 'not joined (0)'}", fontsize=9)
    fig.suptitle(f"Generated Pathfinder images, LRA's 'hard' parameters (contour length 14), seed {seed}", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, output)


def main(argv: list[str]) -> None:
    del argv
    print(draw(_OUTPUT.value, per_label=_PER_LABEL.value, seed=_SEED.value))


if __name__ == "__main__":
    cli.before_parsing(main, "pathfinder_figure")
    app.run(main, flags_parser=cli.flags_parser("pathfinder_figure"))
