import os
from pathlib import Path

import pytest

# Tests run on the CPU with the default single device unless a test spawns its own process.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# A persistent compilation cache, shared by the pytest workers, the commands tests start (they inherit the
# environment) and later runs: the same small models compile in many tests. Set before jax is imported.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(Path(__file__).parents[1] / ".cache" / "jax-tests"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "lowering: checks what a kernel lowers to for another platform (jax.export); runs on the CPU only",
    )


def pytest_collection_modifyitems(config, items):
    """On an accelerator the kernels themselves run, so the CPU's cross-platform lowering checks are skipped
    there (they cost minutes of a rare GPU window and show nothing the real runs do not)."""
    import jax

    if jax.default_backend() == "cpu":
        return
    skip = pytest.mark.skip(reason=f"lowering check: runs in CI on the CPU, not on {jax.default_backend()}")
    for item in items:
        if "lowering" in item.keywords:
            item.add_marker(skip)
