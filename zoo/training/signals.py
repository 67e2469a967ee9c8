"""SIGTERM and SIGINT (Ctrl-C) stop a training command within seconds, whatever it is doing.

- In the train loop the signal is a request: the step under way finishes, a checkpoint is saved, and the
  command exits with `PREEMPTED_EXIT_CODE` (the same command resumes).
- Anywhere else (building data, compiling, the final evaluation) there is nothing to save: the command stops
  with `Interrupted` as soon as Python runs again, and exits 128 + the signal's number.
- Either way, a process still running `grace_s` seconds after the signal (a step, a compilation or a native
  call that does not return), or given a second signal, exits at once with 128 + the signal's number; the
  last complete checkpoint stands.

The deadline is kept by a thread woken through `signal.set_wakeup_fd`, so it runs even while the main thread
is inside a native call. Only one-process runs install this: several processes use JAX's preemption sync.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading

import jax

from zoo.training.distributed import Preempted

SIGNALS = (signal.SIGTERM, signal.SIGINT)
DEFAULT_GRACE_S = 30.0


class Interrupted(Exception):
    """A stop signal arrived outside the train loop (nothing to checkpoint there)."""

    def __init__(self, signum: int):
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name} before the command finished; nothing was lost "
                         "(the last checkpoint stands): run the same command to go on")  # fmt: skip


def exit_interrupted(prog: str, error: Interrupted) -> None:
    """Says why the command stops and exits with 128 + the signal's number at once: a normal exit would first wait
    for the XLA computation under way, and the deadline's thread cannot run while the interpreter shuts down."""
    print(f"{prog}: {error}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(error.exit_code)


class StopSignals:
    """Installed once per command (`install`); the loop marks where a request can be honoured (`in_loop`)."""

    def __init__(self, grace_s: float = DEFAULT_GRACE_S):
        self.grace_s = grace_s
        self.signum: int | None = None
        self.in_loop = False
        self._previous: dict[int, object] = {}
        self._wakeup: tuple[socket.socket, socket.socket] | None = None
        self._previous_wakeup_fd = -1
        self._timer: threading.Timer | None = None

    def acknowledge(self) -> None:
        """The loop reached a step boundary after the signal and is saving: the deadline no longer applies."""
        if self._timer is not None:
            self._timer.cancel()

    def install(self) -> bool:
        """Installs the handlers (the main thread only); returns whether it did."""
        if threading.current_thread() is not threading.main_thread() or self._wakeup is not None:
            return False
        self.signum = None
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        read, write = socket.socketpair()
        write.setblocking(False)
        self._wakeup = (read, write)
        self._previous_wakeup_fd = signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(read,), name="stop-signals", daemon=True).start()
        return True

    def uninstall(self) -> None:
        if self._wakeup is None:
            return
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        signal.set_wakeup_fd(self._previous_wakeup_fd)
        self._wakeup[1].close()  # the watcher's recv returns b"" and the thread ends
        self._wakeup = None
        self.acknowledge()
        self.signum, self.in_loop, self._timer = None, False, None

    def _watch(self, read: socket.socket) -> None:
        # Woken by the C-level handler's byte, even while the main thread is in a native call. The byte is
        # written for every signal with a Python handler: only ours start the deadline, and only once.
        while True:
            try:
                data = read.recv(1)
            except OSError:
                return
            if not data:
                return
            if data[0] in SIGNALS and self._timer is None:
                self._timer = threading.Timer(self.grace_s, self._expire, args=(data[0],))
                self._timer.daemon = True
                self._timer.start()

    def _expire(self, signum: int) -> None:
        _exit_now(
            signum,
            f"{signal.Signals(signum).name}: still running {self.grace_s:.0f} s after the signal (a step, a "
            "compilation or a native call that did not return); exiting now, the last complete checkpoint stands",
        )

    def _on_signal(self, signum, _frame) -> None:
        if self.signum is not None:  # the second signal: no more waiting
            _exit_now(
                signum,
                f"{signal.Signals(signum).name} again: exiting now without waiting; the last complete checkpoint "
                "stands (run the same command to go on)",
            )
        self.signum = signum
        name = signal.Signals(signum).name
        if self.in_loop:
            print(f"{name}: stopping after this step with a checkpoint (a second {name} stops at once)", flush=True)
            return
        raise Interrupted(signum)


def _exit_now(signum: int, message: str) -> None:
    """Says why on stderr and exits as a process killed by `signum` does, without unwinding (threads may hang)."""
    print(message, file=sys.stderr, flush=True)
    os._exit(128 + signum)


# The process's one instance: the training command installs it, the loop reads it.
STOP = StopSignals()


class PreemptionWatcher:
    """Tells the loop when to checkpoint and stop: several processes, at JAX's preemption sync point (the same step
    for all); one process, when `STOP` was signalled (installed here for a library caller)."""

    def __init__(self, checkpoint_manager):
        self.manager = checkpoint_manager
        self.single = jax.process_count() == 1
        self.installed_here = self.single and STOP.install()
        if self.single:
            STOP.in_loop = True

    def reached(self, step: int) -> bool:
        if not self.single:
            return self.manager.reached_preemption(step)
        if STOP.signum is not None:
            STOP.acknowledge()
            return True
        return False

    def close(self) -> None:
        if self.single:
            STOP.in_loop = False
        if self.installed_here:
            STOP.uninstall()
            self.installed_here = False


__all__ = ["DEFAULT_GRACE_S", "STOP", "Interrupted", "Preempted", "PreemptionWatcher", "StopSignals"]
