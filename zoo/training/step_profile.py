"""Where a compiled train step spends its time, by kind of operation, from a JAX profiler trace.

`op_breakdown(trace_dir, compiled, steps)` reads the trace that `jax.profiler.trace(trace_dir)` wrote around
`steps` calls of `compiled`, sums the duration of every executed HLO operation (the `hlo_op` of each event: on a
CPU every thunk, on a GPU every kernel) and sorts each into a kind by what the operation computes in the compiled
module's HLO:

    matmul        a dot or convolution, or a fusion that contains one
    layout        a transpose or copy, or a fusion whose result is one (data moved, nothing computed)
    random bits   a fusion of the threefry hash (shifts and xors of uint32): dropout's masks
    reduction     a reduce (softmax sums, layer-norm statistics, the loss) or a fusion rooted in one
    elementwise   any other fusion or operation (activations, masks, the optimiser's update)
    control       while loops, calls, conditionals (their bodies' operations are counted on their own)

Times are per step and summed over the threads that ran them, so on a multi-threaded CPU they can add up to
more than the step's wall time; `share` is each kind's part of that sum. A loop's own event spans its body's,
which are counted on their own: "control" is reported but left out of the sum and the shares.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import jax

KINDS = ("matmul", "layout", "random bits", "reduction", "elementwise", "control")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*.*?\s([a-z][\w\-]*)\((.*)$")
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLS = re.compile(r"calls=%?([\w.\-]+)")
# The kind of an instruction by its opcode alone (fusions and custom calls are judged by what they call).
_OPCODE_KINDS = {
    **dict.fromkeys(("dot", "convolution"), "matmul"),
    **dict.fromkeys(("transpose", "copy", "copy-start", "copy-done"), "layout"),
    "rng-bit-generator": "random bits",
    **dict.fromkeys(("reduce", "reduce-window", "all-reduce"), "reduction"),
    **dict.fromkeys(("while", "call", "conditional"), "control"),
}


def _computations(hlo_text: str) -> dict[str, list[tuple[str, str, str, bool]]]:
    """computation name → its instructions as (name, opcode, rest of the line, is root)."""
    computations: dict[str, list[tuple[str, str, str, bool]]] = {}
    current: list | None = None
    for line in hlo_text.splitlines():
        if current is None or line.rstrip().endswith("{"):
            match = _COMPUTATION.match(line)
            if match and "=" not in line.split("{")[0].split("(")[0]:
                current = computations.setdefault(match.group(1), [])
                continue
        if line.strip() == "}":
            current = None
            continue
        match = _INSTRUCTION.match(line)
        if match and current is not None:
            current.append((match.group(1), match.group(2), match.group(3), line.lstrip().startswith("ROOT")))
    return computations


def _fusion_kind(body: list[tuple[str, str, str, bool]], computations) -> str:
    opcodes = {op for _, op, _, _ in body}
    nested = [c for _, op, rest, _ in body if op in ("fusion", "call") for c in _CALLS.findall(rest)]
    for name in nested:  # fusions inside fusions (XLA:CPU's nested fusions)
        opcodes |= {op for _, op, _, _ in computations.get(name, [])}
    if opcodes & {"dot", "convolution"}:
        return "matmul"
    if {"xor", "shift-right-logical"} <= opcodes or "rng-bit-generator" in opcodes:
        return "random bits"
    root = next((op for _, op, _, is_root in body if is_root), "")
    if root in ("transpose", "copy") or opcodes <= {"parameter", "transpose", "copy", "bitcast", "reshape", "tuple"}:
        return "layout"
    if root in ("reduce", "reduce-window") or "reduce" in opcodes:
        return "reduction"
    return "elementwise"


def op_kinds(hlo_text: str) -> dict[str, str]:
    """Every instruction of a compiled HLO module (all computations) → its kind (module docstring)."""
    computations = _computations(hlo_text)
    kinds = {}
    for body in computations.values():
        for name, opcode, rest, _ in body:
            kind = _OPCODE_KINDS.get(opcode, "elementwise")
            if opcode in ("fusion", "custom-call") and (called := _CALLS.findall(rest)):
                kind = _fusion_kind(computations.get(called[0], []), computations)
            if opcode == "custom-call" and "matmul" in rest.lower():
                kind = "matmul"
            kinds[name] = kind
    return kinds


def _trace_events(trace_dir: Path):
    paths = sorted(Path(trace_dir).rglob("*.xplane.pb"), key=lambda p: p.stat().st_mtime)
    if not paths:
        raise FileNotFoundError(f"{trace_dir}: no profiler trace (*.xplane.pb) under it")
    data = jax.profiler.ProfileData.from_file(str(paths[-1]))
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if "hlo_op" in stats:
                    yield str(stats["hlo_op"]), str(stats.get("hlo_module", "")), event.duration_ns


def op_breakdown(trace_dir: str | Path, compiled, steps: int) -> dict:
    """{"kinds": {kind: {"ms_per_step", "share"}}, "top_ops": [(op, kind, ms_per_step), ...20], "op_ms_per_step"}
    of the `steps` calls of `compiled` recorded under `trace_dir` (module docstring)."""
    kinds = op_kinds(compiled.as_text())
    per_op: dict[str, float] = defaultdict(float)
    for op, _, duration_ns in _trace_events(Path(trace_dir)):
        per_op[op] += duration_ns / 1e6 / steps
    if not per_op:
        raise ValueError(f"{trace_dir}: the trace holds no executed HLO operations")
    per_kind = dict.fromkeys(KINDS, 0.0)
    for op, ms in per_op.items():
        per_kind[kinds.get(op, kinds.get(op.split(".")[0], "elementwise"))] += ms
    total = sum(ms for kind, ms in per_kind.items() if kind != "control")
    top = sorted(per_op.items(), key=lambda item: -item[1])[:20]
    return {
        "op_ms_per_step": total,
        "kinds": {k: {"ms_per_step": ms, "share": 0.0 if k == "control" else ms / total} for k, ms in per_kind.items()},
        "top_ops": [(op, kinds.get(op, "elementwise"), ms) for op, ms in top],
    }


def format_breakdown(breakdown: dict) -> str:
    lines = [f"op time per step (summed over threads): {breakdown['op_ms_per_step']:,.0f} ms"]
    for kind, row in sorted(breakdown["kinds"].items(), key=lambda item: -item[1]["ms_per_step"]):
        lines.append(f"  {kind:<12} {row['ms_per_step']:>10,.1f} ms  {100 * row['share']:5.1f}%")
    return "\n".join(lines)
