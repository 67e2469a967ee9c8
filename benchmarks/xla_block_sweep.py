"""The blocked XLA impls' key-block sweep behind `kernels/blocking.py`'s per-platform default.

    .venv/bin/python benchmarks/xla_block_sweep.py --length=4096 --out=benchmarks/xla-blocks-cpu/T4096.json

Forward+backward of ReLU and softmax attention (impl "xla"), B1 H4 D64 fp32, causal and not, for each key block;
the useful FLOPs (3.5 × 4·H·pairs·D, causal pairs = the lower triangle) over the float32 matmul rate measured in
the same process.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import jax.numpy as jnp

import kernels
from kernels.bench import median_seconds
from zoo.training.flops import measured_cpu_tflops


def sweep(length: int, blocks: list[int], repeats: int = 3, heads: int = 4, head_dim: int = 64) -> dict:
    q, k, v = (jax.random.normal(key, (1, length, heads, head_dim)) for key in jax.random.split(jax.random.key(0), 3))
    rate = measured_cpu_tflops() * 1e12
    rows = []
    for op in ("relu", "softmax"):
        for causal in (True, False):
            for block in blocks:
                if op == "relu":
                    options = kernels.ReluAttentionOptions(impl="xla", xla_block_k=block)
                    attend = kernels.relu_attention
                else:
                    options = kernels.SoftmaxAttentionOptions(impl="xla", xla_block_k=block)
                    attend = kernels.softmax_attention

                def loss(q, k, v, attend=attend, options=options, causal=causal):
                    return jnp.sum(attend(q, k, v, causal=causal, options=options))

                seconds = median_seconds(jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))), (q, k, v), repeats)
                pairs = length * (length + 1) / 2 if causal else float(length) ** 2
                useful = 3.5 * 4 * heads * head_dim * pairs
                rows.append(dict(op=op, causal=causal, block=block, ms=1e3 * seconds,
                                 pct_of_matmul=100 * useful / seconds / rate))  # fmt: skip
                print(rows[-1], flush=True)
    return {"device": jax.devices()[0].device_kind, "matmul_gflops": rate / 1e9, "length": length, "rows": rows}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--blocks", default="128,256,512,1024")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    result = sweep(args.length, [int(b) for b in args.blocks.split(",")], args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
