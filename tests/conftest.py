import os

import pytest

# Tests run on the CPU with the default single device unless a test spawns its own process.
os.environ.setdefault("JAX_PLATFORMS", "cpu")


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
