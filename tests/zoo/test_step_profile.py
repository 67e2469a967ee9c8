"""zoo.training.step_profile: HLO operations sorted into kinds by what they compute, and a profiler trace of a
compiled function turned into time per kind."""

import jax
import jax.numpy as jnp
import pytest

from zoo.training import step_profile


def _compiled():
    def f(a, b, key):
        keep = jax.random.bernoulli(key, 0.9, a.shape)  # dropout's random bits: threefry
        h = jnp.where(keep, a @ b, 0.0)
        return jnp.sum(jnp.tanh(h).T @ b, axis=0)

    a = jnp.ones((256, 256))
    return jax.jit(f).lower(a, a, jax.random.key(0)).compile(), (a, a, jax.random.key(0))


def test_every_kind_of_work_in_a_compiled_function_is_recognised():
    compiled, _ = _compiled()
    kinds = step_profile.op_kinds(compiled.as_text())
    found = set(kinds.values())
    assert {"matmul", "random bits"} <= found, kinds
    assert all(kind in step_profile.KINDS for kind in found)


def test_op_kinds_of_hand_written_hlo():
    hlo = """HloModule m

%fused_dot (p0: f32[4,4], p1: f32[4,4]) -> f32[4,4] {
  %p0 = f32[4,4]{1,0} parameter(0)
  %p1 = f32[4,4]{1,0} parameter(1)
  ROOT %d = f32[4,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_transpose (p0: f32[4,4]) -> f32[4,4] {
  %p0 = f32[4,4]{1,0} parameter(0)
  ROOT %t = f32[4,4]{0,1} transpose(%p0), dimensions={1,0}
}

%fused_sum (p0: f32[4,4]) -> f32[4] {
  %p0 = f32[4,4]{1,0} parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[4]{0} reduce(%p0, %z), dimensions={1}, to_apply=%add
}

ENTRY %main (a: f32[4,4]) -> f32[4] {
  %a = f32[4,4]{1,0} parameter(0)
  %mm = f32[4,4]{1,0} fusion(%a, %a), kind=kOutput, calls=%fused_dot
  %tr = f32[4,4]{0,1} fusion(%mm), kind=kLoop, calls=%fused_transpose
  %ex = f32[4,4]{1,0} exponential(%tr)
  ROOT %s = f32[4]{0} fusion(%ex), kind=kInput, calls=%fused_sum
}
"""
    kinds = step_profile.op_kinds(hlo)
    assert (kinds["mm"], kinds["tr"], kinds["ex"], kinds["s"]) == ("matmul", "layout", "elementwise", "reduction")


def test_breakdown_of_a_traced_function(tmp_path):
    compiled, args = _compiled()
    jax.block_until_ready(compiled(*args))
    with jax.profiler.trace(str(tmp_path)):
        for _ in range(2):
            jax.block_until_ready(compiled(*args))
    breakdown = step_profile.op_breakdown(tmp_path, compiled, steps=2)
    kinds = breakdown["kinds"]
    assert set(kinds) == set(step_profile.KINDS)
    assert abs(sum(row["share"] for row in kinds.values()) - 1) < 1e-9
    assert kinds["matmul"]["ms_per_step"] > 0 and breakdown["op_ms_per_step"] > 0
    assert breakdown["top_ops"] and "op time per step" in step_profile.format_breakdown(breakdown)


def test_a_directory_without_a_trace_is_named(tmp_path):
    compiled, _ = _compiled()
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}: no profiler trace"):
        step_profile.op_breakdown(tmp_path, compiled, steps=1)
