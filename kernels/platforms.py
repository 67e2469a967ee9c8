"""Which Pallas kernels run where, and which of them `impl="auto"` may choose.

`pallas_backend` (both ops share the rule):

    "tpu"         the Mosaic TPU kernels (`*_tpu.py`)
    "triton"      the Triton kernels (`*_pallas.py`): any CUDA GPU
    "mosaic_gpu"  the Mosaic GPU kernels (`*_mgpu.py`): Hopper (wgmma), bf16/fp16, whole tiles
    "gpu"         by the GPU's compute capability: Mosaic GPU on Hopper (sm_90) for inputs those kernels take
                  *once they have passed their tests on a Hopper GPU* (the record below), Triton otherwise —
                  before Hopper (no wgmma/TMA), on Blackwell (wgmma is Hopper-only; its tcgen05 kernels are
                  not written), where no GPU is attached (lowering on a CPU with
                  `jax.export(..., platforms=["cuda"])`) and while Mosaic GPU has no recorded pass
    None          the running backend's ("gpu" on a GPU; on a CPU the Triton kernels in interpret mode)

`resolve_pallas_backend` names the Triton kernels "gpu" (the platform they are built for).

The record of what passed where. `kernel_passes.json` beside this file lists every run of a backend's kernel
tests on real hardware: op, backend, device class (`device_class()`: "cuda-sm90", "tpu-v5e", ...), device,
jax version, commit, date, whether every test passed, and — from a benchmark on that device — the length from
which the kernels beat the blocked XLA impl (`auto_from_length`; null: not measured or never faster; or one such
length for causal and one for full attention, `{"causal": 4096, "full": null}`, where the two cross over apart),
with the inputs that benchmark ran (`auto_dtypes`, `auto_max_head_dim`; required with a crossover).
A kernel that only lowered, or only ran in interpret mode, has not passed. `impl="auto"` picks "pallas" only where a
passing record exists for the op, the backend, this device class and this jax minor version (Pallas changes
between minors), only from its `auto_from_length` on, and only for inputs like those measured; everywhere else it
is "xla". `benchmarks/gpu/session.sh`
writes the records of a GPU run (`python -m kernels.platforms record`); they are committed here by hand.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import jax

PALLAS_BACKENDS = ("tpu", "gpu", "triton", "mosaic_gpu")
OPS = ("relu_attention", "linear_attention", "softmax_attention")
RECORDED_BACKENDS = ("triton", "mosaic_gpu", "tpu")  # the kernel builds a record names
ATTENTION_MODES = ("causal", "full")
PASSES_PATH = Path(__file__).with_name("kernel_passes.json")
# The test files that exercise each (op, backend) build on the hardware it is built for.
TEST_FILES = {
    ("relu_attention", "triton"): "tests/kernels/test_relu_attention_triton.py",
    ("linear_attention", "triton"): "tests/kernels/test_linear_attention_triton.py",
    ("relu_attention", "mosaic_gpu"): "tests/kernels/test_relu_attention_mosaic_gpu.py",
    ("linear_attention", "mosaic_gpu"): "tests/kernels/test_linear_attention_mosaic_gpu.py",
    ("relu_attention", "tpu"): "tests/kernels/test_relu_attention_mosaic_tpu.py",
    ("linear_attention", "tpu"): "tests/kernels/test_linear_attention_mosaic_tpu.py",
    ("softmax_attention", "tpu"): "tests/kernels/test_softmax_attention_mosaic_tpu.py",  # JAX's splash attention
}


def gpu_compute_capability() -> tuple[int, int] | None:
    """(major, minor) of the first local GPU, or None when no GPU backend is attached."""
    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        return None
    capability = getattr(devices[0], "compute_capability", None) if devices else None
    if not capability:
        return None
    major, _, minor = str(capability).partition(".")
    if not (major.isdigit() and (minor or "0").isdigit()):  # not a CUDA "major.minor" (e.g. ROCm's gfx names)
        return None
    return int(major), int(minor or 0)


def device_class(device=None) -> str:
    """The class a kernel record is kept per: "cuda-sm90" (compute capability), "tpu-v5e" (TPU generation from
    the device kind), "cpu"; other platforms by name. `device`: a jax device (default: the first local one)."""
    device = device or jax.devices()[0]
    if device.platform == "gpu":
        capability = str(getattr(device, "compute_capability", "") or "")
        major, _, minor = capability.partition(".")
        if major.isdigit():
            return f"cuda-sm{major}{minor or 0}"
        return "gpu-" + re.sub(r"[^a-z0-9]+", "-", device.device_kind.lower()).strip("-")
    if device.platform == "tpu":
        kind = device.device_kind.lower()  # "TPU v4", "TPU v5 lite", "TPU v5p", "TPU v6 lite"
        match = re.search(r"v(\d+)\s*(lite|e|p)?", kind)
        if match:
            suffix = {"lite": "e", "e": "e", "p": "p", None: ""}[match.group(2)]
            return f"tpu-v{match.group(1)}{suffix}"
        return "tpu-" + re.sub(r"[^a-z0-9]+", "-", kind).strip("-")
    return device.platform


def jax_minor(version: str) -> str:
    """ "0.11.2" → "0.11": records count for the jax minor version they ran under."""
    return ".".join(version.split(".")[:2])


@dataclasses.dataclass(frozen=True)
class KernelRun:
    """One run of a kernel build's tests on real hardware (module docstring)."""

    op: str
    backend: str
    device_class: str
    device: str
    jax_version: str
    commit: str
    date: str
    passed: bool
    tests: str  # what ran: "N passed, M failed, ..." or why it did not finish
    auto_from_length: int | dict[str, int | None] | None = None
    note: str = ""
    # The inputs that crossover was measured at, required with it: a benchmark on one shape says nothing about the
    # kernels' speed (or, for a larger state, whether they launch at all) at another. None without a crossover.
    auto_dtypes: list[str] | None = None  # input dtype names, e.g. ["bfloat16", "float16"]
    auto_max_head_dim: int | None = None  # the largest head dim (query/key features, values)

    def __post_init__(self):
        where = f"kernel record {self.op}/{self.backend}/{self.device_class}"
        if self.op not in OPS:
            raise ValueError(f"{where}: unknown op {self.op!r}; valid: {', '.join(OPS)}")
        if self.backend not in RECORDED_BACKENDS:
            raise ValueError(f"{where}: unknown backend {self.backend!r}; valid: {', '.join(RECORDED_BACKENDS)}")
        if not isinstance(self.passed, bool):
            raise ValueError(f"{where}: passed must be true or false, got {self.passed!r}")
        lengths = self.auto_from_length
        if isinstance(lengths, dict):
            if set(lengths) != set(ATTENTION_MODES):
                raise ValueError(f"{where}: auto_from_length by mode needs exactly the keys causal and full, got "
                                 f"{sorted(lengths)}")  # fmt: skip
            object.__setattr__(self, "auto_from_length", dict(lengths))  # the record's own copy
            lengths = tuple(lengths.values())
        else:
            lengths = (lengths,)
        if any(n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1) for n in lengths):
            raise ValueError(
                f"{where}: auto_from_length must be a whole number ≥ 1, null or {{causal: n, full: n}}, got "
                f"{self.auto_from_length!r}"
            )
        if any(n is not None for n in lengths) and not self.passed:
            raise ValueError(f"{where}: auto_from_length is set on a run that did not pass")
        self._check_measured_inputs(where, measured=any(n is not None for n in lengths))
        if not re.fullmatch(r"\d+\.\d+\.\d+\S*", self.jax_version):
            raise ValueError(f"{where}: jax_version {self.jax_version!r} is not a version like 0.11.2")
        try:
            datetime.date.fromisoformat(self.date)
        except ValueError:
            raise ValueError(f"{where}: date {self.date!r} is not YYYY-MM-DD") from None

    def _check_measured_inputs(self, where: str, measured: bool) -> None:
        dtypes, dim = self.auto_dtypes, self.auto_max_head_dim
        if not measured:
            if dtypes is not None or dim is not None:
                raise ValueError(f"{where}: auto_dtypes and auto_max_head_dim describe a crossover; auto_from_length "
                                 "is null")  # fmt: skip
            return
        # Required with a crossover: a record that left them out would let auto run the kernels at any dtype and
        # head dim, where they may not even launch (a larger state than shared memory holds).
        if not isinstance(dtypes, list | tuple) or not dtypes or not all(isinstance(d, str) for d in dtypes):
            raise ValueError(f"{where}: auto_dtypes (the dtypes the crossover was measured in) must be a non-empty "
                             f"list of floating-point dtype names, got {dtypes!r}")  # fmt: skip
        for name in dtypes:
            try:
                dtype = jax.numpy.dtype(name)
            except (TypeError, ValueError, SyntaxError):
                dtype = None
            if dtype is None or dtype.name != name or not jax.numpy.issubdtype(dtype, jax.numpy.floating):
                raise ValueError(f"{where}: auto_dtypes: {name!r} is not a floating-point dtype name like bfloat16")
        object.__setattr__(self, "auto_dtypes", list(dtypes))  # the record's own copy
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"{where}: auto_max_head_dim (the largest head dim the crossover was measured at) must "
                             f"be a whole number ≥ 1, got {dim!r}")  # fmt: skip

    def input_refusal(self, dtype, head_dim: int) -> str | None:
        """Why this record's crossover does not speak for inputs of `dtype` whose largest head dim (query/key
        features or values) is `head_dim` (None: it does). Only a record with a crossover has one to speak for."""
        if self.auto_dtypes is None:
            raise ValueError(f"kernel record {self.op}/{self.backend}/{self.device_class} has no crossover")
        name = jax.numpy.dtype(dtype).name
        if name not in self.auto_dtypes:
            return f"its crossover was measured in {', '.join(self.auto_dtypes)}, not {name}"
        if head_dim > self.auto_max_head_dim:
            return f"its crossover was measured at head dims ≤ {self.auto_max_head_dim}, not {head_dim}"
        return None

    def crossover(self, causal: bool) -> int | None:
        """The length from which the kernels beat the XLA impl in this attention mode (None: never, or not measured)."""
        if isinstance(self.auto_from_length, dict):
            return self.auto_from_length["causal" if causal else "full"]
        return self.auto_from_length


def read_passes(path: Path = PASSES_PATH) -> tuple[KernelRun, ...]:
    """The records in `path` (a JSON list of KernelRun fields); a malformed file is an error naming it."""
    try:
        rows = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected a JSON list of kernel records")
    fields = {f.name for f in dataclasses.fields(KernelRun)}
    records = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or set(row) - fields or not {"op", "backend", "passed"} <= set(row):
            raise ValueError(f"{path}: record {i} must be an object with the fields {', '.join(sorted(fields))}")
        try:
            records.append(KernelRun(**row))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: record {i}: {e}") from None
    return tuple(records)


@functools.cache
def _committed_passes() -> tuple[KernelRun, ...]:
    return read_passes(PASSES_PATH)


def passing_run(
    op: str, backend: str, device_cls: str, jax_version: str = jax.__version__, records=None
) -> KernelRun | None:
    """The newest passing record of `backend`'s `op` kernels on `device_cls` under this jax minor, or None."""
    records = _committed_passes() if records is None else records
    matches = [
        r
        for r in records
        if r.passed
        and (r.op, r.backend, r.device_class) == (op, backend, device_cls)
        and jax_minor(r.jax_version) == jax_minor(jax_version)
    ]
    return max(matches, key=lambda r: r.date) if matches else None


def largest_head_dim(*arrays) -> int:
    """The largest head dim (last axis) of an op's inputs: what a record's `auto_max_head_dim` is compared with."""
    return max(x.shape[-1] for x in arrays)


def auto_pallas_backend(
    op: str,
    length: int,
    refusals: dict[str, Callable[[], str | None]],
    records=None,
    *,
    causal: bool,
    dtype,
    head_dim: int,
) -> str | None:
    """The `pallas_backend` `impl="auto"` runs for `op` at sequence `length` on this machine, or None for "xla".

    A backend qualifies when it has passed on this device class (`passing_run`), its record's crossover length for
    this attention mode (`KernelRun.crossover`) is at most `length`, the record's crossover was measured at inputs
    like these (`dtype`, the largest head dim `head_dim`: `KernelRun.input_refusal`), and `refusals[backend]()`,
    where given, is None (the Mosaic GPU kernels take the inputs). Hopper prefers Mosaic GPU to Triton when both
    qualify."""
    platform = jax.default_backend()
    if platform not in ("gpu", "tpu"):
        return None
    device_cls = device_class()
    candidates = ("tpu",) if platform == "tpu" else ("mosaic_gpu", "triton")
    for backend in candidates:
        run = passing_run(op, backend, device_cls, records=records)
        crossover = None if run is None else run.crossover(causal)
        if crossover is None or length < crossover or run.input_refusal(dtype, head_dim) is not None:
            continue
        refusal = refusals.get(backend)
        if refusal is not None and refusal() is not None:
            continue
        return backend
    return None


def resolve_pallas_backend(
    requested: str | None,
    mosaic_refusal: Callable[[], str | None],
    capability: tuple[int, int] | str | None = "local",
    op: str = "relu_attention",
    records=None,
) -> str:
    """The kernels `requested` means here (module docstring): "tpu", "mosaic_gpu", "gpu" (the Triton kernels
    built for a GPU) or the running platform's name when that is neither (the Triton kernels, interpreted).
    `mosaic_refusal()` says why the Mosaic GPU kernels cannot take the inputs (None: they can); `capability`
    defaults to the local GPU's. "gpu" picks Mosaic GPU on Hopper only where `op`'s Mosaic kernels have a
    passing record for "cuda-sm9x" (`records`: the committed table unless given)."""
    if requested is not None and requested not in PALLAS_BACKENDS:
        raise ValueError(f"unknown pallas_backend {requested!r}; valid: {', '.join(PALLAS_BACKENDS)}")
    backend = requested or jax.default_backend()
    if backend == "triton":
        return "gpu"
    if backend != "gpu":
        return backend
    if capability == "local":
        capability = gpu_compute_capability()
    if capability is None or capability[0] != 9:
        return "gpu"
    hopper = f"cuda-sm{capability[0]}{capability[1]}"
    if passing_run(op, "mosaic_gpu", hopper, records=records) is None:
        return "gpu"  # never passed on a Hopper GPU: Triton, which the bench has run there
    return "mosaic_gpu" if mosaic_refusal() is None else "gpu"


# ------------------------------------------------------------------------------------------------------------
# Records from a test run: `python -m kernels.platforms record --junit DIR ...`
# ------------------------------------------------------------------------------------------------------------


def _junit_counts(path: Path) -> dict[str, int]:
    """Passed / failed / errors / skipped counts of a pytest JUnit XML report."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        for key in counts:
            counts[key] += int(suite.get(key, 0))
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def records_from_junit(
    junit_dir: Path, *, device_cls: str, device: str, commit: str, date: str, jax_version: str = jax.__version__
) -> list[KernelRun]:
    """One record per (op, backend) whose test file has a report `<file stem>.xml` in `junit_dir`.

    Passed means: the report exists (a file killed by its time limit leaves none — then `<stem>.timeout`
    says so), at least one test passed, and none failed or errored. Skipped tests do not count either way."""
    records = []
    for (op, backend), test_file in TEST_FILES.items():
        stem = Path(test_file).stem
        report, timed_out = junit_dir / f"{stem}.xml", junit_dir / f"{stem}.timeout"
        if timed_out.exists():
            summary, passed = f"{test_file}: stopped at its time limit ({timed_out.read_text().strip()})", False
        elif report.exists():
            c = _junit_counts(report)
            summary = (
                f"{test_file}: {c['passed']} passed, {c['failures']} failed, {c['errors']} errors, "
                f"{c['skipped']} skipped"
            )
            passed = c["passed"] > 0 and c["failures"] == 0 and c["errors"] == 0
        else:
            continue
        records.append(KernelRun(op, backend, device_cls, device, jax_version, commit, date, passed, summary, None, ""))
    return records


def merge(records: list[KernelRun], new: list[KernelRun]) -> list[KernelRun]:
    """`records` with `new` appended (a run of the same op/backend/class/jax/commit replaces the older one)."""

    def key(r):
        return (r.op, r.backend, r.device_class, r.jax_version, r.commit)

    replaced = {key(r) for r in new}
    return [r for r in records if key(r) not in replaced] + list(new)


def write_passes(records: list[KernelRun], path: Path) -> None:
    """The table as JSON; the measured inputs only on records with a crossover (elsewhere they must be null)."""
    rows = [dataclasses.asdict(r) for r in records]
    for row in rows:
        for field in ("auto_dtypes", "auto_max_head_dim"):
            if row[field] is None:
                del row[field]
    Path(path).write_text(json.dumps(rows, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.platforms", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="kernel records from per-file JUnit reports of a run on this machine")
    rec.add_argument("--junit", type=Path, required=True, help="folder of <test file stem>.xml reports")
    rec.add_argument("--commit", required=True, help="the commit the tests ran at")
    rec.add_argument("--out", type=Path, required=True, help="the committed table merged with the new records")
    rec.add_argument("--device_class", default=None, help="default: this machine's (device_class())")
    rec.add_argument("--device", default=None, help="default: this machine's first device kind")
    sub.add_parser("show", help="print the committed table and what auto would pick here")
    args = parser.parse_args(argv)
    if args.command == "show":
        for r in _committed_passes():
            print(json.dumps(dataclasses.asdict(r)))
        here = device_class()
        picks = {op: [b for b in RECORDED_BACKENDS if passing_run(op, b, here)] for op in OPS}
        print(f"this machine: {here}, jax {jax.__version__}; passing builds: {picks}")
        return 0
    if not args.junit.is_dir():
        parser.error(f"--junit {args.junit} is not a folder")
    new = records_from_junit(
        args.junit,
        device_cls=args.device_class or device_class(),
        device=args.device or jax.devices()[0].device_kind,
        commit=args.commit,
        date=datetime.date.today().isoformat(),
    )
    write_passes(merge(list(read_passes()), new), args.out)
    for r in new:
        print(f"{r.op}/{r.backend} on {r.device_class}: {'PASSED' if r.passed else 'not passed'} — {r.tests}")
    print(f"wrote {args.out} ({len(new)} new records)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
