"""What every task's command line shares: distributed start-up, override checking, clean error exits.

Flags added to every task CLI:
  --coordinator_address, --num_processes, --process_id   several processes (see `distributed.initialize`)
  --heartbeat_timeout_s   how long the others wait for a vanished process before failing
  --fake_cpu_devices=N    run on N simulated CPU devices (memory planning, sharding tests)
  --debug                 show an error's full traceback instead of one line
  --stop_grace_s          after SIGTERM/SIGINT, how long the step under way may take (zoo/training/signals.py)
The training commands (`train_command`) add --config, --workdir, --plan_memory and
  --profile_steps=F,L     a jax.profiler trace of train steps F..L in WORKDIR/profile
"""

from __future__ import annotations

import json
import logging as std_logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NoReturn

import jax
import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from zoo import config_catalog, config_fields
from zoo.files import parse_ordered_pair
from zoo.plots import MissingExtra
from zoo.training import distributed, memory, signals
from zoo.training.checkpoints import NoCheckpointRestores
from zoo.training.loop import Task, train_and_evaluate
from zoo.training.workdir_lock import WorkdirBusy

_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0, for multi-process runs.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes in a multi-process run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in [0, num_processes).")
_HEARTBEAT = flags.DEFINE_integer(
    "heartbeat_timeout_s", 100, "Seconds without a heartbeat after which a multi-process run fails."
)
_FAKE_DEVICES = flags.DEFINE_integer(
    "fake_cpu_devices", 0, "Simulate this many CPU devices (0: real devices).", lower_bound=0
)
_DEBUG = flags.DEFINE_bool("debug", False, "Show an error's full traceback instead of one line.")
_STOP_GRACE = flags.DEFINE_float(
    "stop_grace_s",
    signals.DEFAULT_GRACE_S,
    "After SIGTERM/SIGINT, seconds to wait for what is under way (a train step and its checkpoint, a native "
    "call) before exiting at once.",
    lower_bound=0,
)


# Errors a user can cause (bad config, bad data, a mismatched workdir, a diverged run, an I/O failure such as a
# missing file or a full disk): one clear line and exit status 2, no traceback.
USER_ERRORS = (ValueError, OSError, FloatingPointError, NoCheckpointRestores, MissingExtra, WorkdirBusy)
# Another process of a multi-process run died: this one stops at once with this status.
LOST_PEER_EXIT_CODE = 3


def _fail(prog: str, message: object) -> NoReturn:
    """A user's error: one line on stderr and exit status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    sys.exit(2)


def unknown_override(argv: Sequence[str], config, flag: str = "config") -> str | None:
    """An error message for the first `--config.a.b=v` naming a field that `config` (the config the flag
    loaded) does not have, with the valid fields at that level; else None."""
    if not isinstance(config, ml_collections.ConfigDict):
        return None
    for arg in argv:
        if not arg.startswith(f"--{flag}."):
            continue
        key = arg[len(flag) + 3 :].split("=", 1)[0]
        node, walked = config, []
        for part in key.split("."):
            if not isinstance(node, ml_collections.ConfigDict) or part not in node:
                where = ".".join(walked) or "the top level"
                if isinstance(node, ml_collections.ConfigDict) and not node.keys():
                    return (
                        f"unknown config field {key!r} in {arg!r}: {where} is empty in this preset, and the command "
                        "line can set fields but not add them: add it in a copy of the config file"
                    )
                valid = ", ".join(sorted(node.keys())) if isinstance(node, ml_collections.ConfigDict) else "none"
                return f"unknown config field {key!r} in {arg!r}: {where} has no {part!r}; valid fields there: {valid}"
            node = node[part]
            walked.append(part)
    return None


class _KeepsLoadedConfig(flags.ArgumentParser):
    """A config file flag's parser that keeps the config it loaded, so that an override naming a missing field
    can be reported against it (the flag itself fails before it holds a value)."""

    def __init__(self, inner: flags.ArgumentParser):
        self.inner, self.config = inner, None

    def parse(self, argument):
        file = argument.split(":", 1)[0]
        try:
            self.config = self.inner.parse(argument)
        except AttributeError as e:  # the file's own missing get_config, not one its code calls
            if e.name != "get_config" or os.path.abspath(getattr(e.obj, "__file__", "")) != os.path.abspath(file):
                raise
            name = os.path.basename(file)
            raise ValueError(f"{name} has no get_config(): a config file defines get_config(preset)") from None
        if self.config is None:
            raise ValueError(f"{os.path.basename(file)}'s get_config() returned None (a missing return statement?)")
        return self.config

    def flag_type(self) -> str:
        return self.inner.flag_type()


def define_config_flag(help_text: str, *, lock_config: bool = True):
    """`--config=FILE[:preset]` with `--config.a.b=v` overrides (ml_collections), whose unknown fields
    `flags_parser` reports with the valid ones beside them."""
    holder = config_flags.DEFINE_config_file("config", None, help_text, lock_config=lock_config)
    flags.FLAGS["config"].parser = _KeepsLoadedConfig(flags.FLAGS["config"].parser)
    return holder


def _last_error_line(text: str) -> str:
    """A flag error as one line: ml_collections wraps a config file's exception in its whole traceback; the
    exception's own line (the last) is what the user needs."""
    if "Traceback (most recent call last)" in text:
        prefix = text.split(": ", 1)[0]  # "flag --config=FILE:preset"
        last = [line for line in text.strip().splitlines() if line.strip()][-1].strip()
        return f"{prefix}: {last.split(': ', 1)[-1] if ': ' in last else last}"
    return " ".join(text.split())


def flags_parser(prog: str) -> Callable[[list[str]], list[str]]:
    """absl's flag parsing, with a bad flag or override reported as one line and exit status 2: an unknown
    `--config.a.b` names the valid fields beside it (the config file is loaded once, by the flag itself)."""

    def parse(argv: list[str]) -> list[str]:
        try:
            return flags.FLAGS(argv)
        except SyntaxError as e:  # a config file's: where, not the importer's traceback
            _fail(prog, f"{e.filename}:{e.lineno}: {e.msg}")
        except (flags.Error, AttributeError, KeyError) as e:
            parser = flags.FLAGS["config"].parser if "config" in flags.FLAGS else None
            loaded = parser.config if isinstance(parser, _KeepsLoadedConfig) else None
            _fail(prog, unknown_override(argv[1:], loaded) or _last_error_line(str(e)))
        except Exception as e:  # raised by a config file's own code: its line, not the importer's traceback
            where = _config_file_line(e, argv)
            if where is None:
                raise
            _fail(prog, f"{where}: {type(e).__name__}: {e}")

    return parse


def _config_file_line(error: BaseException, argv: Sequence[str]) -> str | None:
    """`file:line` of the innermost frame of `error`'s traceback in a `--config` file, or None."""
    paths = {os.path.abspath(a.split("=", 1)[1].split(":", 1)[0]) for a in argv if a.startswith("--config=")}
    where = None
    tb = error.__traceback__
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename) in paths:
            where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def subcommand(argv: Sequence[str], choices: Iterable[str], what: str, usage: str) -> str:
    """The one positional argument of a command with sub-commands (`lra-data TASK`); a UsageError that says
    whether it is missing, unknown (with the valid ones) or followed by others, then the usage."""
    names = list(choices)
    if len(argv) < 2:
        raise app.UsageError(f"no {what} given; usage: {usage}")
    if argv[1] not in names:
        raise app.UsageError(f"unknown {what} {argv[1]!r}; valid: {', '.join(names)} (usage: {usage})")
    if len(argv) > 2:
        raise app.UsageError(f"unexpected arguments: {argv[2:]} (usage: {usage})")
    return argv[1]


def show_command_flags(main: Callable, *modules: str) -> None:
    """Makes `--help` list the command's own flags and this module's (absl lists only the main module's)."""
    by_module = flags.FLAGS.flags_by_module_dict()
    for module in (main.__module__, __name__, *modules):
        for flag in by_module.get(module, []):
            flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    main_module = sys.modules.get("__main__")
    if main_module is not None and not getattr(main_module, "__doc__", None):
        main_module.__doc__ = sys.modules[main.__module__].__doc__  # the usage text absl prints first


def before_parsing(main: Callable[[list[str]], None], prog: str, *, help_epilogue: str = "") -> None:
    """What every command does before absl parses its flags: a `--config` file that does not exist is one line and
    exit status 2; `--help` prints the usage, the command's own flags and `help_epilogue`, and exits with 0."""
    for arg in sys.argv[1:]:
        path = arg.split("=", 1)[1].split(":", 1)[0] if arg.startswith("--config=") else ""
        if path and not os.path.isfile(path):
            _fail(prog, f"--config: no config file {path!r} (relative paths start at {os.getcwd()})")
    show_command_flags(main)
    if any(arg in ("--help", "-h", "-?", "--helpshort") for arg in sys.argv[1:]):
        app.usage(shorthelp=True, writeto_stdout=True)
        print(help_epilogue, end="")
        sys.exit(0)  # absl's own --help exits with status 1


def check_backend(prog: str) -> None:
    """One line and exit 2 when the backend JAX_PLATFORMS names cannot start here (jax's own error is a traceback,
    an empty AssertionError for a GPU platform without its plugin)."""
    try:
        jax.devices()
    except (RuntimeError, AssertionError) as e:
        asked = os.environ.get("JAX_PLATFORMS", "")
        detail = str(e).strip().splitlines()[0] if str(e).strip() else "no plugin for it is installed"
        _fail(
            prog,
            f"JAX_PLATFORMS={asked!r} names a backend this machine cannot start ({detail}); unset JAX_PLATFORMS to "
            "use the backends it has",
        )


def _orbax_errors_in_one_line(record: std_logging.LogRecord) -> bool:
    """Orbax's error logs without their tracebacks: a failed save logs one from each of its threads (hundreds of
    lines for a full disk) before the run says what failed, in one line (zoo.training.checkpoints)."""
    if record.levelno >= std_logging.ERROR and f"{os.sep}orbax{os.sep}" in record.pathname:
        record.msg, record.args = record.getMessage().splitlines()[0][:300], ()
        record.exc_info = record.exc_text = None
    return True


def run(main: Callable[[list[str]], None], prog: str, *, help_epilogue: str = "") -> None:
    """`app.run(main)` with checked overrides, distributed start-up and WARNING-level library logs;
    `--help` prints the usage, the flags, then `help_epilogue`."""
    before_parsing(main, prog, help_epilogue=help_epilogue)

    def wrapped(argv):
        if not flags.FLAGS["verbosity"].present:
            logging.set_verbosity(logging.WARNING)
            logging.get_absl_logger().addFilter(_orbax_errors_in_one_line)
        try:
            if _FAKE_DEVICES.value:  # must precede the first use of a device
                os.environ["XLA_FLAGS"] = (
                    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_FAKE_DEVICES.value}"
                )
            how = distributed.initialize(
                _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value, heartbeat_timeout_s=_HEARTBEAT.value
            )
            check_backend(prog)
            if how != "single process":
                print(f"{prog}: {how}", flush=True)
            else:  # several processes: JAX's preemption sync handles SIGTERM
                signals.STOP.grace_s = _STOP_GRACE.value
                signals.STOP.install()
            main(argv)
        except signals.Preempted as e:
            print(f"{prog}: {e}", file=sys.stderr)
            sys.exit(distributed.PREEMPTED_EXIT_CODE)
        except app.UsageError as e:  # one line and the usual status of a usage error, not absl's usage text and 1
            _fail(prog, e)
        except signals.Interrupted as e:
            signals.exit_interrupted(prog, e)
        except USER_ERRORS as e:
            if _DEBUG.value:
                raise
            _fail(prog, " ".join(str(e).split()) if isinstance(e, OSError) else e)
        except jax.errors.JaxRuntimeError as e:
            if jax.process_count() == 1:
                raise
            first_line = str(e).strip().splitlines()[0]
            print(
                f"{prog}: error: process {jax.process_index()} lost contact with another process of the "
                f"{jax.process_count()}-process run ({first_line}). Restart every process with the same "
                "command; training resumes from the last checkpoint.",
                file=sys.stderr,
                flush=True,
            )
            # Skip interpreter shutdown: its distributed-shutdown barrier would wait for the dead process.
            os._exit(LOST_PEER_EXIT_CODE)

    app.run(wrapped, flags_parser=flags_parser(prog))


def foreign_config_problem(
    config: ml_collections.ConfigDict,
    config_files: Mapping[str, Mapping[str, tuple]],
    prog: str,
    *,
    what: str | None = None,
) -> str | None:
    """Why `config` was made for another command (it lacks fields that each of this command's config files
    declares), or None. Checked before the task reads the config, which would fail on the first missing field.
    `what`: the kind of config the command takes, named instead of the file that misses the fewest fields (which,
    of several files, would read as if the config were meant to be that one)."""
    gaps = {}
    for path, sections in config_files.items():
        names = [name for section, fields in sections.items() for name, _ in config_fields.flat(fields, section)]
        missing = [name for name in names if not _has_field(config, name)]
        if not missing:
            return None
        gaps[path] = missing
    if not gaps:
        return None
    path, missing = min(gaps.items(), key=lambda item: len(item[1]))
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    if what is not None:
        return f"--config is not {what}: it has no {', '.join(missing[:3])}{more}"
    return f"--config is not a config for {prog}: it has no {', '.join(missing[:3])}{more} (fields {path} declares)"


def _has_field(config: ml_collections.ConfigDict, dotted: str) -> bool:
    node = config
    for part in dotted.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            return False
        node = node[part]
    return True


def task_main(
    make_task: Callable[[ml_collections.ConfigDict], Task],
    prog: str,
    command_module: str,
    config_files: Mapping[str, config_fields.Sections],
    *,
    config_kind: str | None = None,
) -> None:
    """The whole of every training command (`lra-train`, `mt-train`, `mlm-train`, `mlm-finetune`); prints the
    results as JSON. `command_module`: the caller's `__name__`, whose docstring heads `--help` (then the config
    fields of the shared sections and of each of `config_files`). `config_kind`: what a foreign config is said not
    to be (see `foreign_config_problem`)."""
    config_flag = define_config_flag("Config file with a preset after ':'.")
    workdir_flag = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and results.")
    plan_flag = flags.DEFINE_bool(
        "plan_memory",
        False,
        "Compile the train step for the configured mesh, print per-device memory, and exit (no workdir; lra-train "
        "reads no data, while mt-train and mlm-train first prepare the data their tokenizer, which sizes the "
        "model, is built from).",
    )
    profile_flag = flags.DEFINE_string(
        "profile_steps",
        None,
        "FIRST,LAST: write a jax.profiler trace of these train steps (1-based) to WORKDIR/profile.",
    )  # a training command's flag only: the other commands have no train steps
    flags.mark_flags_as_required(["config"])

    def main(argv: list[str]) -> None:
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        config = config_flag.value
        problem = foreign_config_problem(config, config_files, prog, what=config_kind)
        if problem:
            raise app.UsageError(problem)
        task = make_task(config)
        if plan_flag.value:
            print(memory.format_plan(memory.plan(config, task)))
            return
        if not workdir_flag.value:
            raise app.UsageError("--workdir is required")
        profile = None
        if profile_flag.value:
            profile = parse_ordered_pair(profile_flag.value, ",", "--profile_steps", "FIRST,LAST (two step numbers)")
        results = train_and_evaluate(config, workdir_flag.value, task, profile_steps=profile)
        print(json.dumps(results, indent=2, sort_keys=True))

    main.__module__ = command_module
    run(main, prog, help_epilogue=config_fields_help(config_files))


def config_fields_help(config_files: Mapping[str, config_fields.Sections] | None = None) -> str:
    """The shared config sections' fields, then each config file's own, from their declarations (docs/config.md
    has them as tables)."""
    lines = ["", "Config fields of every task (--config.SECTION.FIELD=value):"]
    for name, fields in {**config_catalog.declared_sections(), **config_catalog.mixer_sections()}.items():
        lines += config_fields.help_lines(fields, name)
    for path, sections in (config_files or {}).items():
        lines += ["", f"Config fields of {path} only:"]
        for name, fields in sections.items():
            lines += config_fields.help_lines(fields, name)
    return "\n".join(lines) + "\n"


def print_demo(
    title: str,
    rows: Sequence[tuple[str, str]],
    results: dict,
    *,
    wall_time: tuple[str, float],
    workdir: str,
    notes: Sequence[tuple[str, str]] = (),
) -> None:
    """A demo's summary: the task's rows, train steps/s, `wall_time` (what it covers, seconds), any `notes`
    rows, then the workdir."""
    # This run's steps over this run's training time.
    timing = [("train steps/s", f"{results['train_steps_run'] / max(results['train_wall_time_this_run_s'], 1e-9):.2f}")]
    if "mfu" in results:  # the task counts its FLOPs (zoo/training/flops.py)
        mfu = f"{100 * results['mfu']:.1f}% of {results['peak_tflops_per_device']:.3g} TFLOP/s"
        timing.append(("MFU (model FLOPs / peak)", mfu))
    timing.append((f"wall time ({wall_time[0]})", f"{wall_time[1]:.0f} s"))
    print_table(title, [*rows, *timing, *notes, ("workdir", str(workdir))])


def print_table(title: str, rows: Sequence[tuple[str, str]]) -> None:
    """A demo's summary: a title, then `name  value` lines with the names aligned."""
    width = max(len(k) for k, _ in rows)
    print(f"\n{title}")
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
