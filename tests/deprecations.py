"""A dependency's deprecation warning attributed to the code that called the deprecated API.

pyproject.toml's filters make a DeprecationWarning an error where it is attributed to this project's modules and
show it where it is attributed to a dependency. A library that warns at `stacklevel=1` (flax's `State` methods,
for one) attributes the warning to its own module, so this project calling the deprecated API would only be shown.
`attribute_to_callers` makes `warnings.warn` attribute such a warning to the deprecated function's caller, as a
`stacklevel=2` would: this project's call is then an error, a dependency's own call still only shown.
"""

import sys
import warnings

from tests.packages import PACKAGES, ROOT

_OWN_CODE = tuple(str(ROOT / name) for name in (*PACKAGES, "tests"))


def _in_a_dependency(filename: str) -> bool:
    return not filename.startswith(_OWN_CODE)


def attribute_to_callers() -> None:
    """Wraps `warnings.warn` in this process (idempotent)."""
    if getattr(warnings.warn, "attributes_to_callers", False):
        return
    warn = warnings.warn

    def warn_at_caller(message, category=None, stacklevel=1, source=None, **kwargs):
        deprecation = isinstance(message, DeprecationWarning) or (
            isinstance(category, type) and issubclass(category, DeprecationWarning)
        )
        if deprecation and stacklevel == 1 and _in_a_dependency(sys._getframe(1).f_code.co_filename):
            stacklevel = 2
        return warn(message, category, stacklevel + 1, source, **kwargs)  # + 1: this wrapper's own frame

    warn_at_caller.attributes_to_callers = True
    warnings.warn = warn_at_caller
