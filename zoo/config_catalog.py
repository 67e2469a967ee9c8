"""Every config section the project declares: what `--help` lists and docs/config.md is generated from
(`python -m zoo.config_catalog lra_flax.configs mt_flax.configs mlm_flax.configs > docs/config.md`)."""

from __future__ import annotations

import sys
from collections.abc import Iterable

from zoo import mixers
from zoo.config_fields import Field, config_file_sections, markdown_table, package_config_modules
from zoo.models.config import MODEL_FIELDS
from zoo.training.config import MESH_FIELDS, TRAIN_FIELDS


def declared_sections() -> dict[str, tuple[Field, ...]]:
    """Every shared section's fields by section name."""
    return {"train": TRAIN_FIELDS, "model": MODEL_FIELDS, "mesh": MESH_FIELDS}


def mixer_sections() -> dict[str, tuple[Field, ...]]:
    """Every mixer's own options (`model.mixer_options.NAME`), declared in its module under zoo/mixers."""
    return {f"model.mixer_options.{name}": mixers.option_fields(name) for name in mixers.names()}


def markdown(task_packages: Iterable[str] = ()) -> str:
    """docs/config.md: the shared sections, every mixer's options, then each config file's own sections from
    `task_packages` (configs packages, such as `lra_flax.configs`)."""
    parts = [
        "# Config fields",
        "",
        "Every task config has the sections `train`, `model` and `mesh` (`--config.SECTION.FIELD=value` on any",
        "training command); each config file adds its own (`data`, and `decode` or `pretrained` where it has",
        "them). The tables are generated from the declarations in `zoo/training/config.py`,",
        "`zoo/models/config.py`, each mixer's module under `zoo/mixers` and each config file",
        "(`python -m zoo.config_catalog lra_flax.configs mt_flax.configs mlm_flax.configs > docs/config.md`); the",
        "same declarations give the defaults, the validation every run does before it writes anything, and",
        "`--help`. A default here is the declaration's: a preset sets some fields otherwise (the config file's",
        "docstring lists its presets). What the mixers compute: [mixers.md](mixers.md); the tasks and their data:",
        "[tasks.md](tasks.md).",
    ]
    for name, fields in declared_sections().items():
        parts += ["", f"## `{name}`", "", markdown_table(fields, name)]
    parts += [
        "",
        "## Mixer options",
        "",
        "Every mixer's options, the inactive mixers' too, are validated by their rules; the mixers a "
        "model runs, and any other whose options were changed, are also built (shapes only) for what "
        "their options must satisfy together.",
    ]
    for name, fields in mixer_sections().items():
        table = markdown_table(fields, name) if fields else "No options of its own."
        parts += ["", f"### `{name}`", "", table]
    files = config_file_sections(*(m for package in task_packages for m in package_config_modules(package)))
    if files:
        parts += ["", "## Each config file's own sections"]
    for path, sections in files.items():
        parts += ["", f"### `{path}`"]
        for name, fields in sections.items():
            parts += ["", markdown_table(fields, name)]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    print(markdown(sys.argv[1:]), end="")
