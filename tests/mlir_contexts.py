"""One MLIR context for several lowerings in a pytest worker, instead of a fresh one for each.

JAX (0.10, 0.11) lowers every jitted program into a new MLIR context and loads its dialects into it
(`make_ir_context`). A pytest worker lowers thousands of small programs, and a new context costs more the more
contexts are alive (2.6 ms in a fresh worker, 5.2 ms after tests/zoo/test_mixers.py): on this 2-core CPU,
tests/zoo/test_mixers.py, test_masked_lm.py and tests/kernels/test_softmax_attention.py took 96.6 s with a
context per lowering and 86.1 s sharing one per thread, renewed every 20 lowerings. JAX's main branch has since
made the same change itself (a context per thread, renewed every few uses); where a JAX already shares
(`_create_ir_context`), nothing is installed. A context is renewed every `USES_PER_CONTEXT` lowerings (it keeps
every constant and type it has seen until it is freed) and after a lowering that allowed unregistered dialects;
a lowering that starts inside another (an eager operation in a lowering rule) gets a fresh one, since
re-entering the context would carry the outer insertion point into it. tests/test_mlir_contexts.py checks that
a used context lowers the same program as a fresh one. Only the pytest workers share contexts: the commands the
tests start lower as a user's run does. `ZOO_TESTS_FRESH_MLIR_CONTEXTS=1` turns the sharing off.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

USES_PER_CONTEXT = 20


class _PerThread(threading.local):
    context: Any = None
    uses = 0


def sharing(fresh: Callable[[], Any], current: Callable[[], Any]) -> Callable[[], Any]:
    """`fresh` (JAX's `make_ir_context`) made to return one context per thread, renewed every
    `USES_PER_CONTEXT` calls, after one allowed unregistered dialects, and never handed out while it is the
    entered (`current()`) context; `.fresh` is the original."""
    per_thread = _PerThread()

    def shared_context():
        context = per_thread.context
        if context is not None and current() is context:
            return fresh()  # a lowering inside a lowering
        if context is None or per_thread.uses >= USES_PER_CONTEXT or context.allow_unregistered_dialects:
            per_thread.context, per_thread.uses = fresh(), 0
        per_thread.uses += 1
        return per_thread.context

    shared_context.fresh = fresh
    return shared_context


def fresh_maker(mlir) -> Callable[[], Any]:
    """JAX's maker of a fresh context: its own where it shares contexts itself (`_create_ir_context`), else
    `make_ir_context` as JAX defined it, whether or not `install` has replaced it."""
    own = getattr(mlir, "_create_ir_context", None)
    return own or getattr(mlir.make_ir_context, "fresh", mlir.make_ir_context)


def entered_context() -> Any:
    """The MLIR context this thread has entered (None when none)."""
    from jax._src.lib.mlir import ir

    try:
        return ir.Context.current
    except ValueError:  # bindings that raise rather than answer None
        return None


def install() -> bool:
    """Makes JAX's `make_ir_context` share contexts; False where that is turned off, where JAX shares them
    itself, or where this JAX has no such function (its internals moved: every lowering then gets a fresh
    context, as in a user's run)."""
    if os.environ.get("ZOO_TESTS_FRESH_MLIR_CONTEXTS") == "1":
        return False
    try:
        from jax._src.interpreters import mlir
    except ImportError:
        return False
    current = getattr(mlir, "make_ir_context", None)
    if current is None or hasattr(mlir, "_create_ir_context"):
        return False
    if not hasattr(current, "fresh"):
        mlir.make_ir_context = sharing(current, entered_context)
    return True
