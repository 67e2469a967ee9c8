"""`--cases-per-test` (`make test-fast`): each test function keeps N of its parametrised cases, the same ones each
run, generated methods (absl, chex) counted with the function they wrap; `every_case` tables keep all."""

import functools
from types import SimpleNamespace

import pytest

from tests import conftest


def _case_of(function, case: str, every_case: bool = False):
    return SimpleNamespace(
        nodeid=f"tests/test_x.py::{function.__name__}[{case}]",
        function=function,
        keywords={"every_case": True} if every_case else {},
    )


def _generated(function, suffix):
    """What absl's parameterized and chex's variants make of a test method: a wrapper per case."""

    @functools.wraps(function)
    def case(*args):
        return function(*args)

    case.__name__ = f"{function.__name__}{suffix}"
    return case


def check_a():  # test functions, as far as the sampling goes (named so that pytest does not collect them)
    pass


def check_b():
    pass


def check_table():
    pass


def check_plain():
    pass


def _items():
    return (
        [_case_of(check_a, str(i)) for i in range(5)]
        + [_case_of(_generated(check_b, i), str(i)) for i in range(4)]
        + [_case_of(check_table, str(i), every_case=True) for i in range(6)]
        + [_case_of(check_plain, "")]
    )


def _sample(limit):
    items, deselected = _items(), []
    config = SimpleNamespace(
        getoption=lambda name: {"--cases-per-test": limit}[name],
        hook=SimpleNamespace(pytest_deselected=lambda items: deselected.extend(items)),
    )
    conftest._sample_cases(config, items)
    return [item.nodeid for item in items], [item.nodeid for item in deselected]


@pytest.mark.parametrize("limit", [1, 2])
def test_each_function_keeps_n_cases_and_tables_keep_all(limit):
    kept, deselected = _sample(limit)
    per_function = {name: sum(n.split("::")[1].startswith(name) for n in kept) for name in ("check_a", "check_b")}
    assert per_function == {"check_a": limit, "check_b": limit}  # check_b's wrappers count as one function
    assert sum("check_table[" in n for n in kept) == 6 and "tests/test_x.py::check_plain[]" in kept
    assert sorted(kept + deselected) == sorted(item.nodeid for item in _items())  # the rest reported deselected
    assert _sample(limit) == (kept, deselected)  # the same cases every run


def test_zero_keeps_every_case():
    kept, deselected = _sample(0)
    assert len(kept) == len(_items()) and not deselected


def test_a_negative_count_is_a_usage_error():
    with pytest.raises(pytest.UsageError, match=r"--cases-per-test=-1: 0 \(every case\) or a positive number"):
        _sample(-1)
