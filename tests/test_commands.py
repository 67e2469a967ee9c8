"""tests/commands.py: a command forked from the preloaded server is what a fresh `python -m` would be."""

import os
import subprocess
import sys
import textwrap

import pytest

from tests import commands

PROBE = """
import atexit, os, sys
print("argv", sys.argv[1:], "cwd", os.getcwd(), "path0", sys.path[0] == os.getcwd())
print("main", __name__, __spec__.name, "env", os.environ.get("XLA_FLAGS", "")[-20:], os.environ.get("ZOO_PROBE"))
print("globals", sorted(globals()), "server modules", "tests" in sys.modules, "orig_argv", sys.orig_argv[1:])
print("to stderr", file=sys.stderr)
atexit.register(lambda: print("atexit ran"))
print("parent", os.getppid(), file=open(os.environ["ZOO_PROBE_PARENT"], "w"))
if "--raise" in sys.argv:
    raise ValueError("the probe raised")
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def probe(tmp_path):
    (tmp_path / "probe.py").write_text(textwrap.dedent(PROBE))
    return tmp_path


def _run(runner, probe, *args, **env):
    environment = {**os.environ, "ZOO_PROBE_PARENT": str(probe / "parent.txt"), **env}
    result = runner(
        [sys.executable, "-m", "probe", *args], capture_output=True, text=True, cwd=probe, env=environment, timeout=120
    )
    parent = int((probe / "parent.txt").read_text().split()[1])
    return result, parent


@pytest.mark.parametrize("args", [("0",), ("3", "--flag=x"), ("0", "--raise")])
def test_a_forked_command_prints_and_exits_as_a_fresh_process_does(probe, args):
    real, real_parent = _run(subprocess.run, probe, *args, ZOO_PROBE="late", XLA_FLAGS="--xla_dump_to=/nowhere")
    forked, forked_parent = _run(commands.run, probe, *args, ZOO_PROBE="late", XLA_FLAGS="--xla_dump_to=/nowhere")
    assert real_parent == os.getpid() and forked_parent != os.getpid()  # the second came from the server
    assert (forked.returncode, forked.stdout) == (real.returncode, real.stdout)
    if "--raise" in args:  # the same error; the traceback's frames above the module differ
        assert real.returncode == 1 and forked.stderr.splitlines()[-1] == real.stderr.splitlines()[-1]
        assert forked.stderr.splitlines()[-1] == "ValueError: the probe raised"
    else:
        assert forked.stderr == real.stderr == "to stderr\n"
    assert "atexit ran" in forked.stdout and "path0 True" in forked.stdout and "main __main__ probe" in forked.stdout


def test_a_variable_read_at_start_up_starts_a_real_process(probe):
    result, parent = _run(commands.run, probe, "0", ZOO_PROBE="read later")
    assert result.returncode == 0 and parent != os.getpid()  # forked
    for variable in ("JAX_ENABLE_X64", "PYTHONPATH", "GLIBC_TUNABLES"):
        result, parent = _run(commands.run, probe, "0", **{variable: "1"})
        assert result.returncode == 0 and parent == os.getpid(), variable


def test_xla_flags_and_the_random_state_are_the_command_s_own(tmp_path):
    """XLA reads its flags when the command starts its backend, after the fork; numpy's global random state is
    seeded afresh in each command, as in a new process."""
    (tmp_path / "draw.py").write_text("import jax, numpy\nprint(len(jax.devices()), numpy.random.rand())\n")
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=3"
    environment = {**os.environ, "XLA_FLAGS": flags}
    draws = [
        commands.run([sys.executable, "-m", "draw"], capture_output=True, text=True, cwd=tmp_path, env=environment)
        for _ in range(2)
    ]
    assert all(d.returncode == 0 for d in draws), draws[0].stderr
    (devices, first), (_, second) = (d.stdout.split() for d in draws)
    assert devices == "3" and first != second


def test_a_command_past_its_timeout_is_killed_and_raises_like_subprocess(tmp_path):
    (tmp_path / "sleeper.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        commands.run([sys.executable, "-m", "sleeper"], capture_output=True, text=True, cwd=tmp_path, timeout=3)
    assert raised.value.timeout == 3 and raised.value.output == b"started\n"  # bytes, as subprocess.run gives
    # The command was killed, so the server is free for the next one.
    (tmp_path / "quick.py").write_text("import os\nprint(os.getppid())\n")
    quick = commands.run([sys.executable, "-m", "quick"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert quick.returncode == 0 and int(quick.stdout) != os.getpid()


def test_a_command_writing_to_a_log_file_writes_what_a_fresh_process_writes(probe):
    """The form lra-compare starts its cells in: stdout to an open log, stderr into it."""
    environment = {**os.environ, "ZOO_PROBE_PARENT": str(probe / "parent.txt")}
    for runner, name in ((subprocess.run, "real.log"), (commands.run, "forked.log")):
        with (probe / name).open("w") as log:
            log.write("$ the command\n")
            log.flush()
            result = runner(
                [sys.executable, "-m", "probe", "3"], stdout=log, stderr=subprocess.STDOUT, cwd=probe, env=environment
            )
        assert result.returncode == 3 and result.stdout is None
        parent = int((probe / "parent.txt").read_text().split()[1])
        assert (parent == os.getpid()) == (runner is subprocess.run)
    assert (probe / "forked.log").read_text() == (probe / "real.log").read_text()
    log = (probe / "forked.log").read_text()
    assert log.startswith("$ the command\nargv ['3']") and "to stderr\n" in log and log.endswith("atexit ran\n")
