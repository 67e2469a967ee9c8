"""Commands the tests start (`python -m MODULE ...`), forked from a process that has imported their libraries once.

Each command the suite starts spends ~1.4 s of its start importing jax, flax, orbax, grain and optax before it
reads a flag. `run` is `subprocess.run` for such commands: a server per pytest worker (`python -m tests.commands`)
imports those libraries once — none of this project's packages, so each command imports its own code afresh —
and forks a child per command. The child takes the command's working directory, environment, argv and standard
streams, runs the module as `python -m` does, and exits through the interpreter's normal exit (atexit handlers,
flushed streams), its status returned to the caller.

The fork is used only where the command cannot tell it from a fresh interpreter: a command of this Python's `-m`
form whose environment differs from the server's only in variables read after start-up (`LATE_VARIABLES`, ZOO_*; a
`JAX_*` variable, PYTHONPATH or GLIBC_TUNABLES is read at start-up, so they start a real process), its output
captured or sent to a file, no input. The child gets an empty `__main__`, none of the server's modules, the
command's `sys.orig_argv` and a freshly seeded numpy. What it shares with the server's start: the hash seed (set
PYTHONHASHSEED to get a real process), the process's umask and limits, and the frames above the module in a
traceback. Everything else, and everything when the server cannot start or its imports print anything (a fresh
process would print that too), goes to `subprocess.run`.
"""

from __future__ import annotations

import atexit
import builtins
import json
import locale
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import types
from pathlib import Path

REPO = Path(__file__).parents[1]
# What the server imports: the libraries every command imports, and none of this project's modules.
PRELOADED = ("numpy", "jax", "jax.numpy", "flax.nnx", "optax", "orbax.checkpoint", "grain", "ml_collections",
             "absl.app", "absl.flags", "tensorboardX")  # fmt: skip
# Environment variables read when they are used, after start-up and the preloaded imports: a command may set them.
# XLA reads its flags when the first backend starts; ZOO_* are this project's, read by its own modules.
LATE_VARIABLES = ("XLA_FLAGS", "PYTEST_CURRENT_TEST")
LATE_PREFIX = "ZOO_"
DISABLE = "ZOO_TESTS_NO_FORK"  # set (to anything) to start every command as a real process

_server: dict = {}  # this process's server: its process and socket path, or "failed"


# ---------------------------------------------------------------------------------------------------------------
# The client: `run`
# ---------------------------------------------------------------------------------------------------------------


def run(args, *, capture_output=False, stdout=None, stderr=None, text=False, timeout=None, env=None, cwd=None,
        check=False, **other):  # fmt: skip
    """`subprocess.run`, forked from the server where that cannot differ from a real process (module docstring).
    Output is captured (`capture_output`) or goes to a file (`stdout` a file, `stderr` one or `subprocess.STDOUT`)."""
    environment = dict(os.environ if env is None else env)
    to_file = hasattr(stdout, "fileno") and (stderr == subprocess.STDOUT or hasattr(stderr, "fileno"))
    forkable = (
        (capture_output or to_file) and not other and len(args) >= 3 and args[0] == sys.executable and args[1] == "-m"
    )
    directory = os.path.abspath(cwd if cwd is not None else os.getcwd())
    server = _start_server() if forkable and os.path.isdir(directory) else None
    if server is not None and not _same_start_up(environment, server["env"]):
        server = None
    request = {"argv": [str(a) for a in args[2:]], "env": environment, "cwd": directory}
    try:
        if server is None:
            raise _NotForked
        if capture_output:
            with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
                status = _forked(server, request, out.fileno(), err.fileno(), args, timeout, (out, err))
                completed = subprocess.CompletedProcess(args, status, _read(out, text), _read(err, text))
        else:
            err = stdout if stderr == subprocess.STDOUT else stderr
            stdout.flush()
            err.flush()
            status = _forked(server, request, stdout.fileno(), err.fileno(), args, timeout)
            completed = subprocess.CompletedProcess(args, status)
    except _NotForked:
        return _subprocess_run(
            args, capture_output=capture_output, stdout=stdout, stderr=stderr, text=text, timeout=timeout, env=env,
            cwd=cwd, check=check, **other,
        )  # fmt: skip
    if check:
        completed.check_returncode()
    return completed


class _NotForked(Exception):
    """The command was not started by the server: it runs as a real process instead."""


def subprocess_module() -> types.SimpleNamespace:
    """The `subprocess` module with `run` replaced by this one, for code under test that starts `python -m`
    commands itself: `monkeypatch.setattr(module, "subprocess", commands.subprocess_module())`."""
    return types.SimpleNamespace(**{**vars(subprocess), "run": run})


_subprocess_run = subprocess.run  # where a test replaces subprocess.run with `run`, the fallback is still the real one


def _same_start_up(environment: dict[str, str], servers: dict[str, str]) -> bool:
    """Whether a command's environment is the server's but for variables read after start-up."""
    keys = set(environment) | set(servers)
    late = [k for k in keys if k in LATE_VARIABLES or k.startswith(LATE_PREFIX)]
    return all(environment.get(k) == servers.get(k) for k in keys.difference(late))


def _forked(server, request: dict, out_fd: int, err_fd: int, args, timeout, captured=None) -> int:
    """The command's exit status (negative: the signal that ended it), run by the server with these streams.
    _NotForked where the server could not start it; the command is killed if this call ends any other way than
    with its status (a timeout, an interrupted test), as subprocess.run kills its process."""
    message = json.dumps(request).encode()
    with socket.socket(socket.AF_UNIX) as conn:
        try:  # no timeout here: a request the server has may still be started, so it must not run twice
            conn.connect(server["path"])
            socket.send_fds(conn, [struct.pack("!I", len(message)) + message], [out_fd, err_fd])
            pid = struct.unpack("!i", _receive(conn, 4))[0]
        except OSError as error:  # the server is gone (ConnectionError is an OSError): a real process instead
            _server["failed"] = f"the server did not start a command: {error!r}"
            raise _NotForked from error
        try:
            conn.settimeout(timeout)  # from the command's start, as subprocess.run counts it
            return struct.unpack("!i", _receive(conn, 4))[0]
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            output = [_read(f, False) for f in captured] if captured else [None, None]
            raise subprocess.TimeoutExpired(args, timeout, *output) from None  # bytes, as subprocess.run gives
        except BaseException:
            os.kill(pid, signal.SIGKILL)
            raise


def _receive(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the command server closed the connection")
        data += chunk
    return data


def _read(file, text: bool):
    """The file's bytes, or as subprocess.run decodes them with `text`: the locale's encoding, universal newlines."""
    file.seek(0)
    data = file.read()
    if not text:
        return data
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def _start_server():
    """This process's server (started on first use), or None where it cannot run."""
    if os.environ.get(DISABLE) or not hasattr(os, "fork") or _server.get("failed"):
        return None
    if "path" in _server and _server["process"].poll() is None:
        return _server
    path = Path(tempfile.mkdtemp(prefix="zoo-commands-")) / "socket"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.commands", str(path)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    ready = process.stdout.readline()
    if ready.strip() != b"ready":  # it could not start, or its imports printed something a command would show
        process.kill()
        process.wait()
        _server["failed"] = ready.decode(errors="replace") + process.stdout.read().decode(errors="replace")
        return None
    _server.update(process=process, path=str(path), env=dict(os.environ))
    atexit.register(_stop_server, process, path)
    return _server


def _stop_server(process: subprocess.Popen, path: Path) -> None:
    process.kill()
    process.wait()
    path.unlink(missing_ok=True)
    path.parent.rmdir()


# ---------------------------------------------------------------------------------------------------------------
# The server: `python -m tests.commands SOCKET`
# ---------------------------------------------------------------------------------------------------------------


def serve(path: str) -> None:
    import importlib

    # The imports' output is checked, not passed on: a command started afresh would print it too.
    with tempfile.TemporaryFile() as printed:
        saved = os.dup(2), os.dup(1)
        os.dup2(printed.fileno(), 2)
        os.dup2(printed.fileno(), 1)
        try:
            for module in PRELOADED:
                importlib.import_module(module)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 2)
            os.dup2(saved[1], 1)
            os.close(saved[0])
            os.close(saved[1])
        printed.seek(0)
        if output := printed.read():
            print(f"the preloaded imports printed: {output[-2000:]!r}", flush=True)
            return
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():  # its threads would not survive the fork
        print("the preloaded imports started a JAX backend", flush=True)
        return
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen()
    listener.settimeout(5.0)
    parent = os.getppid()
    print("ready", flush=True)
    while os.getppid() == parent:  # the pytest worker that started it is alive
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        with conn:
            try:
                request, fds = _request(conn)
            except (OSError, ValueError, struct.error):
                continue  # the caller went away mid-request; its fds, if any, were closed
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                _child(request, fds)  # never returns: the child exits as the command does
            for fd in fds:
                os.close(fd)
            try:
                conn.sendall(struct.pack("!i", pid))
            except OSError:
                pass  # the caller is gone: it kills the command where it can, and the wait below ends with it
            _, status = os.waitpid(pid, 0)
            try:
                conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
            except OSError:
                pass  # the caller gave up waiting (a timeout) and killed the command


def _request(conn: socket.socket) -> tuple[dict, list[int]]:
    """A command's request and its two stream fds; ValueError or ConnectionError (the fds closed) if it is
    incomplete."""
    message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 2)
    try:
        if len(fds) != 2:
            raise ValueError(f"{len(fds)} file descriptors, not 2")
        message += _receive(conn, max(4 - len(message), 0))  # the length, if the first read stopped short of it
        size = struct.unpack("!I", message[:4])[0]
        message += _receive(conn, 4 + size - len(message))
        return json.loads(message[4 : 4 + size]), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _child(request: dict, fds: list[int]) -> None:
    import runpy

    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in (devnull, *fds):
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # What a fresh `python -m` has: an empty __main__ (runpy runs the module in its namespace), none of the
    # server's own modules, the command's argv, cwd first on the path and freshly seeded global random states.
    main = types.ModuleType("__main__")
    main.__builtins__, main.__annotations__ = builtins, {}
    sys.modules["__main__"] = main
    for name in [n for n in sys.modules if n == "tests" or n.startswith("tests.")]:
        del sys.modules[name]
    sys.orig_argv = [sys.executable, "-m", *request["argv"]]
    sys.argv = ["-m", *request["argv"][1:]]
    if not sys.flags.safe_path:
        sys.path[0] = os.getcwd()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    runpy._run_module_as_main(request["argv"][0])  # `python -m`'s own entry: sets argv[0] and runs __main__
    sys.exit(0)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m tests.commands SOCKET_PATH")
    serve(sys.argv[1])
