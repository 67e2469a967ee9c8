"""Deprecation warnings: an error where this project's code calls a deprecated API, shown where a dependency
does (pyproject.toml's filterwarnings)."""

import warnings

import pytest


def test_a_deprecation_raised_from_this_projects_code_is_an_error():
    with pytest.raises(DeprecationWarning, match="old API"):
        warnings.warn("old API", DeprecationWarning, stacklevel=1)  # attributed to tests.test_warnings
    with pytest.raises(DeprecationWarning):
        warnings.warn_explicit("old API", DeprecationWarning, "zoo/layers/ffn.py", 1, module="zoo.layers.ffn")


def test_a_dependencys_deprecation_is_not_an_error():
    # under the suite's filters: raising here would mean every dependency's announcement fails the tests
    warnings.warn_explicit("their old API", DeprecationWarning, "site.py", 1, module="somelib.sub")


OLD_LIBRARY = """
import warnings


def old_api():
    warnings.warn("old_api is deprecated", DeprecationWarning)  # stacklevel 1: the library's own line
    return 1


def library_function():
    return old_api()
"""


def test_a_dependency_warning_at_its_own_line_is_attributed_to_the_caller(tmp_path, monkeypatch):
    """A library that warns at stacklevel 1 (as flax's State methods do): this project calling the deprecated API
    is an error; the library calling it itself is only shown (tests/deprecations.py)."""
    (tmp_path / "old_library.py").write_text(OLD_LIBRARY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import old_library

    with pytest.raises(DeprecationWarning, match="old_api is deprecated"):
        old_library.old_api()  # attributed to this test module
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        assert old_library.library_function() == 1  # attributed to the library: not an error
    assert [w.filename for w in shown] == [str(tmp_path / "old_library.py")]
