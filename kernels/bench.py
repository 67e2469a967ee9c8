"""Kernel benchmark: every impl of ReLU and linear attention beside the softmax baseline.

    python -m kernels.bench                        # the default sweep for this backend
    python -m kernels.bench --lengths=1024,4096,16384 --head_dims=128 --dtypes=bfloat16 --causal=true
    python -m kernels.bench --dry_run              # a GPU's default sweep, every case at toy sizes, here
    make bench

On an accelerator the default sweep is the kernels' targets (docs/kernels.md): T 4K and 16K, causal and not,
D 128 and 64, bf16, B·T = 65,536 tokens, H 16. For each (op, impl, B, H, T, D, dtype, causal) it times the jitted
forward and forward+backward (median of `--repeats` after a warm-up) and reports TFLOP/s (attention forward =
4·B·H·T²·D, causal 2·B·H·T²·D; backward 2.5× forward; linear attention forward = 4·B·H·T·m·d_v), the time as a
multiple of the softmax baseline's at the same shape (`x_baseline`: cuDNN on a GPU, splash on a TPU, else the
blocked XLA softmax), the share of the device's dense peak, the time against the HBM-bandwidth bound for linear
attention with flash-linear-attention's published H100 figures beside it, and XLA's temporary memory. Results go
to `benchmarks/kernels-<device>.json` with the device named, and a plot of time against length to
`benchmarks/kernels-<device>.svg`. Imports only jax.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from kernels.linear_attention.api import linear_attention
from kernels.linear_attention.mosaic_gpu import MgpuChunkSizes
from kernels.linear_attention.mosaic_gpu import supported as linear_mgpu_supported
from kernels.linear_attention.triton import LinearBlockSizes
from kernels.options import IMPLS, LinearAttentionOptions, ReluAttentionOptions
from kernels.platforms import gpu_compute_capability
from kernels.relu_attention.api import relu_attention
from kernels.relu_attention.mosaic_gpu import MgpuBlockSizes
from kernels.relu_attention.mosaic_gpu import default_block_sizes as default_mgpu_blocks
from kernels.relu_attention.mosaic_gpu import supported as relu_mgpu_supported
from kernels.relu_attention.triton import PallasBlockSizes
from kernels.softmax_attention.api import SOFTMAX_IMPLS, SoftmaxAttentionOptions, softmax_attention

DTYPES = ("bfloat16", "float16", "float32")  # what the cases' inputs are cast to
# Dense peak (TFLOP/s) per dtype and HBM bandwidth (TB/s), by device kind substring.
PEAKS = {
    "H200": {"bfloat16": 989.0, "float32": 67.0, "hbm_tb_s": 4.8},
    "H100": {"bfloat16": 989.0, "float32": 67.0, "hbm_tb_s": 3.35},
    "A100": {"bfloat16": 312.0, "float32": 19.5, "hbm_tb_s": 2.0},
    "TPU v5 lite": {"bfloat16": 197.0, "float32": 197.0, "hbm_tb_s": 0.82},
    "TPU v4": {"bfloat16": 275.0, "float32": 275.0, "hbm_tb_s": 1.2},
}


# flash-linear-attention's `chunk` linear attention on an H100, B 8, H 32, D 128, causal (its README, 2025):
# T → (forward ms, forward+backward ms). Linear in B·H, so set beside a case scaled by its B·H / 256.
FLA_H100 = {2048: (0.45, 2.28), 4096: (0.64, 3.37), 8192: (1.01, 5.58), 16384: (1.75, 10.19)}
# The softmax impls a shape's baseline is, in order of preference.
BASELINES = ("cudnn", "splash", "xla")


@dataclasses.dataclass(frozen=True)
class Case:
    op: str  # "relu" | "linear" | "softmax"
    impl: str  # "reference" | "xla" | "triton" | "mosaic_gpu" | "mosaic_tpu"; softmax: `kernels.SOFTMAX_IMPLS`
    batch: int
    heads: int
    length: int
    head_dim: int
    dtype: str
    causal: bool
    # Block sizes of the build: Triton "bq,bk,bq_bwd,bk_bwd,warps,stages" (relu) or "chunk,warps,stages,block_dv"
    # (linear; warps 0 = the default); Mosaic GPU "bq,bk,stages" (relu).
    blocks: str = ""


def device_name() -> str:
    d = jax.devices()[0]
    return f"{d.platform}-{d.device_kind}".replace(" ", "_").lower() if d.platform != "cpu" else "cpu"


def _peak(dtype: str) -> tuple[float | None, float | None]:
    kind = jax.devices()[0].device_kind
    for key, peaks in PEAKS.items():
        if key.lower() in kind.lower():
            return peaks[dtype], peaks["hbm_tb_s"]
    return None, None


def flops(case: Case) -> float:
    b, h, t, d = case.batch, case.heads, case.length, case.head_dim
    if case.op == "linear":
        return 4.0 * b * h * t * d * d  # φ(q)S and the state update, m = d_v = d
    return (2.0 if case.causal else 4.0) * b * h * t * t * d


def block_sizes(case: Case):
    """The Pallas block-size dataclass a case names (None: the kernel's default for the backend)."""
    if not case.blocks:
        return None
    if "=" in case.blocks:  # the build's dataclass by field: "block_q=128,block_k_dkv=32,num_warps_bwd=8"
        fields = dict(item.split("=") for item in case.blocks.split(","))
        build = {"mosaic_gpu": MgpuBlockSizes, "relu": PallasBlockSizes, "linear": LinearBlockSizes}
        cls = build.get(case.impl) or build[case.op]
        return cls(**{name: int(value) for name, value in fields.items()})
    n = [int(x) for x in case.blocks.split(",")]
    if case.impl == "mosaic_gpu":
        return MgpuBlockSizes(*n[:3])
    if case.op == "relu":
        return PallasBlockSizes(*n[:4], num_warps=n[4] if len(n) > 4 else None, num_stages=n[5] if len(n) > 5 else 2)
    return LinearBlockSizes(
        n[0],
        num_warps=n[1] if len(n) > 1 and n[1] else None,
        num_stages=n[2] if len(n) > 2 else 2,
        block_dv=n[3] if len(n) > 3 else None,
    )


def _fn(case: Case):
    sizes = block_sizes(case)
    if case.op == "relu":
        relu = ReluAttentionOptions(impl=case.impl, pallas_block_sizes=sizes)
        return lambda q, k, v: relu_attention(q, k, v, causal=case.causal, options=relu)
    if case.op == "linear":
        linear = LinearAttentionOptions(impl=case.impl, pallas_block_sizes=sizes, chunk_size=64)
        return lambda q, k, v: linear_attention(
            jax.nn.elu(q) + 1, jax.nn.elu(k) + 1, v, causal=case.causal, options=linear
        )
    softmax = SoftmaxAttentionOptions(impl=case.impl)
    return lambda q, k, v: softmax_attention(q, k, v, causal=case.causal, options=softmax)


def median_seconds(fn, args, repeats: int) -> float:
    """The median wall time of `fn(*args)` over `repeats` calls, after one untimed call (compile, warm up)."""
    jax.block_until_ready(fn(*args))  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _reference_case(case: Case) -> Case:
    """What a case's accuracy is checked against: the blocked XLA impl in fp32."""
    return dataclasses.replace(case, impl="xla", dtype="float32", blocks="")


def _rel_err(got, ref) -> float:
    """‖got − ref‖ / ‖ref‖ over a pytree, in float32; NaN anywhere gives NaN (never passes a bound)."""
    pairs = zip(jax.tree.leaves(got), jax.tree.leaves(ref), strict=True)
    num = sum(jnp.sum((a.astype(jnp.float32) - b) ** 2) for a, b in pairs)
    den = sum(jnp.sum(b**2) for b in jax.tree.leaves(ref))
    return float(jnp.sqrt(num / den))


def refusal(case: Case) -> str | None:
    """Why the impl a case names does not take its shapes, by the kernels' own declared limits (None: it does).
    Such a case is recorded as skipped, with the reason, instead of failing inside the timed function."""
    if case.impl == "cudnn" and case.dtype not in ("bfloat16", "float16"):
        return "cuDNN flash attention takes half precision only"
    if case.impl == "cudnn" and jax.default_backend() != "gpu":
        return "cuDNN needs a GPU"
    if case.impl != "mosaic_gpu":
        return None
    if jax.default_backend() != "gpu":
        return "the Mosaic GPU kernels need a Hopper GPU (interpret mode cannot run wgmma)"
    x = jax.ShapeDtypeStruct((case.batch, case.length, case.heads, case.head_dim), jnp.dtype(case.dtype))
    if case.op == "relu":
        return relu_mgpu_supported(x, x, x, block_sizes(case) or default_mgpu_blocks(case.head_dim), case.causal)
    return linear_mgpu_supported(x, x, MgpuChunkSizes(64), causal=case.causal)  # the chunk _fn asks for


def run_case(case: Case, repeats: int, check: bool = False, seed: int = 0, check_max_length: int = 1 << 30) -> dict:
    """Times one case; with `check`, also its relative error against `_reference_case` (output, gradients)."""
    reason = refusal(case)
    if reason is not None:
        return {**dataclasses.asdict(case), "skipped": reason}
    shape = (case.batch, case.length, case.heads, case.head_dim)
    keys = jax.random.split(jax.random.key(seed), 4)  # fresh inputs per case: a kernel must be right on any
    q, k, v = (jax.random.normal(key, shape, jnp.float32).astype(case.dtype) for key in keys[:3])
    cotangent = jax.random.normal(keys[3], shape, jnp.float32)
    fn = _fn(case)
    fwd_bwd = jax.jit(jax.grad(lambda *qkv: jnp.sum(fn(*qkv).astype(jnp.float32)), argnums=(0, 1, 2)))
    result = dataclasses.asdict(case)
    if check and case.length <= check_max_length:
        try:
            result.update(_check_case(case, fn, (q, k, v), cotangent))
        except Exception as e:
            result["check_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    peak, hbm = _peak(case.dtype)
    for name, f, mult in (("forward", jax.jit(fn), 1.0), ("forward_backward", fwd_bwd, 3.5)):
        try:
            compiled = f.lower(q, k, v).compile()  # once: timed and asked for its memory
            seconds = median_seconds(compiled, (q, k, v), repeats)
            memory = compiled.memory_analysis()
        except Exception as e:
            result[f"{name}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            continue
        tflops = mult * flops(case) / seconds / 1e12
        result[f"{name}_ms"] = seconds * 1e3
        result[f"{name}_tflops"] = tflops
        result[f"{name}_temp_mib"] = memory.temp_size_in_bytes / 2**20 if memory else None
        result[f"{name}_pct_peak"] = 100 * tflops / peak if peak else None
        if case.op == "linear" and hbm:
            itemsize = jnp.dtype(case.dtype).itemsize
            tensors = 4 if name == "forward" else 11  # q,k,v,out; backward re-reads and writes grads
            bound = tensors * case.batch * case.length * case.heads * case.head_dim * itemsize / (hbm * 1e12)
            result[f"{name}_x_hbm_bound"] = seconds / bound
    fla = FLA_H100.get(case.length)
    if case.op == "linear" and case.causal and case.head_dim == 128 and fla:
        scale = case.batch * case.heads / 256
        result["fla_h100_forward_ms"], result["fla_h100_forward_backward_ms"] = fla[0] * scale, fla[1] * scale
    return result


def shape_key(r: dict) -> tuple:
    return tuple(r[k] for k in ("batch", "heads", "length", "head_dim", "dtype", "causal"))


def add_baseline_ratios(results: list[dict]) -> None:
    """Each result's times as multiples of its shape's softmax baseline (`BASELINES`: the first that ran)."""
    baselines = {}
    ran = (r for r in results if r["op"] == "softmax" and "forward_backward_ms" in r and r["impl"] in BASELINES)
    for r in sorted(ran, key=lambda r: BASELINES.index(r["impl"])):
        baselines.setdefault(shape_key(r), r)
    for r in results:
        base = baselines.get(shape_key(r))
        if base is None:
            continue
        r["baseline"] = f"softmax/{base['impl']}"
        for name in ("forward", "forward_backward"):
            if f"{name}_ms" in r:
                r[f"{name}_x_baseline"] = r[f"{name}_ms"] / base[f"{name}_ms"]


def summary_table(results: list[dict]) -> str:
    """The results as a markdown table: times, TFLOP/s, ×baseline, and fla's H100 figures beside linear rows."""
    lines = [
        "| op/impl | T | D | causal | fwd ms | fwd+bwd ms | fwd TFLOP/s | fwd+bwd TFLOP/s | ×baseline fwd; fwd+bwd "
        "| fla H100 fwd; fwd+bwd ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def num(r, key, fmt):
        return format(r[key], fmt) if key in r else "—"

    for r in results:
        impl = f"{r['op']}/{r['impl']}" + (f"[{r['blocks']}]" if r["blocks"] else "")
        if "skipped" in r:
            lines.append(f"| {impl} | {r['length']} | {r['head_dim']} | {r['causal']} | skipped: {r['skipped']} |||||")
            continue
        fla = f"{num(r, 'fla_h100_forward_ms', '.2f')}; {num(r, 'fla_h100_forward_backward_ms', '.2f')}"
        lines.append(
            f"| {impl} | {r['length']} | {r['head_dim']} | {r['causal']} | {num(r, 'forward_ms', '.2f')} "
            f"| {num(r, 'forward_backward_ms', '.2f')} | {num(r, 'forward_tflops', '.0f')} "
            f"| {num(r, 'forward_backward_tflops', '.0f')} | {num(r, 'forward_x_baseline', '.2f')}; "
            f"{num(r, 'forward_backward_x_baseline', '.2f')} | {fla if 'fla_h100_forward_ms' in r else '—'} |"
        )
    return "\n".join(lines) + "\n"


def _check_case(case: Case, fn, args, cotangent) -> dict:
    ref_fn = _fn(_reference_case(case))

    def vjp(f, q, k, v):
        out, pull = jax.vjp(f, q, k, v)
        return out, pull(cotangent.astype(out.dtype))

    with jax.default_matmul_precision("highest"):
        ref_out, ref_grads = jax.jit(lambda *a: vjp(ref_fn, *a))(*(x.astype(jnp.float32) for x in args))
    out, grads = jax.jit(lambda *a: vjp(fn, *a))(*args)
    return {"forward_rel_err": _rel_err(out, ref_out), "grad_rel_err": _rel_err(grads, ref_grads)}


def default_cases(backend: str, args, capability: tuple[int, int] | None = None) -> list[Case]:
    """The cases `args` asks for; by default the backend's kernel builds ("mosaic_gpu" on Hopper: capability 9.x)
    and its softmax baseline, with the XLA impls where `args.xla` (always on a CPU, which has no kernel build)."""
    cases = []
    kernel_impls = {"gpu": ["triton"], "tpu": ["mosaic_tpu"]}.get(backend, [])
    if backend == "gpu" and capability is not None and capability[0] == 9:
        kernel_impls = [*kernel_impls, "mosaic_gpu"]
    softmax_impls = {"gpu": ["cudnn"], "tpu": ["splash"]}.get(backend, ["dense"])
    if args.xla or not kernel_impls:
        kernel_impls, softmax_impls = [*kernel_impls, "xla"], [*softmax_impls, "xla"]
    impls = {
        "relu": args.relu_impls or kernel_impls,
        "linear": args.linear_impls or kernel_impls,
        "softmax": args.softmax_impls or softmax_impls,
    }
    blocks = {
        ("relu", "triton"): args.relu_blocks, ("linear", "triton"): args.linear_blocks,
        ("relu", "mosaic_gpu"): args.mgpu_blocks,
    }  # fmt: skip
    # Shapes outside, impls inside: a sweep cut off at a time limit keeps whole comparisons, in the order the
    # lengths were given; head dims inside lengths, so that every head dim is reached at the first length.
    shapes = itertools.product(args.lengths, args.causal, args.head_dims, args.dtypes)
    for t, causal, d, dtype in shapes:
        for op in args.ops:
            for impl, block in ((i, b) for i in impls[op] for b in (blocks.get((op, i)) or [""])):
                if impl in ("cudnn", "mosaic_gpu") and dtype == "float32":
                    continue  # cuDNN flash attention and the Mosaic GPU kernels: half precision only
                batch = max(1, args.tokens // t)
                cases.append(Case(op, impl, batch, args.heads, t, d, dtype, causal, block))
    return cases


def write_svg(results: list[dict], path: Path, title: str) -> None:
    """Forward+backward time (log scale) against length, one line per (op, impl, dtype, D, causal)."""
    series: dict[str, list[tuple[int, float]]] = {}
    for r in results:
        if "forward_backward_ms" in r:
            label = f"{r['op']}/{r['impl']} {r['dtype']} D{r['head_dim']}{' causal' if r['causal'] else ''}"
            series.setdefault(label, []).append((r["length"], r["forward_backward_ms"] / max(r["batch"], 1)))
    line_plot_svg(series, path, f"{title}: fwd+bwd ms per sequence (log) vs length", unit="ms")


def line_plot_svg(
    series: dict[str, list[tuple[int, float]]],
    path: Path,
    title: str,
    *,
    unit: str,
    dashed: dict[str, list[tuple[int, float]]] | None = None,
) -> None:
    """A log-scale line plot of y against x (x evenly spaced by rank), one coloured line per series; `dashed`
    series (same labels, e.g. each line's roofline) are drawn in the same colour, dashed. Nothing without data."""
    dashed = dashed or {}
    if not series:
        return
    xs = sorted({x for pts in (*series.values(), *dashed.values()) for x, _ in pts})
    ys = [y for pts in (*series.values(), *dashed.values()) for _, y in pts if y > 0]
    lo, hi = math.log10(min(ys)), math.log10(max(ys)) + 1e-9
    w, h, pad = 760, 420, 60
    colors = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666"]

    def px(x):
        return pad + (xs.index(x) / max(len(xs) - 1, 1)) * (w - 2 * pad)

    def py(y):
        return h - pad - (math.log10(y) - lo) / (hi - lo or 1) * (h - 2 * pad)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h + 20 * len(series)}">']
    parts.append(f'<text x="{pad}" y="20" font-size="14">{title}</text>')
    parts.append(f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>')
    parts.append(f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>')
    for x in xs:
        parts.append(f'<text x="{px(x) - 15}" y="{h - pad + 18}" font-size="11">{x}</text>')
    for e in range(math.floor(lo), math.ceil(hi) + 1):
        if lo <= e <= hi:
            parts.append(f'<text x="5" y="{py(10**e) + 4}" font-size="11">{10**e:g} {unit}</text>')
    for i, (label, pts) in enumerate(sorted(series.items())):
        color = colors[i % len(colors)]
        for points, style in ((pts, ""), (dashed.get(label, []), ' stroke-dasharray="5,4"')):
            coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in sorted(points) if y > 0)
            if coords:
                parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"{style}/>')
        parts.append(f'<text x="{pad}" y="{h + 15 + 20 * i}" font-size="12" fill="{color}">{label}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts))


def _err_text(r: dict) -> str:
    if "forward_rel_err" in r:
        return f", rel err fwd {r['forward_rel_err']:.1e} grad {r['grad_rel_err']:.1e}"
    return f", check failed: {r['check_error']}" if "check_error" in r else ""


def _csv(kind):
    def parse(text: str) -> list:
        if not (items := [kind(x) for x in text.split(",") if x]):
            raise argparse.ArgumentTypeError(f"{text!r}: give at least one value")
        return items

    return parse


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive integer")
    return value


def _blocks(op: str, impl: str):
    """A flag's block sizes, "a,b,...;..." or by field, each checked by building it as a case of `op`/`impl`."""

    def parse(text: str) -> list[str]:
        items = text.split(";")
        for item in items:
            try:
                block_sizes(Case(op, impl, 1, 1, 1, 1, "float32", False, item))
            except (ValueError, TypeError) as e:
                raise argparse.ArgumentTypeError(f"{item!r}: not {op}/{impl} block sizes ({e})") from None
        return items

    return parse


def _folder(text: str) -> Path:
    path = Path(text)  # a file where the folder or one of its parents would go: mkdir would fail after the parse
    if file := next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None):
        raise argparse.ArgumentTypeError(f"{file} is a file, not a folder")
    return path


def _true_or_false(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"{text!r}: give true or false")
    return text.lower() == "true"


def _choices(*valid: str):
    def parse(text: str) -> list[str]:
        items = _csv(str)(text)
        if unknown := [x for x in items if x not in valid]:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; valid: {', '.join(valid)}")
        return items

    return parse


def parse_args(argv=None, accelerator: bool | None = None) -> argparse.Namespace:
    """The sweep's settings; defaults by backend (an accelerator gets the targets' sweep, a CPU a small one).
    `accelerator`: take the accelerator's defaults whatever runs here (what `--dry_run` does)."""
    accel = jax.default_backend() != "cpu" if accelerator is None else accelerator
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=_choices("relu", "linear", "softmax"), default=["relu", "linear", "softmax"])
    p.add_argument("--lengths", type=_csv(_positive), default=[4096, 16384] if accel else [1024, 2048])
    p.add_argument("--head_dims", type=_csv(_positive), default=[128, 64] if accel else [64])
    p.add_argument("--dtypes", type=_choices(*DTYPES), default=["bfloat16"] if accel else ["float32"])
    p.add_argument("--causal", type=_csv(_true_or_false), default=[True, False] if accel else [True])
    p.add_argument("--heads", type=_positive, default=16 if accel else 4)
    p.add_argument("--tokens", type=_positive, default=65536 if accel else 2048, help="batch = tokens // length")
    p.add_argument("--relu_impls", type=_choices(*IMPLS), default=None)
    p.add_argument("--linear_impls", type=_choices(*IMPLS), default=None)
    p.add_argument(
        "--softmax_impls", type=_choices(*SOFTMAX_IMPLS), default=None, help="default: cudnn/splash, xla, dense"
    )
    blocks_help = {  # flag → ((op, impl) its sizes build, help)
        "relu_blocks": (
            ("relu", "triton"),
            'Triton ReLU block sizes to compare, "bq,bk,bq_bwd,bk_bwd,warps,stages;..." or by field, '
            '"block_q=128,block_k_dkv=32;..."',
        ),
        "linear_blocks": (("linear", "triton"), 'Triton linear block sizes to compare, "chunk,warps,stages;..."'),
        "mgpu_blocks": (("relu", "mosaic_gpu"), 'Mosaic GPU ReLU block sizes to compare, "block_q,block_k,stages;..."'),
    }
    for flag, (build, what) in blocks_help.items():
        p.add_argument(f"--{flag}", type=_blocks(*build), default=None, help=what)
    p.add_argument(
        "--xla",
        type=_true_or_false,
        default=not accel,
        help="also time the XLA impls (the crossovers `auto` rests on); default: on a CPU only",
    )
    p.add_argument("--repeats", type=_positive, default=5 if accel else 3)
    p.add_argument("--out", type=_folder, default=Path("benchmarks"))
    p.add_argument(
        "--check",
        type=_true_or_false,
        default=accel,
        help="also measure each case's relative error against the fp32 XLA impl at highest precision",
    )
    p.add_argument("--check_max_length", type=_positive, default=4096, help="check only cases up to this length")
    p.add_argument(
        "--dry_run",
        action="store_true",
        help="an H100's default sweep (or the flags'), every case at B 1, H 2, T 128 on this machine: checks the "
        "sweep's plumbing without its timings",
    )
    return p.parse_args(argv)


def main(argv=None) -> Path:
    args = parse_args(argv)
    if args.dry_run:
        args = parse_args(argv, accelerator=True)
        toy = {"batch": 1, "heads": 2, "length": 128}
        cases = list(dict.fromkeys(dataclasses.replace(c, **toy) for c in default_cases("gpu", args, (9, 0))))
        args.repeats, args.check_max_length = 1, 128
    else:
        cases = default_cases(jax.default_backend(), args, gpu_compute_capability())
    device = jax.devices()[0]
    args.out.mkdir(parents=True, exist_ok=True)
    name = "dry-run" if args.dry_run else device_name()
    path = args.out / f"kernels-{name}.json"
    payload = {
        "device": {"platform": device.platform, "kind": device.device_kind, "count": jax.device_count()},
        "jax_version": jax.__version__,
        "flop_convention": "attention fwd 4BHT^2D (causal 2BHT^2D), bwd 2.5x fwd; linear fwd 4BHTmd",
        "accuracy": "rel_err = ||out - ref|| / ||ref||, ref = impl 'xla' on fp32 inputs at highest precision",
        "baseline": "x_baseline = time / the same shape's softmax time, the first of cudnn, splash, xla that ran",
        "fla_h100": "flash-linear-attention chunk, H100, B8 H32 D128 causal (its README), scaled by B*H/256",
        "dry_run": args.dry_run,
        "results": [],
    }
    results = payload["results"]
    for i, case in enumerate(cases, 1):
        r = run_case(case, args.repeats, check=args.check, seed=i, check_max_length=args.check_max_length)
        results.append(r)
        add_baseline_ratios(results)
        path.write_text(json.dumps(payload, indent=1))  # after every case: a cut-off sweep keeps what it measured
        fwd = f"{r['forward_ms']:.2f} ms" if "forward_ms" in r else r.get("forward_error", r.get("skipped", "?"))
        both = f"{r['forward_backward_ms']:.2f} ms" if "forward_backward_ms" in r else r.get("forward_backward_error")
        impl = f"{case.impl}[{case.blocks}]" if case.blocks else case.impl
        print(f"[{i}/{len(cases)}] {case.op}/{impl} B{case.batch} H{case.heads} T{case.length} D{case.head_dim} "
              f"{case.dtype}{' causal' if case.causal else ''}: fwd {fwd}, fwd+bwd {both}{_err_text(r)}",
              flush=True)  # fmt: skip
    write_svg(results, args.out / f"kernels-{name}.svg", f"{device.device_kind}")
    print(summary_table(results), end="")
    print(f"wrote {path}")
    if not any("forward_ms" in r or "forward_backward_ms" in r for r in results):
        raise SystemExit(f"kernels.bench: no case of {len(cases)} was timed (each failed or was skipped): see {path}")
    return path


if __name__ == "__main__":
    main()
