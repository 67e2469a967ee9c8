"""The MFU an encoder's train step could reach on this CPU if it did nothing but its matmuls.

    .venv/bin/python benchmarks/matmul_ceiling.py --out=benchmarks/step-profile-cpu/matmul-ceiling.json

Every matmul of one train step of the `lra_code` ListOps model (4 layers, d 512, 8 heads, MLP 1,024, T 2,000,
batch 4, fp32) with ReLU or softmax attention through the blocked XLA op (non-causal: per key block two products
forward, five backward, the scores recomputed) and the dense layers (forward, dX and dW), each timed alone at its
shape beside the float32 matmul rate measured in the same process. The ceiling is the step's model FLOPs (what MFU
counts, `zoo.training.flops`) over the sum of those times: what is left between it and a run's MFU is the step's
other work (element-wise, reductions, random bits, layout) and what running the products together costs. The
blocked softmax has the same products as the ReLU op; linear attention's chunked products are not modelled here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp

from kernels.bench import median_seconds
from kernels.blocking import default_block_k
from zoo.training.flops import encoder_flops, measured_cpu_tflops, train_step_flops


@dataclasses.dataclass(frozen=True)
class Product:
    name: str
    lhs: tuple[int, ...]
    rhs: tuple[int, ...]
    equation: str
    count: int  # how many times one train step computes it

    def flops(self) -> float:
        lhs, rest = self.equation.split(",")
        rhs = rest.split("->")[0]
        sizes = {**dict(zip(lhs, self.lhs, strict=True)), **dict(zip(rhs, self.rhs, strict=True))}
        return 2.0 * math.prod(sizes[c] for c in set(lhs + rhs))


def step_products(
    *, batch: int, length: int, d_model: int, num_heads: int, mlp_dim: int, num_layers: int, block_k: int
) -> list[Product]:
    """The matmuls of one train step of a non-causal attention encoder with the blocked XLA attention op."""
    b, h, t, d, bk, n = batch, num_heads, length, d_model // num_heads, block_k, batch * length
    blocks = num_layers * -(-length // block_k)  # the last block padded with zero keys
    return [
        Product("scores q·kᵀ (forward, backward again)", (b, h, t, d), (b, h, bk, d), "bhqd,bhkd->bhqk", 2 * blocks),
        Product("weights·v (forward)", (b, h, t, bk), (b, h, bk, d), "bhqk,bhkd->bhqd", blocks),
        Product("dV (transposed)", (b, h, d, t), (b, h, t, bk), "bhdq,bhqk->bhdk", blocks),
        Product("dP = dO·vᵀ", (b, h, t, d), (b, h, bk, d), "bhqd,bhkd->bhqk", blocks),
        Product("dQ = dS·k", (b, h, t, bk), (b, h, bk, d), "bhqk,bhkd->bhqd", blocks),
        Product("dK (transposed)", (b, h, d, t), (b, h, t, bk), "bhdq,bhqk->bhdk", blocks),
        Product("q, k, v, out projections and their dX", (n, d_model), (d_model, d_model), "nd,de->ne", 8 * num_layers),
        Product("q, k, v, out projections' dW", (d_model, n), (n, d_model), "dn,ne->de", 4 * num_layers),
        Product("MLP in, and MLP out's dX", (n, d_model), (d_model, mlp_dim), "nd,de->ne", 2 * num_layers),
        Product("MLP out, and MLP in's dX", (n, mlp_dim), (mlp_dim, d_model), "nd,de->ne", 2 * num_layers),
        Product("MLP in's and out's dW", (d_model, n), (n, mlp_dim), "dn,ne->de", 2 * num_layers),
    ]  # fmt: skip


def ceiling(products: list[Product], model_flops: float, peak_flops: float, repeats: int = 5) -> dict:
    """Each product's time and rate alone, and the step's MFU if its time were theirs alone."""
    rows, total = [], 0.0
    for i, p in enumerate(products):
        keys = jax.random.split(jax.random.key(i))
        lhs, rhs = (jax.random.normal(key, shape) for key, shape in zip(keys, (p.lhs, p.rhs), strict=True))
        seconds = median_seconds(jax.jit(lambda x, y, eq=p.equation: jnp.einsum(eq, x, y)), (lhs, rhs), repeats)
        total += p.count * seconds
        rate = p.flops() / seconds
        rows.append({"name": p.name, "lhs": p.lhs, "rhs": p.rhs, "count": p.count, "seconds": seconds,
                     "gflops_per_s": rate / 1e9, "fraction_of_peak": rate / peak_flops})  # fmt: skip
    computed = sum(p.count * p.flops() for p in products)
    return {
        "products": rows,
        "peak_gflops_per_s": peak_flops / 1e9,
        "model_flops_per_step": model_flops,
        "computed_flops_per_step": computed,
        "matmul_seconds_per_step": total,
        "mfu_ceiling": model_flops / total / peak_flops,
    }


def main() -> None:
    from lra_flax.configs.listops import get_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    model = get_config("lra_code").model
    if model.qkv_dim not in (0, model.d_model):
        raise SystemExit(f"model.qkv_dim={model.qkv_dim}: the products are enumerated for qkv_dim = d_model")
    length = model.max_length
    shapes = dict(batch=args.batch, length=length, d_model=model.d_model, num_heads=model.num_heads,
                  mlp_dim=model.mlp_dim, num_layers=model.num_layers,
                  block_k=default_block_k(causal=False))  # fmt: skip
    model_flops = train_step_flops(args.batch * encoder_flops(model, length))
    peak = measured_cpu_tflops() * 1e12
    measured = ceiling(step_products(**shapes), model_flops, peak, args.repeats)
    result = {"device": jax.devices()[0].device_kind, "shapes": shapes, **measured}
    for row in result["products"]:
        rate, fraction = row["gflops_per_s"], row["fraction_of_peak"]
        print(f"{row['name']:40s} ×{row['count']:<4d} {rate:7.1f} GFLOP/s {fraction:6.1%}")
    print(f"peak {result['peak_gflops_per_s']:.1f} GFLOP/s; the step's matmuls alone: "
          f"{result['matmul_seconds_per_step']:.2f} s; MFU ceiling {result['mfu_ceiling']:.1%}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
