"""How the attention ops run: one frozen options dataclass per op, checked when it is built.

`ReluAttentionOptions` and `LinearAttentionOptions` say which implementation computes an op and how it is tiled;
they never change what is computed (up to rounding). That — causal or not, the key mask, γ and the row scale of
ReLU attention, ε and its mode of linear attention — is given by the ops' own arguments. A model builds its
options once (the zoo's mixers from their `impl` and `chunk_size` settings) and passes them to every call:

    opts = ReluAttentionOptions(impl="mosaic_tpu", pallas_block_sizes=TpuBlockSizes(block_q=256))
    out = relu_attention(q, k, v, causal=True, options=opts)

Each kernel build's tile sizes are its own dataclass, defined beside its kernels and listed here per op
(`BLOCK_SIZES`), so sizes for another op or another build are an error that names the field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import jax

from kernels.auto import PALLAS_BACKENDS, pick, resolve_pallas_backend
from kernels.blocking import default_block_k
from kernels.checks import check_block_length
from kernels.linear_attention.mosaic_gpu import MgpuChunkSizes
from kernels.linear_attention.mosaic_tpu import TpuChunkSizes
from kernels.linear_attention.triton import LinearBlockSizes
from kernels.relu_attention.mosaic_gpu import MgpuBlockSizes
from kernels.relu_attention.mosaic_tpu import TpuBlockSizes
from kernels.relu_attention.triton import PallasBlockSizes

# Each op's Pallas builds, by impl name, with their tile sizes: sizes of another build, or of the other op, are
# refused. A new build is one line here (and its branch in the op's `_kernels`).
RELU_BLOCK_SIZES = {"triton": PallasBlockSizes, "mosaic_gpu": MgpuBlockSizes, "mosaic_tpu": TpuBlockSizes}
LINEAR_BLOCK_SIZES = {"triton": LinearBlockSizes, "mosaic_gpu": MgpuChunkSizes, "mosaic_tpu": TpuChunkSizes}
IMPLS = ("auto", "reference", "xla", *RELU_BLOCK_SIZES, "pallas")
# `pallas_backend`'s names (impl "pallas", the older spelling of a build) → the build; "gpu" and None are resolved
# by `kernels.auto.resolve_pallas_backend` first.
LEGACY_BUILDS = {"tpu": "mosaic_tpu", "triton": "triton", "mosaic_gpu": "mosaic_gpu"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelOptions:
    """The options both ops share (use `ReluAttentionOptions` or `LinearAttentionOptions`).

    impl: "reference" (dense fp32 definition), "xla" (blocked or chunked jnp), a Pallas build by name
      ("triton", "mosaic_gpu", "mosaic_tpu"), "auto" (what `kernels.auto`'s table picks on this device generation,
      else "xla"), or "pallas" (the older spelling: the build `pallas_backend` names).
    pallas_backend: with impl "pallas" only: "tpu", "triton", "mosaic_gpu", "gpu" (Mosaic GPU on Hopper once it
      has an entry in `kernels.auto.TABLE` there, else Triton) or None (the running platform's).
    pallas_block_sizes: tile sizes of the kernels that run, as their build's dataclass (`BLOCK_SIZES`); None:
      that build's defaults.
    pallas_interpret: run the kernels in Pallas interpret mode (True); "tpu": the Mosaic TPU kernels in Pallas's TPU
      interpret mode (`kernels.numerics.tpu_interpret`), the others as True; None: on a CPU backend only.
    """

    OP: ClassVar[str]
    BLOCK_SIZES: ClassVar[dict[str, type]]  # Pallas build ("triton", "mosaic_gpu", "mosaic_tpu") → its tile sizes
    LENGTH_FIELD: ClassVar[str]  # the op's own block or chunk length (positive or None)

    impl: str = "auto"
    pallas_backend: str | None = None
    pallas_block_sizes: object = None
    pallas_interpret: bool | str | None = None

    def _error(self, field: str, message: str) -> ValueError:
        return ValueError(f"{type(self).__name__}.{field}: {message}")

    def __post_init__(self):
        if self.impl not in IMPLS:
            raise self._error("impl", f"unknown {self.OP} impl {self.impl!r}; valid: {', '.join(IMPLS)}")
        if self.pallas_backend is not None and self.impl in self.BLOCK_SIZES:
            raise self._error("pallas_backend", f"goes with impl 'pallas' only; impl {self.impl!r} names its build")
        if self.pallas_backend is not None and self.pallas_backend not in PALLAS_BACKENDS:
            valid = ", ".join(PALLAS_BACKENDS)
            raise self._error("pallas_backend", f"unknown pallas_backend {self.pallas_backend!r}; valid: {valid}")
        mode = self.pallas_interpret
        if not (mode is None or isinstance(mode, bool) or mode == "tpu"):
            raise self._error("pallas_interpret", f"must be True, False, 'tpu' or None, got {self.pallas_interpret!r}")
        sizes = self.pallas_block_sizes
        if sizes is not None and not isinstance(sizes, tuple(self.BLOCK_SIZES.values())):
            valid = ", ".join(f"{t.__name__} ({build})" for build, t in self.BLOCK_SIZES.items())
            raise self._error("pallas_block_sizes", f"{type(sizes).__name__} are not {self.OP}'s; valid: {valid}")
        build = self.impl if self.impl in self.BLOCK_SIZES else LEGACY_BUILDS.get(self.pallas_backend)
        named = self.BLOCK_SIZES.get(build)
        if sizes is not None and named is not None and not isinstance(sizes, named):
            raise self._error(
                "pallas_block_sizes", f"{type(sizes).__name__} are not the {build} kernels' ({named.__name__})"
            )
        check_block_length(self, self.LENGTH_FIELD)

    def plan(self, length: int, mosaic_refusal: Callable[[], str | None], *, causal: bool, dtype, head_dim: int) -> str:
        """What runs at key `length`: "reference", "xla" or a Pallas build ("triton", "mosaic_gpu", "mosaic_tpu").
        "auto" follows `kernels.auto.pick` for inputs of this `dtype` and largest head dim `head_dim` in this
        attention mode; "pallas" the build `pallas_backend` names (`kernels.auto.resolve_pallas_backend`).
        `mosaic_refusal()`: why the Mosaic GPU kernels cannot take the inputs (None: they can)."""
        if self.impl == "auto":
            return pick(
                self.OP, causal=causal, length=length, dtype=dtype, head_dim=head_dim,
                refusals={"mosaic_gpu": mosaic_refusal},
            )  # fmt: skip
        if self.impl == "pallas":
            backend = resolve_pallas_backend(self.pallas_backend, mosaic_refusal, op=self.OP)
            return LEGACY_BUILDS.get(backend, "triton")  # "gpu", or a CPU's name: Triton (interpreted there)
        return self.impl

    def interpret(self) -> bool:
        """Whether the kernels run in interpret mode: `pallas_interpret` ("tpu" counts), by default on a CPU."""
        return jax.default_backend() == "cpu" if self.pallas_interpret is None else bool(self.pallas_interpret)

    def tpu_interpret(self) -> bool | str:
        """`pallas_interpret` for the Mosaic TPU kernels: "tpu" as it is, else `interpret()`."""
        return "tpu" if self.pallas_interpret == "tpu" else self.interpret()

    def triton_platform(self) -> str:
        """What the Triton kernels are built for: "gpu", or in interpret mode the running platform's name."""
        return jax.default_backend() if self.interpret() else "gpu"

    def block_sizes_for(self, build: str):
        """`pallas_block_sizes` for `build`, None when unset; ValueError when they are another build's (impl
        "pallas" with `pallas_backend` "gpu" that ran Triton with Mosaic GPU tile sizes)."""
        sizes = self.pallas_block_sizes
        if sizes is not None and not isinstance(sizes, self.BLOCK_SIZES[build]):
            raise self._error(
                "pallas_block_sizes",
                f"{type(sizes).__name__} are not for the {build} kernels, which run here and take "
                f"{self.BLOCK_SIZES[build].__name__} (pallas_backend names the kernels to run)",
            )
        return sizes


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReluAttentionOptions(KernelOptions):
    """`relu_attention`'s options: those of `KernelOptions`, and

    xla_block_k: the key-block length of impl "xla" (its memory is O(T_q · xla_block_k) per step); None: the
      platform's measured default (`kernels.blocking.XLA_BLOCK_K`: on a CPU 256, causal 128; else 512).
    """

    OP: ClassVar[str] = "relu_attention"
    BLOCK_SIZES: ClassVar[dict[str, type]] = RELU_BLOCK_SIZES
    LENGTH_FIELD: ClassVar[str] = "xla_block_k"

    pallas_block_sizes: PallasBlockSizes | TpuBlockSizes | MgpuBlockSizes | None = None
    xla_block_k: int | None = None

    def block_k(self, *, causal: bool) -> int:
        """`xla_block_k`, or the platform's default for causal or non-causal attention when unset."""
        return self.xla_block_k or default_block_k(causal=causal)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LinearAttentionOptions(KernelOptions):
    """`linear_attention`'s options: those of `KernelOptions`, and

    chunk_size: the causal chunk length of impl "xla" (None: 64) and of the Triton and Mosaic GPU kernels when
      `pallas_block_sizes` is None (None: theirs by default). The TPU kernels' chunk is `TpuChunkSizes.chunk`.
    """

    OP: ClassVar[str] = "linear_attention"
    BLOCK_SIZES: ClassVar[dict[str, type]] = LINEAR_BLOCK_SIZES
    LENGTH_FIELD: ClassVar[str] = "chunk_size"

    pallas_block_sizes: LinearBlockSizes | TpuChunkSizes | MgpuChunkSizes | None = None
    chunk_size: int | None = None
