"""On an accelerator, float32 products run at full float32 precision in the kernel tests.

XLA and Triton compute float32 dots in TF32 on a GPU by default (10-bit mantissa). The kernels compute the same
function either way, but ReLU attention's gradient is discontinuous where a score crosses zero: a score that TF32
rounds across zero adds or drops a whole term of dq, dk or dv (on an H200: dq relative errors of 0.16-0.24 against
the fp32 reference for the XLA impl at T 29, and 1-2% for the Triton kernels' row statistics). With float32
products the tests check the algorithms at the precision their fp32 bounds assume. Half-precision products are
exact in the fp32 accumulators either way; where a kernel upcasts to float32 (the linear kernels' fp32 state),
those products are exact here too. What users get by default, TF32, is measured by `kernels.bench --check` (each
impl at default precision against the fp32 reference). On the CPU float32 products are exact anyway.
"""

import jax
import pytest


@pytest.fixture(autouse=True)
def _float32_products_at_float32_precision():
    if jax.default_backend() == "cpu":
        yield
        return
    with jax.default_matmul_precision("highest"):
        yield
