"""Model FLOPs — the useful work of a train step, counted from the config — and the device's peak, for MFU.

Counted (forward, per sequence; a train step is 3 × the forward: the backward does two matmuls per forward one):
  - each mixer's matmuls, counted by its class's `forward_flops` (zoo/mixers): for attention the q/k/v/out
    projections (8·T·d·d_qkv) and the scores and weighted values (4·P·d_qkv, P = T² pairs, or T(T+1)/2 when
    causal: the lower triangle, not the masked square);
  - the FFN's two matmuls (4·T·d·d_mlp); a cross-attention's projections and scores (encoder-decoder);
  - the output projection onto the vocabulary where a model has one (translation, language models).
Not counted: embedding lookups, element-wise work (activations, softmax, normalisation, masks, dropout), a
classifier's head on one pooled vector per example, the loss and the optimiser. `tests/zoo/test_flops.py`
checks the count against XLA's cost analysis of a compiled non-causal train step.

Peak per device: `PEAK_BF16_TFLOPS` (vendor figures, dense bf16, no sparsity) for accelerators; on a CPU the
float32 matmul rate measured once per process (again, keeping the better, where a run's MFU came out above 1);
`train.peak_tflops_per_device` overrides either.
"""

from __future__ import annotations

import math
import os
import re
import time

import jax
import jax.numpy as jnp
import ml_collections

from zoo import mixers
from zoo.mixers.attention import attention_core_flops
from zoo.models.config import mixer_config

# Dense bf16 peak TFLOP/s per chip, without structured sparsity, matched against `device.device_kind` in order.
# NVIDIA: H100 SXM and H200 datasheets (989 TFLOPS bf16 dense; H100 PCIe 756); A100 datasheet (312).
# Google Cloud TPU system architecture pages: v4 275, v5e 197, v5p 459, v6e (Trillium) 918.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    (r"H100.*PCIe", 756.0),
    (r"H100", 989.0),
    (r"H200", 989.0),
    (r"A100", 312.0),
    (r"TPU v4", 275.0),
    (r"TPU v5 lite|TPU v5e", 197.0),
    (r"TPU v5p|TPU v5$", 459.0),
    (r"TPU v6 lite|TPU v6e", 918.0),
)


def mixer_flops(model: ml_collections.ConfigDict, length: int, *, causal: bool, name: str | None = None) -> float:
    """Forward FLOPs of one token mixer over one sequence of `length` tokens (the mixer class's `forward_flops`)."""
    return mixers.forward_flops(mixer_config(model, name=name), length, causal=causal)


def ffn_flops(model: ml_collections.ConfigDict, length: int) -> float:
    return 0.0 if model.ffn == "none" else 4.0 * length * model.d_model * model.mlp_dim


def encoder_flops(model: ml_collections.ConfigDict, length: int, *, causal: bool = False) -> float:
    """Forward FLOPs of the block stack over one sequence."""
    return model.num_layers * (mixer_flops(model, length, causal=causal) + ffn_flops(model, length))


def decoder_flops(model: ml_collections.ConfigDict, tgt_length: int, src_length: int) -> float:
    """Forward FLOPs of an encoder-decoder's decoder stack: causal self-mixing, cross-attention, FFN."""
    d = model.d_model
    d_qkv = model.qkv_dim or d
    cross = (
        4 * tgt_length * d * d_qkv
        + 4 * src_length * d * d_qkv
        + attention_core_flops(tgt_length, src_length, d_qkv, False)
    )
    per_block = mixer_flops(model, tgt_length, causal=True) + cross + ffn_flops(model, tgt_length)
    return (model.num_decoder_layers or model.num_layers) * per_block


def projection_flops(rows: int, d_in: int, d_out: int) -> float:
    return 2.0 * rows * d_in * d_out


def train_step_flops(forward_flops: float) -> float:
    """A train step's model FLOPs from its forward's: the backward does two matmuls for each forward one."""
    return 3.0 * forward_flops


def encoder_decoder_step_flops(model: ml_collections.ConfigDict, batch: dict, vocab_size: int) -> float:
    """Train-step FLOPs of an encoder-decoder on `src` and `tgt_in` (`[rows, length]`), with its vocabulary
    projection at every target position."""
    rows, src_length = batch["src"].shape
    tgt_length = batch["tgt_in"].shape[1]
    forward = (
        encoder_flops(model, src_length)
        + decoder_flops(model, tgt_length, src_length)
        + projection_flops(tgt_length, model.d_model, vocab_size)
    )
    return train_step_flops(rows * forward)


def language_model_step_flops(
    model: ml_collections.ConfigDict, batch: dict, vocab_size: int, *, causal: bool, predicted: int | None = None
) -> float:
    """Train-step FLOPs of a language model on `inputs` `[rows, length]`: a causal one projects every position
    onto the vocabulary; a masked one (BERT's head: a d×d transform, then the vocabulary) only the `predicted`
    positions of each row."""
    rows, length = batch["inputs"].shape
    forward = encoder_flops(model, length, causal=causal)
    if causal:
        forward += projection_flops(length, model.d_model, vocab_size)
    else:
        forward += projection_flops(predicted, model.d_model, model.d_model + vocab_size)
    return train_step_flops(rows * forward)


def encoder_step_flops(model: ml_collections.ConfigDict, batch: dict, fields: tuple[str, ...]) -> float:
    """Train-step FLOPs of an encoder over each token array in `fields` (`[rows, length]`: one per tower)."""
    return train_step_flops(
        sum(batch[f].shape[0] * encoder_flops(model, batch[f].shape[1]) for f in fields)
    )  # fmt: skip


def cpu_matmul_tflops(size: int = 1024, repeats: int = 8, seconds: float = 1.0) -> float:
    """The float32 matmul rate of the default CPU device now, TFLOP/s: the best round of `repeats` matmuls within
    `seconds` (a shared VM's rate comes in phases: 0.074–0.144 TFLOP/s on a 2-core VM, phases of about a second)."""
    a = jnp.ones((size, size), jnp.float32)
    matmul = jax.jit(lambda x, y: x @ y)
    matmul(a, a).block_until_ready()  # compiled
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline or best == float("inf"):
        start = time.perf_counter()
        for _ in range(repeats):
            out = matmul(a, a)
        out.block_until_ready()
        best = min(best, (time.perf_counter() - start) / repeats)
    return 2.0 * size**3 / best / 1e12


# The host's float32 matmul rate in TFLOP/s, when it is known already (a cluster's CPU nodes, a test suite that
# starts many short commands): a training command then skips its start-up measurement.
CPU_PEAK_ENV = "ZOO_CPU_PEAK_TFLOPS"


def cpu_peak_from_env() -> float | None:
    """The rate that CPU_PEAK_ENV sets, or None when unset or empty; not a positive, finite number: a ValueError."""
    text = os.environ.get(CPU_PEAK_ENV, "").strip()
    if not text:
        return None
    try:
        rate = float(text)
    except ValueError:
        rate = float("nan")
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"{CPU_PEAK_ENV}={text!r} must be a positive number of TFLOP/s (or unset, to measure)")
    return rate


MEASURED_ON_THIS_HOST = "float32 matmul rate measured on this host"  # the source of a peak that was measured
_MEASURED_CPU_TFLOPS: list[float] = []  # this process's best measurement of the rate, once there is one


def measured_cpu_tflops() -> float:
    """This process's float32 matmul rate: measured in half a second when first asked for (at a training command's
    start, perhaps in a slow phase), then the best of this process's measurements (`remeasure_cpu_tflops`)."""
    if not _MEASURED_CPU_TFLOPS:
        _MEASURED_CPU_TFLOPS.append(cpu_matmul_tflops(seconds=0.5))
    return _MEASURED_CPU_TFLOPS[0]


def remeasure_cpu_tflops() -> float:
    """Measures the rate again (half a second) and keeps the better one, for this process's later runs too: for a
    run whose MFU came out above 1, its start-up measurement taken in a slow phase or beside other work."""
    best = max(measured_cpu_tflops(), cpu_matmul_tflops(seconds=0.5))
    _MEASURED_CPU_TFLOPS[:] = [best]
    return best


def peak_tflops_per_device(train: ml_collections.ConfigDict | None = None) -> tuple[float, str]:
    """(peak TFLOP/s of one device, where the figure comes from)."""
    override = train.get("peak_tflops_per_device", 0.0) if train is not None else 0.0
    if override:
        return float(override), "train.peak_tflops_per_device"
    device = jax.local_devices()[0]
    if device.platform == "cpu":
        # CPU devices (fake ones too) share the host's cores.
        if (rate := cpu_peak_from_env()) is not None:
            return rate / jax.local_device_count(), f"float32 matmul rate of this host from {CPU_PEAK_ENV}"
        return measured_cpu_tflops() / jax.local_device_count(), MEASURED_ON_THIS_HOST
    for pattern, tflops in PEAK_BF16_TFLOPS:
        if re.search(pattern, device.device_kind):
            return tflops, f"{device.device_kind} dense bf16 peak"
    return 0.0, f"no peak known for {device.device_kind}; set train.peak_tflops_per_device"


__all__ = [
    "MEASURED_ON_THIS_HOST",
    "PEAK_BF16_TFLOPS",
    "cpu_matmul_tflops",
    "decoder_flops",
    "encoder_decoder_step_flops",
    "encoder_flops",
    "encoder_step_flops",
    "ffn_flops",
    "language_model_step_flops",
    "measured_cpu_tflops",
    "mixer_flops",
    "peak_tflops_per_device",
    "projection_flops",
    "remeasure_cpu_tflops",
    "train_step_flops",
]  # fmt: skip
