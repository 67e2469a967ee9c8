"""The `kernels` package's layout and imports, read from its source with `ast` (module-level and function-level
statements): one folder per op with its public op (api.py), reference, XLA impl and one file per backend; no
circle, no implementation that reaches its op's dispatcher, no module that takes another's private names, and
nothing imported from outside jax, numpy and the standard library."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = "kernels"
PACKAGE_DIR = Path(__file__).resolve().parents[2] / PACKAGE
OPS = ("relu_attention", "linear_attention", "softmax_attention")
# Each op's public module (its dispatch); every other module of the op's folder is one of its implementations.
DISPATCHERS = {f"kernels.{op}.api" for op in OPS}
# What an op's folder may hold besides api.py and __init__.py: the definition, the XLA impl, one file per backend.
IMPLEMENTATION_FILES = {"reference", "xla", "triton", "mosaic_gpu", "mosaic_tpu"}
ALLOWED_OUTSIDE = {"jax", "jaxlib", "numpy"}  # and the standard library


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR).with_suffix("").parts
    return ".".join((PACKAGE, *parts[:-1]) if parts[-1] == "__init__" else (PACKAGE, *parts))


def imports(path: Path, modules: set[str]) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, imported module, names taken from it) for every import statement in the file, at any depth.

    `from kernels import x` imports the submodule `kernels.x` when there is one. Relative imports are resolved
    against the package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: `from .x import y` inside kernels/
                base = ".".join(filter(None, [PACKAGE, base]))
            names = tuple(alias.name for alias in node.names)
            submodules = [f"{base}.{name}" for name in names if f"{base}.{name}" in modules]
            found += [(node.lineno, sub, ()) for sub in submodules]
            if len(submodules) < len(names):
                found.append((node.lineno, base, tuple(n for n in names if f"{base}.{n}" not in modules)))
    return sorted(found, key=lambda item: item[0])


def package_imports() -> dict[str, list[tuple[int, str, tuple[str, ...]]]]:
    paths = sorted(PACKAGE_DIR.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports(p, modules) for p in paths}


def graph(statements: dict[str, list[tuple[int, str, tuple[str, ...]]]]) -> dict[str, set[str]]:
    """Module → the package's modules it imports (explicitly; a parent package that Python initialises on the
    way is not an edge, or every module would reach `kernels/__init__.py`)."""
    return {m: {target for _, target, _ in found if target in statements} for m, found in statements.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A circle of imports as [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, str] = {}  # "open" while on the stack, "done" after
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


STATEMENTS = package_imports()
EDGES = graph(STATEMENTS)
BACKENDS = sorted(m for m in EDGES if m.count(".") == 2 and m.split(".")[2] in IMPLEMENTATION_FILES)


def test_each_op_is_one_folder_of_its_api_reference_xla_and_backends():
    for op in OPS:
        files = {p.stem for p in (PACKAGE_DIR / op).glob("*.py")} - {"__init__", "api"}
        assert {"reference", "xla"} <= files <= IMPLEMENTATION_FILES, (op, sorted(files))
    assert not [p for p in PACKAGE_DIR.glob("*_attention*.py")], "an op's module outside its folder"


def test_the_walk_sees_the_package_and_its_lazy_imports():
    known = {
        f"kernels.{op}.{build}"
        for op in OPS[:2]
        for build in ("reference", "xla", "triton", "mosaic_gpu", "mosaic_tpu")
    }
    assert DISPATCHERS <= set(EDGES) and known | {"kernels.softmax_attention.mosaic_tpu"} <= set(BACKENDS), sorted(
        EDGES
    )
    # Function-level imports count: the Mosaic GPU builders import plgpu inside functions.
    assert any(target == "jax.experimental.pallas" for _, target, _ in STATEMENTS["kernels.mosaic_gpu_tiles"])
    assert "kernels.numerics" in EDGES["kernels.relu_attention.triton"]


def test_the_package_has_no_import_circle():
    cycle = find_cycle(EDGES)
    assert cycle is None, "import circle: " + " → ".join(cycle)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_backend_never_reaches_a_dispatcher(backend):
    """An implementation takes shared helpers from `kernels.numerics` (or `triton_tiles`, `mosaic_gpu_tiles`, its
    op's reference), never from the ops that dispatch to it, directly or through another module."""
    reached = reachable(EDGES, backend) & (DISPATCHERS | {PACKAGE})
    assert not reached, f"{backend} imports {', '.join(sorted(reached))}, directly or through another module"


def test_no_module_takes_another_modules_private_names():
    taken = [
        f"{m}:{line} takes {name} from {target}"
        for m, found in STATEMENTS.items()
        for line, target, names in found
        for name in names
        if target.startswith(PACKAGE) and target != m and name.startswith("_")
    ]
    assert not taken, taken


def test_the_package_imports_only_jax_numpy_and_the_standard_library():
    allowed = ALLOWED_OUTSIDE | set(sys.stdlib_module_names) | {"__future__", PACKAGE}
    outside = [
        f"{m}:{line} imports {target}"
        for m, found in STATEMENTS.items()
        for line, target, _ in found
        if target.split(".")[0] not in allowed
    ]
    assert not outside, outside


def test_the_cycle_finder_reports_a_circle_and_the_walk_resolves_imports(tmp_path):
    """The checks above are only as good as these two pieces: a circle is found and named, and every form of
    import statement becomes the edge it is."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    source = tmp_path / "x.py"
    source.write_text(
        "import kernels.numerics as n\n"
        "from kernels import triton_tiles, EPS_MODES\n"
        "def f():\n"
        "    from kernels.relu_attention.api import _prepare\n"
        "    from .checks import check_causal\n"
    )
    modules = {"kernels", "kernels.numerics", "kernels.triton_tiles", "kernels.relu_attention.api", "kernels.checks"}
    assert imports(source, modules) == [
        (1, "kernels.numerics", ()),
        (2, "kernels.triton_tiles", ()),
        (2, "kernels", ("EPS_MODES",)),
        (4, "kernels.relu_attention.api", ("_prepare",)),
        (5, "kernels.checks", ("check_causal",)),
    ]


# The Pallas platform modules and JAX's splash kernels: together 0.17 s of a process's start-up on CPU, and only
# the kernels built for that platform need them.
PLATFORM_MODULES = (
    "jax.experimental.pallas.tpu",
    "jax.experimental.pallas.triton",
    "jax.experimental.pallas.mosaic_gpu",
    "jax.experimental.pallas.ops.tpu.splash_attention",
)


def test_importing_the_package_leaves_the_pallas_platform_modules_to_the_kernels_that_use_them():
    probe = f"import sys, kernels; print([m for m in {PLATFORM_MODULES!r} if m in sys.modules])"
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]", run.stdout


def test_the_platform_modules_are_imported_where_a_kernel_is_built():
    """The other half: the functions that use them import them, so a TPU or Triton kernel still builds."""
    aliases = ("pltpu", "pl_triton", "plgpu", "splash")  # the names the package imports PLATFORM_MODULES as
    missing = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        tree = ast.parse(path.read_text())
        outermost = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        outermost += [
            m for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body if isinstance(m, ast.FunctionDef)
        ]
        for node in outermost:  # with the functions nested in it, which use its imports
            used = {
                n.value.id for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            }
            imported = {
                alias.asname or alias.name for n in ast.walk(node) if isinstance(n, ast.ImportFrom) for alias in n.names
            }
            missing += [
                f"{path.name}:{node.lineno} {node.name} uses {alias}" for alias in aliases if alias in used - imported
            ]
    assert not missing, missing
