"""The README's Python example runs as written."""

import re
from pathlib import Path


def test_readme_python_example_runs():
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert blocks, "the README has a Python example"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    assert namespace["out"].shape == (2, 256, 4, 32)
    assert namespace["y"].shape == (2, 256, 128)
