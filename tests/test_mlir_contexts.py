"""The pytest workers' shared MLIR contexts (tests/mlir_contexts.py) lower every program as a fresh context does."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.interpreters import mlir
from jax.extend.core import Primitive
from jax.interpreters import mlir as public_mlir

import kernels
from kernels import ReluAttentionOptions
from tests import mlir_contexts
from tests.kernels.lowering import exported_text

REPO = Path(__file__).parents[1]


def _fresh():
    return mlir_contexts.fresh_maker(mlir)


@pytest.fixture
def shared(monkeypatch):
    """JAX's `make_ir_context` sharing contexts for this test, whatever the worker does."""
    monkeypatch.setattr(mlir, "make_ir_context", mlir_contexts.sharing(_fresh(), mlir_contexts.entered_context))


def _program(causal: bool):
    """A new function object each call, so JAX's own lowering cache cannot answer for it."""

    def loss(q, k, v):
        return jnp.sum(kernels.relu_attention(q, k, v, causal=causal) ** 2)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def _lowered_text(causal: bool) -> str:
    x = jnp.ones((1, 64, 2, 16))
    return _program(causal).lower(x, x, x).as_text()


def _eager_inside_its_lowering(n: int) -> Primitive:
    """A primitive whose lowering rule runs an eager operation on an array of `n` elements (a shape not seen
    before, so JAX lowers it anew): one program lowered while another one is. Its value: x + n(n-1)/2."""
    prim = Primitive(f"eager_inside_its_lowering_{n}")
    prim.def_abstract_eval(lambda x: x)

    def lowering(ctx, x):
        offset = float(jnp.arange(float(n)).sum())  # compiled and run while the outer program lowers
        return public_mlir.lower_fun(lambda y: y + np.float32(offset), multiple_results=False)(ctx, x)

    public_mlir.register_lowering(prim, lowering)
    return prim


def test_a_context_is_shared_per_thread_and_renewed(shared):
    first = mlir.make_ir_context()
    assert mlir.make_ir_context() is first
    other_thread = []
    thread = threading.Thread(target=lambda: other_thread.append(mlir.make_ir_context()))
    thread.start()
    thread.join()
    assert other_thread[0] is not first  # MLIR contexts are not for concurrent use
    seen = {id(mlir.make_ir_context()) for _ in range(mlir_contexts.USES_PER_CONTEXT + 1)}
    assert len(seen) == 2  # renewed once within USES_PER_CONTEXT + 1 uses
    used = mlir.make_ir_context()
    used.allow_unregistered_dialects = True  # as JAX's TPU custom call sets it, and leaves it
    assert mlir.make_ir_context() is not used
    with first:
        assert mlir.make_ir_context() is not first  # never handed out while entered


def test_jit_lowers_into_the_shared_context(shared):
    x = jnp.ones((4,))
    module = jax.jit(lambda a: a * 2).lower(x).compiler_ir("stablehlo")
    context = mlir.make_ir_context()
    assert module.context is context  # the patched function is the one JAX's lowering calls


def test_a_used_context_lowers_the_same_program_as_a_fresh_one(monkeypatch, shared):
    x = jax.ShapeDtypeStruct((1, 128, 2, 64), jnp.float32)
    tpu = ReluAttentionOptions(impl="pallas", pallas_backend="tpu", pallas_interpret=False)

    def tpu_kernel(q, k, v):
        return kernels.relu_attention(q, k, v, causal=True, options=tpu)

    # Into the shared context first: a Mosaic TPU export (it registers its dialect there), a program that lowers
    # another inside it, then the program compared.
    assert "tpu_custom_call" in exported_text(tpu_kernel, "tpu", x, x, x)
    assert float(jax.jit(_eager_inside_its_lowering(101).bind)(jnp.float32(1.0))) == 1 + 5050
    shared_texts = [_lowered_text(causal) for causal in (True, False)]
    monkeypatch.setattr(mlir, "make_ir_context", _fresh())
    fresh_texts = [_lowered_text(causal) for causal in (True, False)]
    assert shared_texts == fresh_texts and shared_texts[0] != shared_texts[1]
    assert "stablehlo.dot_general" in fresh_texts[0]


def test_a_lowering_inside_a_lowering_gets_its_own_context(shared):
    # Handed the entered context, the inner lowering would start inside the outer module: with the suite's
    # persistent cache on, computing the inner program's cache key then fails ("symbol's parent must have the
    # SymbolTable trait").
    assert float(jax.jit(_eager_inside_its_lowering(102).bind)(jnp.float32(2.0))) == 2 + 5151


def test_the_pytest_workers_share_contexts_unless_turned_off():
    expected = os.environ.get("ZOO_TESTS_FRESH_MLIR_CONTEXTS") != "1" and not hasattr(mlir, "_create_ir_context")
    assert hasattr(mlir.make_ir_context, "fresh") == expected
    env = {**os.environ, "ZOO_TESTS_FRESH_MLIR_CONTEXTS": "1"}
    code = "from tests import mlir_contexts; print(mlir_contexts.install())"
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "False", run.stderr
