"""The project's packages, read from pyproject.toml's `[tool.setuptools.packages.find] include`: the one list the
tests take them from. The places that cannot import it (the DeprecationWarning filter in pyproject.toml, the
Makefile's bytecode rules) are checked against it in tests/test_packaging.py."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _installed_packages() -> tuple[str, ...]:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    return tuple(pattern.removesuffix("*") for pattern in patterns["include"])


PACKAGES: tuple[str, ...] = _installed_packages()
