"""Incremental decoding benchmark: tokens/s and memory per mixer, source = target length 128 … 2048.

    python -m mt_flax.bench_decode --out benchmarks [--lengths 128,512,2048] [--mixers softmax,relu,linear,gmlp]

Each run encodes a random source and decodes exactly `length` target tokens (greedy, EOS ignored) in one
jitted scan, with the decoder's self-attention state: a key-value cache for softmax / ReLU, the running
(S, z) for linear attention, the gate inputs for the causal SGU. Cross-attention keys/values are projected
once. Reports the median of `--repeats` timed runs after a warm-up, the decoding state's bytes, and the
compiled program's temporary bytes. Results go to benchmarks/decode-<device>.json with the device named.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from kernels.bench import device_name
from zoo.models import EncoderDecoder, model_config


def _decode_fixed(model, src, length: int):
    enc, mask = model.encode(src)
    kv = model.project_context(enc)
    cache = model.init_cache(src.shape[0], length)

    def step(carry, _):
        token, cache = carry
        logits, cache = model.decode(token, cache, enc, mask, kv)
        token = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)[:, None]
        return (token, cache), token[:, 0]

    start = jnp.full((src.shape[0], 1), 2, jnp.int32)
    return jax.lax.scan(step, (start, cache), None, length=length)[1].T


def bench_one(mixer: str, length: int, *, batch: int, d_model: int, layers: int, vocab: int, repeats: int) -> dict:
    cfg = model_config(
        mixer=mixer,
        num_layers=layers,
        d_model=d_model,
        num_heads=4,
        mlp_dim=2 * d_model,
        max_length=length,
        dropout=0.0,
    )
    model = EncoderDecoder(cfg, src_vocab=vocab, tgt_vocab=vocab, rngs=nnx.Rngs(0))
    model.eval()
    graphdef, state = nnx.split(model)
    fn = jax.jit(lambda state, src: _decode_fixed(nnx.merge(graphdef, state), src, length))
    src = jax.random.randint(jax.random.key(0), (batch, length), 4, vocab)
    compiled = fn.lower(state, src).compile()
    mem = compiled.memory_analysis()
    cache = jax.eval_shape(lambda: model.init_cache(batch, length))
    cache_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache))
    compiled(state, src).block_until_ready()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        compiled(state, src).block_until_ready()
        times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    return {
        "mixer": mixer,
        "length": length,
        "batch": batch,
        "seconds": t,
        "tokens_per_s": batch * length / t,
        "decode_state_mib": cache_bytes / 2**20,
        "temp_mib": (getattr(mem, "temp_size_in_bytes", 0) or 0) / 2**20 if mem else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks")
    parser.add_argument("--lengths", default="128,512,2048")
    parser.add_argument("--mixers", default="softmax,relu,linear,gmlp")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--d_model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = jax.devices()[0]
    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        for mixer in args.mixers.split(","):
            row = bench_one(
                mixer,
                length,
                batch=args.batch,
                d_model=args.d_model,
                layers=args.layers,
                vocab=args.vocab,
                repeats=args.repeats,
            )
            rows.append(row)
            print(
                f"{mixer:>8} L={length:<5} {row['tokens_per_s']:>10.0f} tok/s  state {row['decode_state_mib']:8.2f} MiB"
                f"  temp {row['temp_mib'] or 0:8.2f} MiB",
                flush=True,
            )
    out = Path(args.out) / f"decode-{device_name()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "device": f"{device.platform}: {device.device_kind}",
        "host": platform.processor() or platform.machine(),
        "jax": jax.__version__,
        "model": {
            "d_model": args.d_model,
            "layers": f"{args.layers}+{args.layers}",
            "heads": 4,
            "vocab": args.vocab,
            "batch": args.batch,
        },
        "what": "greedy decoding of exactly `length` target tokens from a `length`-token source, jitted scan",
    }
    out.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
