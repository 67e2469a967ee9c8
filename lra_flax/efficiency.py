"""One efficiency measurement of `lra-compare`: steps/s and peak memory of an LRA config at one length.

    python -m lra_flax.efficiency --config=lra_flax/configs/text.py:lra_code --config.model.max_length=4000 \\
        --config.model.mixer=linear --steps=3 --output=out.json [--profile_dir=runs/profile]

`--profile_dir` adds where a step's time goes by kind of operation (matmul, layout copies, random bits,
reductions, elementwise; `zoo.training.step_profile`).

Runs in its own process (lra-compare starts one per entry) so that running out of memory ends this
process, not the sweep: lra-compare then records the entry as "out of memory".
"""

from __future__ import annotations

import json

import jax
from absl import app, flags

from lra_flax import main as lra_main
from lra_flax.tasks import TASK_MODULES, make_task
from zoo.files import atomic_write_bytes
from zoo.mixers.softmax import run_softmax_path
from zoo.training import cli, step_profile, throughput
from zoo.training.config import check_output_file

_CONFIG = cli.define_config_flag("Task config file with a preset after ':'.")
_STEPS = flags.DEFINE_integer("steps", 3, "Timed train steps (after compilation and warm-up).", lower_bound=1)
_WARMUP = flags.DEFINE_integer("warmup", 1, "Untimed steps after compilation.", lower_bound=0)
_OUTPUT = flags.DEFINE_string("output", None, "Where to write the JSON result (also printed).")
_PROFILE_DIR = flags.DEFINE_string(
    "profile_dir", None, "Also trace two steps with the JAX profiler here and report time per kind of operation."
)
flags.mark_flags_as_required(["config"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _OUTPUT.value:
        check_output_file(_OUTPUT.value, "--output")
    config = _CONFIG.value
    problem = cli.foreign_config_problem(config, lra_main.config_files(), "lra-efficiency", what=lra_main.CONFIG_KIND)
    if problem is not None:
        raise app.UsageError(problem)
    task = make_task(config)
    # the synthetic batch draws ids and labels from the task's own vocabulary and classes
    spec = TASK_MODULES[config.task].SPECS[0]
    result = throughput.measure(
        config, task, vocab_size=spec.vocab_size, num_classes=spec.num_classes, steps=_STEPS.value,
        warmup=_WARMUP.value, profile_dir=_PROFILE_DIR.value,
    )  # fmt: skip
    result.update(
        mixer=config.model.mixer,
        length=config.model.max_length,
        batch_size=config.train.batch_size,
        steps=_STEPS.value,
        device=str(jax.devices()[0].device_kind),
    )
    if (path := run_softmax_path(config)) is not None:
        result["softmax_attention"] = path
    text = json.dumps(result, indent=1, sort_keys=True)
    print(text)
    if "op_breakdown" in result:
        print(step_profile.format_breakdown(result["op_breakdown"]))
    if _OUTPUT.value:
        atomic_write_bytes(_OUTPUT.value, (text + "\n").encode())


def run() -> None:
    cli.run(main, "lra-efficiency")


if __name__ == "__main__":
    run()
