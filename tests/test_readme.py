"""The README's and kernels/README.md's Python examples run as written."""

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


def test_the_kernels_readme_example_runs_and_agrees_with_the_reference():
    import jax.numpy as jnp

    import kernels

    readme = (Path(__file__).parents[1] / "kernels" / "README.md").read_text()
    namespace: dict = {}
    exec(compile(re.findall(r"```python\n(.*?)```", readme, flags=re.S)[0], "kernels/README.md", "exec"), namespace)
    q, k, v, mask, gamma = (namespace[name] for name in ("q", "k", "v", "mask", "gamma"))
    reference = kernels.ReluAttentionOptions(impl="reference")
    expected = kernels.relu_attention(q, k, v, causal=True, key_mask=mask, gamma=gamma, options=reference)
    assert namespace["out"].shape == (2, 256, 4, 64)
    assert float(jnp.max(jnp.abs(namespace["out"] - expected))) < 1e-4
