"""Fault injection for training subprocesses: a crash or a preemption notice at a chosen point of the loop.

`env(kill_after_step=6)` is the environment to add to a training command's: its directory goes first on
PYTHONPATH, so the subprocess's Python runs this directory's `sitecustomize.py`, which adds a hook to
`zoo.training.loop.EVENT_HOOKS`. Production code has no knowledge of any of this.
"""

import os
from pathlib import Path

FAULT_VARIABLE = "ZOO_FAULT"
KINDS = ("kill_after_step", "sigterm_after_step", "kill_after_final_eval")


def env(**fault: int | str) -> dict[str, str]:
    """The environment entries that inject one fault, e.g. `env(kill_after_step=6)` or
    `env(kill_after_final_eval="valid")`."""
    ((kind, value),) = fault.items()
    if kind not in KINDS:
        raise ValueError(f"unknown fault {kind!r}; valid: {', '.join(KINDS)}")
    path = os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, FAULT_VARIABLE: f"{kind}={value}"}
