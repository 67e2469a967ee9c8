"""Kernel benchmark: every impl of ReLU and linear attention against every impl of the softmax baseline.

    python -m kernels.bench                        # the default sweep for this backend
    python -m kernels.bench --lengths=1024,4096,16384 --head_dims=128 --dtypes=bfloat16 --causal=true
    make bench

For each (op, impl, B, H, T, D, dtype, causal) it times the jitted forward and forward+backward (median of
`--repeats` after a warm-up), reports TFLOP/s (attention forward = 4·B·H·T²·D, causal 2·B·H·T²·D;
backward 2.5× forward; linear attention forward = 4·B·H·T·m·d_v), the share of the device's dense peak,
the time against the HBM-bandwidth bound for linear attention, and XLA's temporary memory of the compiled
function. Results go to `benchmarks/kernels-<device>.json` with the device named, and a plot of time
against length to `benchmarks/kernels-<device>.svg`. Imports only jax.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from kernels.linear_attention.api import linear_attention
from kernels.linear_attention.mosaic_gpu import MgpuChunkSizes
from kernels.linear_attention.mosaic_gpu import supported as linear_mgpu_supported
from kernels.linear_attention.triton import LinearBlockSizes
from kernels.options import LinearAttentionOptions, ReluAttentionOptions
from kernels.platforms import gpu_compute_capability
from kernels.relu_attention.api import relu_attention
from kernels.relu_attention.mosaic_gpu import MgpuBlockSizes
from kernels.relu_attention.mosaic_gpu import supported as relu_mgpu_supported
from kernels.relu_attention.triton import PallasBlockSizes
from kernels.softmax_attention.api import SoftmaxAttentionOptions, softmax_attention

# Dense peak (TFLOP/s) per dtype and HBM bandwidth (TB/s), by device kind substring.
PEAKS = {
    "H200": {"bfloat16": 989.0, "float32": 67.0, "hbm_tb_s": 4.8},
    "H100": {"bfloat16": 989.0, "float32": 67.0, "hbm_tb_s": 3.35},
    "A100": {"bfloat16": 312.0, "float32": 19.5, "hbm_tb_s": 2.0},
    "TPU v5 lite": {"bfloat16": 197.0, "float32": 197.0, "hbm_tb_s": 0.82},
    "TPU v4": {"bfloat16": 275.0, "float32": 275.0, "hbm_tb_s": 1.2},
}


@dataclasses.dataclass(frozen=True)
class Case:
    op: str  # "relu" | "linear" | "softmax"
    impl: str  # "reference" | "xla" | "pallas" | "mosaic" (Hopper); softmax: `kernels.SOFTMAX_IMPLS`
    batch: int
    heads: int
    length: int
    head_dim: int
    dtype: str
    causal: bool
    # Pallas block sizes: "bq,bk,bq_bwd,bk_bwd,warps,stages" (relu) or "chunk,warps,stages,block_dv" (linear;
    # warps 0 = the default).
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
    n = [int(x) for x in case.blocks.split(",")]
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
    # "pallas" names the Triton kernels on a GPU (whatever `pallas_backend="gpu"` would pick by compute
    # capability) and "mosaic" the Hopper ones; on a TPU "pallas" is the Mosaic TPU kernels.
    if case.impl == "mosaic":
        impl, backend = "pallas", "mosaic_gpu"
    else:
        impl, backend = case.impl, "triton" if jax.default_backend() == "gpu" else None
    if case.op == "relu":
        relu = ReluAttentionOptions(impl=impl, pallas_backend=backend, pallas_block_sizes=sizes)
        return lambda q, k, v: relu_attention(q, k, v, causal=case.causal, options=relu)
    if case.op == "linear":
        linear = LinearAttentionOptions(impl=impl, pallas_backend=backend, pallas_block_sizes=sizes, chunk_size=64)
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
    if case.impl != "mosaic":
        return None
    x = jax.ShapeDtypeStruct((case.batch, case.length, case.heads, case.head_dim), jnp.dtype(case.dtype))
    if case.op == "relu":
        return relu_mgpu_supported(x, x, x, MgpuBlockSizes(), case.causal)
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
    fwd = jax.jit(fn)

    def loss(q, k, v):
        return jnp.sum(fn(q, k, v).astype(jnp.float32))

    fwd_bwd = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    result = dataclasses.asdict(case)
    if check and case.length <= check_max_length:
        try:
            result.update(_check_case(case, fn, (q, k, v), cotangent))
        except Exception as e:
            result["check_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    peak, hbm = _peak(case.dtype)
    for name, f, mult in (("forward", fwd, 1.0), ("forward_backward", fwd_bwd, 3.5)):
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
    return result


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
    """The cases `args` asks for; by default every impl the backend has ("mosaic" on Hopper: capability 9.x)."""
    cases = []
    kernel_impls = ["xla", "pallas"] if backend != "cpu" else ["xla"]
    if backend == "gpu" and capability is not None and capability[0] == 9:
        kernel_impls.append("mosaic")
    impls = {
        "relu": args.relu_impls or kernel_impls,
        "linear": args.linear_impls or kernel_impls,
        "softmax": args.softmax_impls
        or {"gpu": ["cudnn", "xla", "dense"], "tpu": ["splash", "xla", "dense"]}.get(backend, ["xla", "dense"]),
    }
    blocks = {"relu": args.relu_blocks or [""], "linear": args.linear_blocks or [""], "softmax": [""]}
    # Shapes outside, impls inside: a sweep cut off at a time limit keeps whole comparisons, in the order the
    # lengths and head dims were given.
    shapes = itertools.product(args.head_dims, args.lengths, args.dtypes, args.causal)
    for d, t, dtype, causal in shapes:
        for op in args.ops:
            for impl, block in ((i, b) for i in impls[op] for b in (blocks[op] if i == "pallas" else [""])):
                if impl in ("cudnn", "mosaic") and dtype == "float32":
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
    import math

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
    return lambda s: [kind(x) for x in s.split(",") if x]


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


def parse_args(argv=None) -> argparse.Namespace:
    """The sweep's settings; defaults by backend (a CPU gets a small sweep)."""
    accel = jax.default_backend() != "cpu"
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=_choices("relu", "linear", "softmax"), default=["relu", "linear", "softmax"])
    p.add_argument(
        "--lengths", type=_csv(int), default=[1024, 2048, 4096, 8192, 16384, 32768] if accel else [1024, 2048]
    )
    p.add_argument("--head_dims", type=_csv(int), default=[64, 128] if accel else [64])
    p.add_argument("--dtypes", type=_csv(str), default=["bfloat16", "float32"] if accel else ["float32"])
    p.add_argument("--causal", type=_csv(_true_or_false), default=[True, False] if accel else [True])
    p.add_argument("--heads", type=int, default=16 if accel else 4)
    p.add_argument("--tokens", type=int, default=65536 if accel else 2048, help="batch = tokens // length")
    p.add_argument("--relu_impls", type=_csv(str), default=None)
    p.add_argument("--linear_impls", type=_csv(str), default=None)
    p.add_argument("--softmax_impls", type=_csv(str), default=None, help="default: cudnn/splash, xla, dense")
    p.add_argument(
        "--relu_blocks",
        type=lambda s: s.split(";"),
        default=None,
        help='Pallas ReLU block sizes to compare, "bq,bk,bq_bwd,bk_bwd,warps,stages;..."',
    )
    p.add_argument(
        "--linear_blocks",
        type=lambda s: s.split(";"),
        default=None,
        help='Pallas linear block sizes to compare, "chunk,warps,stages;..."',
    )
    p.add_argument("--repeats", type=int, default=10 if accel else 3)
    p.add_argument("--out", type=Path, default=Path("benchmarks"))
    p.add_argument(
        "--check",
        type=_true_or_false,
        default=accel,
        help="also measure each case's relative error against the fp32 XLA impl at highest precision",
    )
    p.add_argument("--check_max_length", type=int, default=8192, help="check only cases up to this length")
    return p.parse_args(argv)


def main(argv=None) -> Path:
    args = parse_args(argv)
    cases = default_cases(jax.default_backend(), args, gpu_compute_capability())
    device = jax.devices()[0]
    args.out.mkdir(parents=True, exist_ok=True)
    name = device_name()
    path = args.out / f"kernels-{name}.json"
    payload = {
        "device": {"platform": device.platform, "kind": device.device_kind, "count": jax.device_count()},
        "jax_version": jax.__version__,
        "flop_convention": "attention fwd 4BHT^2D (causal 2BHT^2D), bwd 2.5x fwd; linear fwd 4BHTmd",
        "accuracy": "rel_err = ||out - ref|| / ||ref||, ref = impl 'xla' on fp32 inputs at highest precision",
        "results": [],
    }
    results = payload["results"]
    for i, case in enumerate(cases, 1):
        r = run_case(case, args.repeats, check=args.check, seed=i, check_max_length=args.check_max_length)
        results.append(r)
        path.write_text(json.dumps(payload, indent=1))  # after every case: a cut-off sweep keeps what it measured
        fwd = f"{r['forward_ms']:.2f} ms" if "forward_ms" in r else r.get("forward_error", r.get("skipped", "?"))
        both = f"{r['forward_backward_ms']:.2f} ms" if "forward_backward_ms" in r else r.get("forward_backward_error")
        impl = f"{case.impl}[{case.blocks}]" if case.blocks else case.impl
        print(f"[{i}/{len(cases)}] {case.op}/{impl} B{case.batch} H{case.heads} T{case.length} D{case.head_dim} "
              f"{case.dtype}{' causal' if case.causal else ''}: fwd {fwd}, fwd+bwd {both}{_err_text(r)}",
              flush=True)  # fmt: skip
    write_svg(results, args.out / f"kernels-{name}.svg", f"{device.device_kind}")
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
