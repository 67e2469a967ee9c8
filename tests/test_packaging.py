"""The dependencies' lower pins in pyproject.toml are the versions `make test-lower-pins` installs and tests."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement  # packaging: a dependency of pytest itself
from packaging.version import Version

ROOT = Path(__file__).parents[1]


def _lower_pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "tests" / "lower_pins.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.strip().lower()] = Version(version)
    return pins


def test_every_dependency_s_lower_pin_is_the_version_the_lower_pin_run_installs():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    lower = {}
    for text in dependencies:
        requirement = Requirement(text)
        (bound,) = [s.version for s in requirement.specifier if s.operator == ">="]  # every dependency has one
        lower[requirement.name.lower()] = Version(bound)
    pins = _lower_pins()
    assert pins.pop("jaxlib") == pins["jax"]  # jax's compiled half, at jax's version
    assert pins == lower


def test_the_make_target_installs_the_pins_file_into_a_venv_of_its_own():
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^test-lower-pins:.*?(?=^\S|\Z)", makefile, flags=re.M | re.S)[0]
    assert "-c tests/lower_pins.txt" in target and "$(LOWER)/bin/python -m pytest" in target
    assert ".venv-lower-pins/" in (ROOT / ".gitignore").read_text().splitlines()
