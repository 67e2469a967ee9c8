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
