"""`lra-train`: train and evaluate an LRA task.

    lra-train --config=lra_flax/configs/listops.py:demo --workdir=runs/listops-demo [--config.model.mixer=softmax]

Re-running the same command on the same workdir resumes from its last checkpoint.
"""

from __future__ import annotations

from lra_flax.tasks import make_task
from zoo import config_fields
from zoo.training import cli

# The task configs (lra_flax/configs/<task>.py, not the sweep's compare.py): what lra-train and the efficiency
# measurement take.
CONFIG_KIND = "an LRA task config (lra_flax/configs/<task>.py)"


def config_files() -> dict[str, config_fields.Sections]:
    return config_fields.config_file_sections(*config_fields.package_config_modules("lra_flax.configs"))


def run() -> None:
    cli.task_main(make_task, "lra-train", __name__, config_files(), config_kind=CONFIG_KIND)


if __name__ == "__main__":
    run()
