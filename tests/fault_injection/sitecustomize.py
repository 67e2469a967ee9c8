"""Run at start-up by subprocesses whose PYTHONPATH starts here (see `env` in __init__.py)."""

import os
import signal

_FAULT = os.environ.get("ZOO_FAULT")


def _install(kind: str, value: str) -> None:
    from zoo.training import loop

    def hook(event: "loop.LoopEvent") -> None:
        if kind == "kill_after_step" and event.split is None and event.step == int(value):
            event.wait_for_checkpoints()  # a crash after a completed save, as a test expects
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "sigterm_after_step" and event.split is None and event.step == int(value):
            os.kill(os.getpid(), signal.SIGTERM)
        elif kind == "kill_after_final_eval" and event.split == value:
            os.kill(os.getpid(), signal.SIGKILL)

    loop.EVENT_HOOKS.append(hook)


if _FAULT:
    _install(*_FAULT.split("=", 1))
