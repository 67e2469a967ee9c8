"""`python -m kernels [--markdown]`: what `impl="auto"` runs (`kernels.auto.TABLE`), and what it picks here."""

import argparse
import sys

import jax
import jax.numpy as jnp

from kernels import auto, platforms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels", description=__doc__)
    parser.add_argument("--markdown", action="store_true", help="print the table as docs/kernels.md holds it")
    args = parser.parse_args(argv)
    if args.markdown:
        print(auto.markdown(), end="")
        return 0
    for entry in auto.TABLE:
        print(entry)
    here = platforms.device_class()
    print(f"this machine: {here}, jax {jax.__version__}")
    for op in auto.OPS:
        for causal in (True, False):
            picked = auto.pick(op, causal=causal, length=1 << 14, dtype=jnp.bfloat16, head_dim=128, device=here)
            print(f"  {op}, {'causal' if causal else 'full'}, bf16, D 128, T 16K: {picked}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
