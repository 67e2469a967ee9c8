"""docs/architecture.md's two import graphs — the packages' and the parts of `zoo` — are the source's imports,
read with `ast` (every import statement, at any depth), with no edge missing and none extra; and no module of the
project reaches itself through its imports."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.packages import PACKAGES

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
ARROW = "◄──"


def imported_modules(path: Path) -> set[str]:
    """Every absolute module an import statement in `path` names (`from a.b import c` names a.b and a.b.c)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def zoo_part(module: str) -> str | None:
    """The node of the `zoo` graph a module belongs to: `kernels`, `zoo.<subpackage or module>`, or None."""
    parts = module.split(".")
    if parts[0] == "kernels":
        return "kernels"
    return f"zoo.{parts[1]}" if parts[0] == "zoo" and len(parts) > 1 else None


def source_edges() -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(importer, imported) between the packages, and between the parts of `zoo` (and `kernels`)."""
    packages, parts = set(), set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            modules = imported_modules(path)
            tops = {m.split(".")[0] for m in modules}
            packages |= {(package, top) for top in tops if top in PACKAGES and top != package}
            if package == "zoo":
                importer = zoo_part(".".join(path.relative_to(ROOT).with_suffix("").parts))
                parts |= {(importer, p) for m in modules if (p := zoo_part(m)) and p not in (importer, "zoo.__init__")}
    return packages, parts


def chain_edges(block: str) -> set[tuple[str, str]]:
    """The edges of `A ◄── B ◄── C` chains (B imports A, C imports B). A line that starts with an arrow continues
    the name of an earlier line that ends in the column just before it; parenthesised notes are ignored."""
    edges: set[tuple[str, str]] = set()
    earlier: list[list[re.Match]] = []
    for line in block.splitlines():
        tokens = list(re.finditer(rf"{ARROW}|[A-Za-z_][\w.]*", re.sub(r"\([^)]*\)", lambda m: " " * len(m[0]), line)))
        if not tokens:
            continue
        names = [t[0] for t in tokens]
        if names[0] == ARROW:
            column = tokens[0].start()
            above = next(t[0] for row in reversed(earlier) for t in row if t[0] != ARROW and t.end() == column - 1)
            names = [above, *names]
        for i in range(1, len(names) - 1, 2):
            edges.add((names[i + 1], names[i - 1]))
        earlier.append(tokens)
    return edges


def table_edges(text: str) -> set[tuple[str, str]]:
    """The edges of the `| part | imports |` table: every backticked name in a row's second cell is imported by
    every backticked name in its first."""
    edges = set()
    for row in re.findall(r"^\| (`zoo[^|]*) \| ([^|]*) \|$", text, flags=re.M):
        importers, imported = (re.findall(r"`([\w.]+)`", cell) for cell in row)
        edges |= {(a, b) for a in importers for b in imported}
    return edges


def test_the_package_graph_is_the_source_s():
    block = re.search(r"## The package graph.*?```\n(.*?)```", DOC.read_text(), flags=re.S)[1]
    documented = {(a, b) for a, b in chain_edges(block) if a in PACKAGES and b in PACKAGES}
    real, _ = source_edges()
    assert documented == real, {"missing from the doc": real - documented, "not in the source": documented - real}


def test_the_zoo_graph_is_the_source_s():
    documented = table_edges(DOC.read_text())
    _, real = source_edges()
    assert documented == real, {"missing from the doc": real - documented, "not in the source": documented - real}


def test_the_readers_take_chains_continuations_and_table_rows():
    block = "a ◄── b ◄── c\n        ◄── d   (a note ◄── x)\n"
    assert chain_edges(block) == {("b", "a"), ("c", "b"), ("d", "b")}
    table = "| part | imports |\n|---|---|\n| `zoo.x`, `zoo.y` | `zoo.z` (why), `kernels` |\n"
    assert table_edges(table) == {("zoo.x", "zoo.z"), ("zoo.y", "zoo.z"), ("zoo.x", "kernels"), ("zoo.y", "kernels")}


def module_edges() -> dict[str, set[str]]:
    """Module → the project's modules it imports, at any depth (a package Python initialises on the way to a
    submodule is not an edge: every module would reach its package's `__init__`)."""

    def name(path: Path) -> str:
        parts = path.relative_to(ROOT).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    paths = {name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}

    def targets(path: Path) -> set[str]:  # `from a import b` is an edge to a.b when that is a module, else to a
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                subs = {f"{node.module}.{alias.name}" for alias in node.names} & paths.keys()
                found |= subs | ({node.module} if len(subs) < len(node.names) else set())
        return found & paths.keys()

    return {m: targets(path) - {m} for m, path in paths.items()}


def test_no_module_imports_itself_through_others():
    from tests.kernels.test_import_graph import find_cycle

    cycle = find_cycle(module_edges())
    assert cycle is None, "import circle: " + " → ".join(cycle)
