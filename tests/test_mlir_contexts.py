"""The pytest workers' shared MLIR contexts (tests/mlir_contexts.py) lower every program as a fresh context does."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
from jax._src.interpreters import mlir

import kernels
from tests import mlir_contexts

REPO = Path(__file__).parents[1]


def _program(causal: bool):
    """A new function object each call, so JAX's own lowering cache cannot answer for it."""

    def loss(q, k, v):
        return jnp.sum(kernels.relu_attention(q, k, v, causal=causal) ** 2)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def _lowered_text(causal: bool) -> str:
    x = jnp.ones((1, 64, 2, 16))
    return _program(causal).lower(x, x, x).as_text()


def _fresh():
    return getattr(mlir.make_ir_context, "fresh", mlir.make_ir_context)


def test_a_context_is_shared_per_thread_and_renewed(monkeypatch):
    monkeypatch.setattr(mlir, "make_ir_context", mlir_contexts.sharing(_fresh()))
    first = mlir.make_ir_context()
    assert mlir.make_ir_context() is first
    other_thread = []
    thread = threading.Thread(target=lambda: other_thread.append(mlir.make_ir_context()))
    thread.start()
    thread.join()
    assert other_thread[0] is not first  # MLIR contexts are not for concurrent use
    seen = {id(mlir.make_ir_context()) for _ in range(mlir_contexts.USES_PER_CONTEXT + 1)}
    assert len(seen) == 2  # renewed once within USES_PER_CONTEXT + 1 uses


def test_a_used_context_lowers_the_same_program_as_a_fresh_one(monkeypatch):
    monkeypatch.setattr(mlir, "make_ir_context", _fresh())
    fresh = [_lowered_text(causal) for causal in (True, False)]
    monkeypatch.setattr(mlir, "make_ir_context", mlir_contexts.sharing(_fresh()))
    shared = [_lowered_text(causal) for causal in (True, False, True)]  # the last in a context used twice
    assert shared[0] == shared[2] == fresh[0] and shared[1] == fresh[1] and shared[0] != shared[1]
    assert "stablehlo.dot_general" in fresh[0]


def test_the_pytest_workers_share_contexts_unless_turned_off():
    assert hasattr(mlir.make_ir_context, "fresh") == (os.environ.get("ZOO_TESTS_FRESH_MLIR_CONTEXTS") != "1")
    env = {**os.environ, "ZOO_TESTS_FRESH_MLIR_CONTEXTS": "1"}
    code = "from tests import mlir_contexts; print(mlir_contexts.install())"
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "False", run.stderr
