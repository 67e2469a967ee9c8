"""How each mixer's cost grows with length: forward+backward time and memory of one mixer layer from 1K to 16K
tokens, beside the machine's compute roofline.

    python -m zoo.length_cost                                   # the default sweep (below), results in benchmarks/
    python -m zoo.length_cost --lengths=1024,4096 --mixers=softmax,linear --out=runs/scaling

One mixer layer (its projections included), batch 1, d_model 256, 4 heads, causal (`--causal=false` for
encoders), float32 on a CPU and bfloat16 on an accelerator (docs/performance.md). Per (mixer, length): the median
time of the jitted forward+backward, the memory XLA plans for it, the model FLOPs (`zoo.training.flops`) and the
roofline time = FLOPs / the device's peak. A case planned above `--memory_fraction` of the device's memory is
recorded as not run (XLA:CPU's plan undercounts the peak), and on a CPU softmax_dense stops at
`--dense_max_length`. Writes `scaling-<device>.json` and `scaling-<device>.svg`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from kernels.bench import device_name, line_plot_svg, median_seconds
from zoo import mixers
from zoo.files import atomic_write_bytes
from zoo.models.config import mixer_config, model_config
from zoo.training import flops, memory

# variant → (mixer, its options): what the sweep compares
VARIANTS = {
    "softmax": ("softmax", {}),
    "softmax_dense": ("softmax", {"implementation": "dense"}),
    "relu": ("relu", {}),
    "linear": ("linear", {"feature_map": "elu1"}),
    "gmlp": ("gmlp", {}),
}


def case_model(variant: str, length: int, *, d_model: int, heads: int, dtype: str):
    """The model config of one case: a one-layer model whose mixer is `variant`'s (checked by `parse_args`)."""
    mixer, options = VARIANTS[variant]
    model = model_config(mixer=mixer, num_layers=1, d_model=d_model, num_heads=heads, max_length=length, dtype=dtype)
    model.mixer_options[mixer].update(options)
    return model


def run_case(variant: str, length: int, args: argparse.Namespace, peak_tflops: float, limit: int | None) -> dict:
    """One (mixer, length) measurement."""
    model = case_model(variant, length, d_model=args.d_model, heads=args.heads, dtype=args.dtype)
    layer = mixers.build(mixer_config(model), rngs=nnx.Rngs(0))
    graph, params = nnx.split(layer)
    x = jax.random.normal(jax.random.key(1), (1, length, args.d_model), jnp.float32).astype(args.dtype)

    def loss(params, x):
        return jnp.sum(nnx.merge(graph, params)(x, causal=args.causal).astype(jnp.float32))

    result = {"variant": variant, "mixer": model.mixer, "length": length}
    if variant == "softmax_dense" and args.dense_max_length and length > args.dense_max_length:
        result["skipped"] = f"the dense T×T softmax is not run past --dense_max_length={args.dense_max_length}"
        return result
    model_flops = flops.train_step_flops(flops.mixer_flops(model, length, causal=args.causal))
    result["model_flops"] = model_flops
    result["roofline_ms"] = 1e3 * model_flops / (peak_tflops * 1e12) if peak_tflops else None
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x).compile()
    result["memory_bytes"] = memory.step_bytes(compiled)
    if limit is not None and result["memory_bytes"] > args.memory_fraction * limit:
        need, have = result["memory_bytes"] / 2**30, limit / 2**30
        result["skipped"] = f"needs {need:.2f} GiB, more than {args.memory_fraction:g} of the {have:.2f} GiB here"
        return result
    seconds = median_seconds(compiled, (params, x), args.repeats)
    result["forward_backward_ms"] = 1e3 * seconds
    result["tflops_per_s"] = model_flops / seconds / 1e12
    result["fraction_of_peak"] = result["tflops_per_s"] / peak_tflops if peak_tflops else None
    return result


def _csv(kind):
    return lambda s: [kind(x) for x in s.split(",") if x]


def parse_args(argv=None) -> argparse.Namespace:
    accel = jax.default_backend() != "cpu"
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mixers", type=_csv(str), default=list(VARIANTS))
    p.add_argument("--lengths", type=_csv(int), default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--d_model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dtype", default="bfloat16" if accel else "float32")
    p.add_argument("--causal", type=lambda s: s.lower() == "true", default=True)
    p.add_argument("--repeats", type=int, default=10 if accel else 3)
    p.add_argument("--out", type=Path, default=Path("benchmarks"))
    p.add_argument("--dense_max_length", type=int, default=0 if accel else 8192, help="0: no limit")
    p.add_argument("--memory_fraction", type=float, default=0.75, help="run cases planned below this share of memory")
    args = p.parse_args(argv)
    for name in args.mixers:
        if name not in VARIANTS:
            p.error(f"--mixers: unknown variant {name!r}; valid: {', '.join(VARIANTS)}")
    if any(t < 1 for t in args.lengths) or args.repeats < 1:
        p.error("--lengths and --repeats must be positive")
    return args


def write_plot(payload: dict, path: Path) -> None:
    series: dict[str, list[tuple[int, float]]] = {}
    roofline: dict[str, list[tuple[int, float]]] = {}
    for r in payload["results"]:
        if "forward_backward_ms" in r:
            series.setdefault(r["variant"], []).append((r["length"], r["forward_backward_ms"]))
        if r.get("roofline_ms"):
            roofline.setdefault(r["variant"], []).append((r["length"], r["roofline_ms"]))
    title = f"{payload['device']['kind']}: one mixer layer, fwd+bwd ms (log) vs length; dashed: roofline"
    line_plot_svg(series, path, title, unit="ms", dashed=roofline)


def main(argv=None) -> Path:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    peak, peak_source = flops.peak_tflops_per_device()
    limit, limit_source = memory.device_memory_limit(ml_collections.ConfigDict({"device_memory_gib": 0.0}))
    device = jax.devices()[0]
    path = args.out / f"scaling-{device_name()}.json"
    payload = {
        "device": {"platform": device.platform, "kind": device.device_kind},
        "jax_version": jax.__version__,
        "setting": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "peak_tflops_per_device": peak,
        "peak_source": peak_source,
        "memory_limit_bytes": limit,
        "memory_limit_source": limit_source,
        "flop_convention": "3 x the mixer's forward FLOPs (zoo/training/flops.py); causal attention: lower triangle",
        "results": [],
    }
    cases = [(v, t) for v in args.mixers for t in args.lengths]
    for i, (variant, length) in enumerate(cases, 1):
        r = run_case(variant, length, args, peak, limit)
        payload["results"].append(r)
        atomic_write_bytes(path, json.dumps(payload, indent=1).encode())  # a cut-off sweep keeps what it measured
        what = r.get("skipped") or (
            f"{r['forward_backward_ms']:.1f} ms, {r['memory_bytes'] / 2**20:,.0f} MiB, "
            f"{100 * (r['fraction_of_peak'] or 0):.0f}% of peak"
        )
        print(f"[{i}/{len(cases)}] {variant} T{length}: {what}", flush=True)
    write_plot(payload, path.with_suffix(".svg"))
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
