"""The shape the training loop and the models keep: parts short enough to read and test one at a time."""

import ast
from pathlib import Path

REPO = Path(__file__).parents[1]
LONGEST = 80  # lines, decorators and docstring included


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            yield node.name, start, node.end_lineno - start + 1


def test_no_function_in_the_loop_or_the_models_is_longer_than_80_lines():
    too_long = [
        f"{path.relative_to(REPO)}:{line} {name} ({length} lines)"
        for package in ("zoo/training", "zoo/models")
        for path in sorted((REPO / package).rglob("*.py"))
        for name, line, length in _functions(path)
        if length > LONGEST
    ]
    assert not too_long, f"split these into parts of at most {LONGEST} lines: {too_long}"


def test_the_length_check_counts_a_long_function_and_its_decorators(tmp_path):
    source = tmp_path / "long.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(LONGEST))
    source.write_text(f"@decorator\ndef long():\n{body}\n\ndef short():\n    return 1\n")
    assert dict((name, length) for name, _, length in _functions(source)) == {"long": LONGEST + 2, "short": 2}
