"""What `impl="auto"` runs: one reviewed table, per op and device generation.

An entry names an implementation, the device generation (`kernels.platforms.device_class`: "cuda-sm90",
"tpu-v5e", ...), the jax minor version its tests passed under (Pallas changes between minors), the attention mode
and the shortest key length it runs from, the dtypes and the largest head dim its benchmark measured, and the two
committed files it rests on: the test run that passed on that hardware and the benchmark that timed it. An
implementation enters only from a run where its tests passed on the hardware; one that only lowered or ran in
interpret mode never does. Where no entry matches, "auto" runs "xla". A CPU has no entry: the Pallas kernels run
there only in interpret mode.

`python -m kernels` prints the table and what "auto" picks on this machine; docs/kernels.md holds its
`--markdown` output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from kernels import platforms

# `pallas_backend`'s names (with impl "pallas", the older way to name a Pallas build; `KernelOptions` says each).
PALLAS_BACKENDS = ("tpu", "gpu", "triton", "mosaic_gpu")
OPS = ("relu_attention", "linear_attention", "softmax_attention")
# The implementations an entry may name, per op: the Pallas builds, and JAX's own for softmax.
AUTO_IMPLS = {
    "relu_attention": ("triton", "mosaic_gpu", "mosaic_tpu"),
    "linear_attention": ("triton", "mosaic_gpu", "mosaic_tpu"),
    "softmax_attention": ("cudnn", "splash"),
}
# Device generations the project's users run on, whether or not the table has an entry for them.
GENERATIONS = ("cpu", "cuda-sm80", "cuda-sm90", "cuda-sm100", "tpu-v5e", "tpu-v5p", "tpu-v6e")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Entry:
    """One row of `TABLE` (module docstring); `mode`: "causal", "full" or "both"; `tests`, `benchmark`: paths from
    the repository root."""

    op: str
    device: str
    impl: str
    jax_minor: str
    mode: str
    min_length: int
    dtypes: tuple[str, ...]
    max_head_dim: int
    tests: str
    benchmark: str

    def __post_init__(self):
        where = f"kernels.auto entry {self.op}/{self.impl}/{self.device}"
        if self.op not in OPS or self.impl not in AUTO_IMPLS[self.op]:
            raise ValueError(f"{where}: unknown op or implementation")
        if self.mode not in ("causal", "full", "both"):
            raise ValueError(f"{where}: mode must be causal, full or both, got {self.mode!r}")
        if not self.tests.startswith("benchmarks/gpu/") or not self.benchmark.startswith("benchmarks/"):
            raise ValueError(f"{where}: tests must cite a file under benchmarks/gpu/, benchmark one under benchmarks/")

    def refusal(self, *, causal: bool, length: int, dtype, head_dim: int) -> str | None:
        """Why this entry does not speak for these inputs (None: it does)."""
        if self.mode != "both" and self.mode != ("causal" if causal else "full"):
            return f"measured for {self.mode} attention only"
        if length < self.min_length:
            return f"runs from length {self.min_length}, not {length}"
        if jnp.dtype(dtype).name not in self.dtypes:
            return f"measured in {', '.join(self.dtypes)}, not {jnp.dtype(dtype).name}"
        if head_dim > self.max_head_dim:
            return f"measured at head dims ≤ {self.max_head_dim}, not {head_dim}"
        return None


H200_BENCH = "benchmarks/kernels-gpu-nvidia_h200.json"

TABLE: tuple[Entry, ...] = (
    # Tests: 15 of 15 passed on an H200. Bench (bf16, D 128, H 16, 65,536 tokens): causal forward+backward 10.92 ms
    # against xla's 19.32 at T 4K and 18.11 against 26.10 at 16K; full attention lost at 16K (7.46 against 5.16).
    # T 4K was the shortest length measured.
    Entry(
        op="linear_attention", device="cuda-sm90", impl="triton", jax_minor="0.11", mode="causal", min_length=4096,
        dtypes=("bfloat16",), max_head_dim=128,
        tests="benchmarks/gpu/2026-11-28-h200/call2-kernel_passes.json", benchmark=H200_BENCH,
    ),
    # Tests: cuDNN against the fp32 reference, outputs and gradients, causal and not, padded keys: 4 of 4 passed
    # on an H200 (the file's other failures were float32 XLA under TF32). Bench: the baseline of every row there.
    Entry(
        op="softmax_attention", device="cuda-sm90", impl="cudnn", jax_minor="0.11", mode="both", min_length=1,
        dtypes=("bfloat16", "float16"), max_head_dim=128,
        tests="benchmarks/gpu/2026-11-28-h200/call3-softmax-cudnn.txt", benchmark=H200_BENCH,
    ),
)  # fmt: skip


def pick(
    op: str,
    *,
    causal: bool,
    length: int,
    dtype,
    head_dim: int,
    refusals: dict[str, Callable[[], str | None]] | None = None,
    device: str | None = None,
    jax_version: str = jax.__version__,
    table: tuple[Entry, ...] | None = None,
) -> str:
    """The implementation "auto" runs for `op` here: the first entry of `table` for this device generation and jax
    minor that speaks for these inputs and whose implementation takes them (`refusals[impl]()` is None where
    given), else "xla". `device`: a generation name (default: this machine's)."""
    device = device or platforms.device_class()
    minor = ".".join(jax_version.split(".")[:2])
    for entry in TABLE if table is None else table:
        if (entry.op, entry.device, entry.jax_minor) != (op, device, minor):
            continue
        if entry.refusal(causal=causal, length=length, dtype=dtype, head_dim=head_dim) is not None:
            continue
        refusal = (refusals or {}).get(entry.impl)
        if refusal is None or refusal() is None:
            return entry.impl
    return "xla"


def passed(op: str, impl: str, device: str, jax_version: str = jax.__version__, table=None) -> bool:
    """Whether `impl`'s tests for `op` passed on `device` under this jax minor (it has an entry there)."""
    minor = ".".join(jax_version.split(".")[:2])
    entries = TABLE if table is None else table
    return any((e.op, e.impl, e.device, e.jax_minor) == (op, impl, device, minor) for e in entries)


def resolve_pallas_backend(
    requested: str | None,
    mosaic_refusal: Callable[[], str | None],
    capability: tuple[int, int] | str | None = "local",
    op: str = "relu_attention",
    table: tuple[Entry, ...] | None = None,
) -> str:
    """The Pallas build `requested` (a `PALLAS_BACKENDS` name) means here: "tpu", "mosaic_gpu", "gpu" (the Triton
    kernels built for a GPU) or the running platform's name when that is neither (the Triton kernels,
    interpreted). `mosaic_refusal()` says why the Mosaic GPU kernels cannot take the inputs (None: they can);
    `capability` defaults to the local GPU's. "gpu" picks Mosaic GPU on Hopper only where `op`'s Mosaic GPU
    kernels have an entry in `table` (default `TABLE`) for that generation."""
    backend = requested or jax.default_backend()
    if backend == "triton":
        return "gpu"
    if backend != "gpu":
        return backend
    if capability == "local":
        capability = platforms.gpu_compute_capability()
    hopper = capability is not None and capability[0] == 9  # Mosaic GPU only where its tests passed on Hopper
    if hopper and passed(op, "mosaic_gpu", f"cuda-sm{capability[0]}{capability[1]}", table=table):
        return "mosaic_gpu" if mosaic_refusal() is None else "gpu"
    return "gpu"


def markdown(table: tuple[Entry, ...] | None = None) -> str:
    """The table as docs/kernels.md shows it: one row per entry, then "xla" for everything else."""
    lines = [
        "| op | device | auto runs | jax | mode | from length | dtypes | head dim ≤ | rests on |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in TABLE if table is None else table:
        lines.append(
            f"| {e.op} | {e.device} | {e.impl} | {e.jax_minor} | {e.mode} | {e.min_length:,} | {', '.join(e.dtypes)} "
            f"| {e.max_head_dim} | `{e.tests}`, `{e.benchmark}` |"
        )
    lines.append("| every other case | any (CPU: always) | xla | | | | | | |")
    return "\n".join(lines) + "\n"
