import importlib.util
import os
import sys
from pathlib import Path

import pytest

from tests.deprecations import attribute_to_callers
from tests.xla_flags import FAST_COMPILE, ONE_THREAD

attribute_to_callers()  # a dependency's stacklevel-1 deprecation: attributed to its caller (tests/deprecations.py)

# Tests run on the CPU with the default single device unless a test spawns its own process.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# A persistent compilation cache, shared by the pytest workers, the commands tests start (they inherit the
# environment) and later runs: the same small models compile in many tests. Every program is kept, however quick
# its compile: most of the suite's ~1,000 programs compile in under 0.2 s and together they are most of its time
# (tests/zoo/test_mixers.py with test_decoding.py, the second run: 41 s keeping those over 0.2 s, 24 s keeping
# all). Set before jax is imported. JAX compresses the entries with zstandard where it can import it (the test
# extra installs it), else with zlib, and reads them the same way; the two formats get their own directories, as
# JAX never replaces an entry it cannot read. zlib took 3.5 ms a program to compress, zstandard 0.37 ms (400 of the
# suite's programs, 65 MB: 16.0 against 9.3 MB compressed); the suite writes ~7,700 programs from a cold cache.
_COMPRESSION = "zstd" if importlib.util.find_spec("zstandard") or sys.version_info >= (3, 14) else "zlib"
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", str(Path(__file__).parents[1] / ".cache" / f"jax-tests-{_COMPRESSION}")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# The commands the suite starts get transparent huge pages for malloc, as under `make test` (see the Makefile).
os.environ.setdefault("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
# The suite starts ~150 training commands: each would spend half a second of both cores measuring the host's
# matmul rate for MFU, which no test reads; tests/zoo/test_flops.py measures it, with this unset.
os.environ.setdefault("ZOO_CPU_PEAK_TFLOPS", "0.1")
# The tests' programs are small: compiling them is most of the suite's time, running them little (xla_flags.py).
# These are XLA:CPU's settings: a GPU's XLA aborts at start on flags it does not know, and the kernel tests on a GPU
# compile as its users do.
if os.environ["JAX_PLATFORMS"] == "cpu":
    if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()
    if "xla_cpu_multi_thread_eigen" not in os.environ["XLA_FLAGS"]:
        os.environ["XLA_FLAGS"] += f" {ONE_THREAD}"


# Test files whose tests start commands or train models end to end (seconds to minutes each): `make test-fast`
# (`-m "not e2e"`) leaves them out, with every test marked slow; `make test` runs everything.
END_TO_END_FILES = frozenset(
    {
        "launch/test_launch_scripts.py",
        "lra_flax/test_compare.py",
        "lra_flax/test_distributed.py",
        "lra_flax/test_image_pathfinder_train.py",
        "lra_flax/test_mixer_families.py",
        "lra_flax/test_text_retrieval_train.py",
        "lra_flax/test_train_cli.py",
        "mlm_flax/test_mlm_task.py",
        "mt_flax/test_bench_decode.py",
        "mt_flax/test_translation_e2e.py",
        "studies/test_studies.py",
        "test_failure_report.py",
        "test_gpu_session.py",
        "zoo/test_io_errors.py",
        "zoo/test_remote_workdir.py",
        "zoo/test_sharding.py",
    }
)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "lowering: checks what a kernel lowers to for another platform (jax.export); runs on the CPU only",
    )
    config.addinivalue_line("markers", "e2e: starts commands or trains end to end; `make test-fast` skips these")


def pytest_collection_modifyitems(config, items):
    """Marks the end-to-end tests (`e2e`); they stay where they are collected, among the unit tests: run first,
    both workers waited on commands (timeouts, hangs, other processes) together, and a fresh clone's suite kept
    the 2 cores 168% busy instead of 186%. On an accelerator the kernels themselves run, so the CPU's
    cross-platform lowering checks are skipped there (they cost minutes of a rare GPU window and show nothing the
    real runs do not)."""
    import jax

    tests_dir = Path(__file__).parent
    for item in items:
        if "slow" in item.keywords or item.path.relative_to(tests_dir).as_posix() in END_TO_END_FILES:
            item.add_marker(pytest.mark.e2e)

    if jax.default_backend() == "cpu":
        return
    skip = pytest.mark.skip(reason=f"lowering check: runs in CI on the CPU, not on {jax.default_backend()}")
    for item in items:
        if "lowering" in item.keywords:
            item.add_marker(skip)
