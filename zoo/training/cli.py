"""What every task's command line shares: override checking, logging defaults, clean error exits."""

from __future__ import annotations

import runpy
import sys
from collections.abc import Callable, Sequence

import ml_collections
from absl import app, flags, logging

# Errors a user can cause (bad config, bad data, a mismatched workdir, a diverged run): one clear
# line and exit status 2, no traceback.
USER_ERRORS = (ValueError, FileNotFoundError, FloatingPointError)


def unknown_override(argv: Sequence[str], flag: str = "config") -> str | None:
    """An error message for the first `--config.a.b=v` naming a field the config does not have, else None."""
    spec = next((a.split("=", 1)[1] for a in argv if a.startswith(f"--{flag}=")), None)
    if spec is None:
        return None
    path, _, preset = spec.partition(":")
    try:
        get_config = runpy.run_path(path)["get_config"]
        config = get_config(preset) if preset else get_config()
    except Exception:
        return None
    for arg in argv:
        if not arg.startswith(f"--{flag}."):
            continue
        key = arg[len(flag) + 3 :].split("=", 1)[0]
        node, walked = config, []
        for part in key.split("."):
            if not isinstance(node, ml_collections.ConfigDict) or part not in node:
                where = ".".join(walked) or "the top level"
                valid = ", ".join(sorted(node.keys())) if isinstance(node, ml_collections.ConfigDict) else "none"
                return f"unknown config field {key!r} in {arg!r}: {where} has no {part!r}; valid fields there: {valid}"
            node = node[part]
            walked.append(part)
    return None


def run(main: Callable[[list[str]], None], prog: str) -> None:
    """`app.run(main)` with checked overrides and WARNING-level library logs unless --verbosity is given."""
    message = unknown_override(sys.argv[1:])
    if message:
        print(f"{prog}: error: {message}", file=sys.stderr)
        sys.exit(2)

    def wrapped(argv):
        if not flags.FLAGS["verbosity"].present:
            logging.set_verbosity(logging.WARNING)
        try:
            main(argv)
        except USER_ERRORS as e:
            print(f"{prog}: error: {e}", file=sys.stderr)
            sys.exit(2)

    app.run(wrapped)
