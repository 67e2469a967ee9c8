"""One MLIR context for many lowerings in a pytest worker, instead of a fresh one for each.

JAX lowers every jitted program into a new MLIR context and loads its dialects into it (`make_ir_context`). A
pytest worker lowers thousands of small programs, and a new context costs more the more contexts are alive
(2.6 ms in a fresh worker, 5.2 ms after tests/zoo/test_mixers.py): on this 2-core CPU, tests/zoo/test_mixers.py,
test_masked_lm.py and tests/kernels/test_softmax_attention.py took 98.9 s with a context per lowering and 83.8 s
sharing one per thread, renewed every `USES_PER_CONTEXT` lowerings (a context keeps every type and attribute it
has seen until it is freed). Lowering into a context that has already held other modules gives the same program
(tests/test_mlir_contexts.py). Only the pytest workers share contexts: the commands the tests start lower as a
user's run does. `ZOO_TESTS_FRESH_MLIR_CONTEXTS=1` turns the sharing off.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

USES_PER_CONTEXT = 200


def sharing(fresh: Callable[[], Any]) -> Callable[[], Any]:
    """`fresh` (JAX's `make_ir_context`) made to return one context per thread, renewed every
    `USES_PER_CONTEXT` calls; `.fresh` is the original."""
    per_thread = threading.local()

    def shared_context():
        uses = getattr(per_thread, "uses", USES_PER_CONTEXT)
        if uses >= USES_PER_CONTEXT:
            per_thread.context, uses = fresh(), 0
        per_thread.uses = uses + 1
        return per_thread.context

    shared_context.fresh = fresh
    return shared_context


def install() -> bool:
    """Makes JAX's `make_ir_context` share contexts; False where that is turned off or this JAX has no such
    function (its internals moved: every lowering then gets a fresh context, as in a user's run)."""
    if os.environ.get("ZOO_TESTS_FRESH_MLIR_CONTEXTS") == "1":
        return False
    try:
        from jax._src.interpreters import mlir
    except ImportError:
        return False
    current = getattr(mlir, "make_ir_context", None)
    if current is None:
        return False
    if not hasattr(current, "fresh"):
        mlir.make_ir_context = sharing(current)
    return True
