"""XLA settings of the test suite: cheap compilation for the many small programs, full optimisation for the few
commands whose training steps, not their compilation, take the time."""

import os

import jaxlib  # its version only: XLA reads XLA_FLAGS later, when jax starts a backend

# LLVM's cheapest settings and XLA:CPU's older (non-MLIR) fusion emitters. Measured on this 2-core CPU with a cold
# compilation cache: LLVM's settings compile about 40% faster (tests/zoo/test_scan_layers.py); the older emitters
# take another 25-35% off (test_scan_layers.py's unrolled-loss cases 33 → 25 s; tests/kernels/test_relu_attention.py
# with tests/zoo/test_decoding.py 147 → 97 s). No result changes beyond float rounding, which every comparison here
# tolerates; the compiled code runs about 1.7× slower (the ListOps demo model's train step). LLVM's code generation
# in one piece rather than split over threads: a pytest worker shares its 2 cores with another, and the ListOps and
# Text demo train steps compiled 6-12% faster so (1.14 → 1.00 s, 1.59 → 1.49 s; quiet machine, three runs each).
# jaxlib 0.11 has only the new emitters, and aborts on a flag it does not know.
_OLD_EMITTERS = (
    " --xla_cpu_use_fusion_emitters=false" if tuple(map(int, jaxlib.__version__.split(".")[:2])) < (0, 11) else ""
)
FAST_COMPILE = (
    f"--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true{_OLD_EMITTERS}"
    " --xla_cpu_parallel_codegen_split_count=1"
)

# One thread per matmul: the suite runs one pytest worker per core, and a worker's (or its command's) Eigen
# thread pool as wide as the machine only competes with the other worker. Measured on this 2-core CPU, cold cache,
# tests/zoo with tests/lra_flax/test_train_cli.py: 307 → 283 s, CPU time 581 → 540 s (three workers instead:
# 290 s). Kept by optimised_env(): the commands that train for hundreds of steps run beside a worker too.
ONE_THREAD = "--xla_cpu_multi_thread_eigen=false"


def optimised_env(**extra: str) -> dict[str, str]:
    """The environment for a command that trains for hundreds of steps: this process's, without FAST_COMPILE."""
    flags = os.environ.get("XLA_FLAGS", "").replace(FAST_COMPILE, "")
    return {**os.environ, "XLA_FLAGS": " ".join(flags.split()), **extra}
