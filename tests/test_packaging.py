"""The dependencies' lower pins in pyproject.toml are the versions `make test-lower-pins` installs and tests."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement  # packaging: a dependency of pytest itself
from packaging.version import Version

from tests.packages import PACKAGES

ROOT = Path(__file__).resolve().parents[1]


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


def _make_rule(makefile: str, target: str) -> str:
    return re.search(rf"^{re.escape(target)}:.*?(?=^\S|\Z)", makefile, flags=re.M | re.S)[0]


def test_the_make_targets_install_the_pins_file_into_a_venv_of_their_own_and_ci_runs_the_fast_one():
    makefile = (ROOT / "Makefile").read_text()
    install = _make_rule(makefile, "$(LOWER)/.installed")
    assert "-c tests/lower_pins.txt" in install and "tests/lower_pins.txt" in install.splitlines()[0]  # a prerequisite
    for target in ("test-lower-pins", "test-lower-pins-fast"):
        rule = _make_rule(makefile, target)
        assert "$(LOWER)/.installed" in rule.splitlines()[0] and "$(LOWER)/bin/python -m pytest" in rule, target
    assert ".venv-lower-pins/" in (ROOT / ".gitignore").read_text().splitlines()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci.index("make test") < ci.index("make test-lower-pins-fast") < ci.index("  make test-newest-fast")


def test_the_newest_releases_are_tested_in_a_venv_of_their_own_on_python_3_12():
    makefile = (ROOT / "Makefile").read_text()
    install = _make_rule(makefile, "$(NEWEST)/.installed")
    assert "$(PYTHON_NEWEST) -m venv $(NEWEST)" in install and '-e ".[test]"' in install and " -c " not in install
    rule = _make_rule(makefile, "test-newest-fast")
    assert (
        "$(NEWEST)/.installed" in rule.splitlines()[0]
        and '$(NEWEST)/bin/python -m pytest $(XDIST) -q -m "not e2e"' in rule
    )
    assert ".venv-newest/" in (ROOT / ".gitignore").read_text().splitlines()


def test_the_places_that_name_the_project_s_packages_name_the_ones_pyproject_installs():
    # Every package directory of the checkout is installed (tests aside).
    assert sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()) == sorted([*PACKAGES, "tests"])
    # The deprecation filter makes a warning an error in these modules' code (and the tests').
    filters = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["filterwarnings"]
    (own,) = [f for f in filters if f.startswith("error::DeprecationWarning:")]
    named = re.fullmatch(r"error::DeprecationWarning:\((.*)\)\(\\\.\|\$\)", own)[1].split("|")
    assert sorted(named) == sorted([*PACKAGES, "tests"])
    # The Makefile's bytecode rules compile them (and benchmarks, tests).
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^PACKAGES := (.*)$", makefile, flags=re.M)[1].split() == list(PACKAGES)
    for target in ("bytecode", "test-lower-pins-fast", "test-newest-fast"):
        assert "compileall -q $(PACKAGES) benchmarks tests" in _make_rule(makefile, target), target
