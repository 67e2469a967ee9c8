"""ReLU attention for Hopper GPUs in Mosaic GPU (`plgpu.kernel`): TMA copies and wgmma. EXPERIMENTAL.

Forward, warp-specialised (default, `MgpuBlockSizes.warp_specialized`) as FlashAttention-3 / JAX's
attention_mgpu, minus the softmax: one CUDA block per (pair of query tiles, head, batch) of the caller's
`[B, T, H, D]` arrays, two compute warpgroups (a query tile each) sharing `stages` key/value slots that a third,
memory warpgroup refills by TMA once both have consumed them; QKᵀ and P·V are wgmma into fp32 accumulators,
the row factor 1/(γ r(n_i)) scales the rows before the store, and causal blocks stop at the diagonal. The
one-warpgroup variant (also for d_v ≠ d) issues its own copies and leaves the factor to an XLA pass.

Padded keys are made invisible by zeroing their value rows in XLA (ReLU attention, unlike softmax, then needs
no score mask). Backward (`MgpuBlockSizes.backward`): a Mosaic dq kernel (with the per-row Σ p·dP that gives
d factor) and a dk/dv kernel, each streaming the other side's tiles through `stages` TMA slots and, when causal,
visiting only the tiles that touch the diagonal or lie below it — or the Triton kernels of
`relu_attention_triton` (same residuals).

It lowers for CUDA on a CPU (tests/kernels/test_relu_attention_mosaic_gpu.py, `jax.export`); JAX's GPU
interpret mode (jax 0.10) cannot run wgmma on transposed shared-memory refs, so its numbers are checked only
on a GPU (benchmarks/gpu/session.sh, step `kernel-tests`). `impl="auto"` and `pallas_backend="gpu"` run it
only from a `kernels.auto` entry; `pallas_backend="mosaic_gpu"` asks for it by name.
Limits (`supported`, reviewed against JAX's attention_mgpu: kernels/README.md): bf16/fp16 inputs of one dtype,
head dims multiples of 64 up to 256 (up to 128 with the Mosaic backward), lengths whole tiles (64 by default;
the Triton kernels mask ragged tails, this one does not yet), 2–32 stages, no causal masks with CUDA 12.8–12.9.0.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.mosaic_gpu_tiles import (
    load_reduced,
    masked_refusal,
    memory_warpgroup,
    scores_tile,
    swizzled,
    visible,
)

BACKWARDS = ("fused", "mosaic", "triton")


@dataclasses.dataclass(frozen=True)
class MgpuBlockSizes:
    """Tiles of the Mosaic GPU kernels. block_q, block_k: the forward's query tile (two a CUDA block when
    warp-specialised) and key tile. block_q_bwd, block_k_bwd: the backward's (the fused one holds two key
    tiles a block). stages: shared-memory slots in flight (keys and values forward; queries, dO and the factor
    backward). backward: "fused" (one kernel over key tiles, FlashAttention-3's), "mosaic" (a dq kernel and a
    dk/dv kernel) or "triton" (`relu_attention_triton`'s). warp_specialized: the forward's two compute
    warpgroups and a memory warpgroup, as FlashAttention-3 / JAX's attention_mgpu; False: one warpgroup issuing
    its own copies."""

    block_q: int = 64
    block_k: int = 64
    stages: int = 2
    backward: str = "fused"
    warp_specialized: bool = True
    block_q_bwd: int = 64
    block_k_bwd: int = 64

    @property
    def forward_rows(self) -> int:
        """Query rows per CUDA block of the forward kernel."""
        return 2 * self.block_q if self.warp_specialized else self.block_q

    def __post_init__(self):
        if self.backward not in BACKWARDS:
            raise ValueError(f"MgpuBlockSizes.backward must be one of {', '.join(BACKWARDS)}, got {self.backward!r}")
        tiles = (self.block_q, self.block_k, self.block_q_bwd, self.block_k_bwd)
        if any(tile % 64 for tile in tiles):
            raise ValueError(f"MgpuBlockSizes: tiles must be multiples of 64, got {tiles}")
        if self.block_k > 256:  # a wgmma's N is at most 256
            raise ValueError(f"MgpuBlockSizes.block_k must be at most 256, got {self.block_k}")
        # One stage serialises every copy with the compute (JAX's attention_mgpu asks for ≥ 2 as well); an
        # mbarrier group holds at most 32 barriers.
        if not 2 <= self.stages <= 32:
            raise ValueError(f"MgpuBlockSizes.stages must be from 2 to 32, got {self.stages}")


def default_block_sizes(head_dim: int) -> MgpuBlockSizes:
    """The tiles for a head dim, as JAX's attention_mgpu picks them on Hopper: key tiles of 128 up to D 128 (a
    64 × 128 fp32 score tile and a 64 × D accumulator: 128 registers a thread), 64 above (the accumulator alone
    is 128 at D 256). Not yet timed on a GPU."""
    return MgpuBlockSizes(block_k=128 if head_dim <= 128 else 64)


# fp32 registers a thread of a dk/dv warpgroup holds at head dim D: two 64 × D accumulators (dk, dv) are
# 2·64·D/128 = D registers, 256 at D 256 — over the 255 a thread may have, before the score tiles: it spills.
MOSAIC_BACKWARD_MAX_HEAD_DIM = 128


def supported(q: jax.Array, k: jax.Array, v: jax.Array, sizes: MgpuBlockSizes, causal: bool = True) -> str | None:
    """None if the kernels take these inputs (forward and the backward `sizes.backward` names), else why not.
    `causal`: the kernels then carry causal masks (refused with the CUDA versions that miscompile them)."""
    q_tile, k_tile = sizes.forward_rows, sizes.block_k
    if sizes.backward != "triton":  # the backward's tiles too (the fused one holds two key tiles a block)
        q_tile = math.lcm(q_tile, sizes.block_q_bwd)
        k_tile = math.lcm(k_tile, sizes.block_k_bwd * (2 if sizes.backward == "fused" else 1))
    if q.shape[1] % q_tile or k.shape[1] % k_tile:
        # attention_mgpu in JAX's own ops asks the same: reads past the end are not relied on
        return (
            f"Mosaic GPU ReLU attention needs lengths that are whole tiles: {q.shape[1]} and {k.shape[1]} "
            f"for {q_tile}×{k_tile} tiles"
        )
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        return f"Mosaic GPU ReLU attention takes bf16/fp16 inputs, got {q.dtype}"
    if not q.dtype == k.dtype == v.dtype:  # the tiles are staged in one dtype
        return f"Mosaic GPU ReLU attention needs q, k, v of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
    if q.shape[-1] % 64 or v.shape[-1] % 64:
        return f"Mosaic GPU ReLU attention needs head dims that are multiples of 64, got {q.shape[-1]}, {v.shape[-1]}"
    if max(q.shape[-1], v.shape[-1]) > 256:  # a 64 × D fp32 accumulator in one warpgroup: 128 registers at D 256
        return f"Mosaic GPU ReLU attention takes head dims up to 256, got {q.shape[-1]}, {v.shape[-1]}"
    if sizes.backward != "triton" and max(q.shape[-1], v.shape[-1]) > MOSAIC_BACKWARD_MAX_HEAD_DIM:
        return (
            f"Mosaic GPU ReLU attention's dk/dv kernel holds two 64 × D fp32 accumulators a warpgroup: head dims "
            f"{q.shape[-1]}, {v.shape[-1]} are over {MOSAIC_BACKWARD_MAX_HEAD_DIM} (they would spill); "
            f"MgpuBlockSizes(backward='triton') takes them"
        )
    if causal and (reason := masked_refusal()):
        return reason
    need = shared_memory_bytes(sizes, q.shape[-1], v.shape[-1], q.dtype.itemsize)
    if need > SHARED_MEMORY_BYTES:
        return (
            f"Mosaic GPU ReLU attention with {sizes} and head dims {q.shape[-1]}, {v.shape[-1]} needs {need} bytes "
            f"of shared memory per block, over the {SHARED_MEMORY_BYTES} a Hopper block has (fewer stages)"
        )
    return None


SHARED_MEMORY_BYTES = 227 * 1024  # the most one CUDA block may use on sm_90


def shared_memory_bytes(sizes: MgpuBlockSizes, d: int, dv: int, itemsize: int) -> int:
    """The largest shared-memory footprint of the forward and the backward kernels (tiles only)."""
    bq, bk, stages = sizes.block_q, sizes.block_k, sizes.stages
    fwd_q_tiles = 2 if sizes.warp_specialized else 1
    forward = (fwd_q_tiles * bq * d + stages * bk * (d + dv) + (0 if sizes.warp_specialized else bq * dv)) * itemsize
    bq, bk = sizes.block_q_bwd, sizes.block_k_bwd
    if sizes.backward == "fused":  # two key tiles, their dSᵀ, fp32 dQ and row sums staged for the reductions
        tiles = (2 * bk * (d + dv) + stages * bq * (d + dv) + 2 * bk * bq) * itemsize
        return max(forward, tiles + 4 * (stages * bq + 2 * bq * d + 2 * bq))
    dq = (bq * (d + dv) + stages * bk * (d + dv)) * itemsize
    dkdv = (bk * (d + dv) + stages * bq * (d + dv)) * itemsize + stages * bq * 4
    return max(forward, dq, dkdv) if sizes.backward == "mosaic" else forward


def _forward_specialized(q, k, v, factor, *, causal: bool, scale: float, sizes: MgpuBlockSizes):
    """factor_i Σ_j ReLU(q_i·k_j·scale) [j ≤ i if causal] v_j, `[B, T_q, H, D_v]` in v's dtype.

    Three warpgroups per CUDA block: warpgroups 0 and 1 each own a query tile of `block_q` rows (the block's
    2·block_q rows) and share the key/value slots; warpgroup 2 issues the TMA copies, refilling a slot once
    both compute warpgroups have arrived on its "consumed" barrier. A schedule barrier that both compute
    warpgroups pass twice a step (warpgroup 1 once more before its first, warpgroup 0 once more after its last)
    keeps them half a step apart, as FlashAttention-3's ping-pong and JAX's attention_mgpu: one's QKᵀ wgmma
    runs on the tensor cores while the other applies ReLU and converts P. Causal: the tiles every row of a query
    tile sees whole run unmasked, the diagonal ones masked; a compute warpgroup whose own tile ends before the
    block's last key tile still waits for the remaining tiles, arrives on their barriers and passes the schedule
    barrier with the other, so neither the memory warpgroup nor its sibling waits for a consumer that is gone.
    """
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b, tq, h, d = q.shape
    tk, dv = k.shape[1], v.shape[-1]
    bq, bk = sizes.block_q, sizes.block_k
    num_k = tk // bk
    stages = min(sizes.stages, num_k)
    dtype = q.dtype
    layout = swizzled(dtype)

    def kernel(q_ref, k_ref, v_ref, f_ref, o_ref, scoped):
        (q_smem2, f_smem2, k_smem, v_smem), (k_bar, v_bar, q_bar, f_bar), (k_used, v_used), schedule = scoped
        batch, head, wg = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("wg")
        block_rows = lax.axis_index("q_tiles") * (2 * bq)
        if causal:
            block_steps = jnp.minimum(lax.div(block_rows + 2 * bq + bk - 1, bk), num_k)
        else:
            block_steps = num_k

        def schedule_barrier():
            plgpu.barrier_arrive(schedule)
            plgpu.barrier_wait(schedule)

        @pl.when(wg < 2)
        def _compute():
            plgpu.set_max_registers(232, action="increase")
            q_smem, f_smem = q_smem2.at[wg], f_smem2.at[wg]
            q0 = block_rows + wg * bq
            rows = (batch, pl.ds(q0, bq), head)
            steps = jnp.minimum(lax.div(q0 + bq + bk - 1, bk), num_k) if causal else num_k
            plgpu.copy_gmem_to_smem(q_ref.at[rows], q_smem, q_bar.at[wg])
            plgpu.copy_gmem_to_smem(f_ref.at[batch, head, pl.ds(q0, bq)], f_smem, f_bar.at[wg])
            plgpu.barrier_wait(q_bar.at[wg])
            plgpu.barrier_wait(f_bar.at[wg])

            @pl.when(steps > 0)
            def _():
                plgpu.barrier_wait(k_bar.at[0])

            pl.when(wg == 1)(schedule_barrier)

            def step(j, acc, masked):
                slot = lax.rem(j, stages)  # its keys landed: waited for before this step (above, or by the last)

                def qk(acc_ref):
                    plgpu.wgmma(acc_ref, q_smem, k_smem.at[slot].transpose((1, 0)))
                    schedule_barrier()  # the other warpgroup's P·V may now take the tensor cores
                    return acc_ref[...]

                p = jnp.maximum(pl.run_scoped(qk, plgpu.ACC((bq, bk), jnp.float32)) * scale, 0.0)
                plgpu.barrier_arrive(k_used.at[slot])
                if masked:
                    p = jnp.where(visible(q0, j * bk, (bq, bk), "row_ge_col"), p, 0.0)
                p = p.astype(dtype)
                plgpu.barrier_arrive(schedule)  # ReLU done
                plgpu.barrier_wait(v_bar.at[slot])
                plgpu.barrier_wait(schedule)  # the tensor cores are free

                def pv(acc_ref):
                    plgpu.wgmma(acc_ref, p, v_smem.at[slot])
                    nxt = j + 1  # wait for the next keys while this product runs

                    @pl.when(nxt < steps)
                    def _():
                        plgpu.barrier_wait(k_bar.at[lax.rem(nxt, stages)])

                acc = pl.run_state(pv)(plgpu.ACC.init(acc))
                plgpu.barrier_arrive(v_used.at[slot])
                return acc

            acc = plgpu.layout_cast(jnp.zeros((bq, dv), jnp.float32), plgpu.Layout.WGMMA)
            if causal:  # tiles wholly at or before the first row, then the diagonal ones, then release the rest
                whole = jnp.minimum(lax.div(q0 + 1, bk), steps)
                acc = lax.fori_loop(0, whole, functools.partial(step, masked=False), acc)
                acc = lax.fori_loop(whole, steps, functools.partial(step, masked=True), acc)

                def release(j, carry):  # tiles this query tile does not need: let the memory warpgroup refill
                    slot = lax.rem(j, stages)
                    # Only once tile j has landed: that copy was issued after both warpgroups consumed tile
                    # j − stages, so this arrival cannot complete that earlier phase in the other one's stead.
                    plgpu.barrier_wait(k_bar.at[slot])
                    plgpu.barrier_wait(v_bar.at[slot])
                    plgpu.barrier_arrive(k_used.at[slot])
                    plgpu.barrier_arrive(v_used.at[slot])
                    schedule_barrier()  # the other warpgroup's two passes of this step
                    schedule_barrier()
                    return carry

                lax.fori_loop(steps, block_steps, release, None)
            else:
                acc = lax.fori_loop(0, steps, functools.partial(step, masked=False), acc)
            pl.when(wg == 0)(schedule_barrier)
            f = load_reduced(f_smem, plgpu.Layout.WGMMA.reduce(1))
            q_smem[...] = (acc * lax.broadcast_in_dim(f, (bq, dv), [0])).astype(dtype)  # q's tile stages the output
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(q_smem, o_ref.at[rows])
            plgpu.wait_smem_to_gmem(0)

        @pl.when(wg == 2)
        def _memory():
            def fetch(j, slot):
                tile = (batch, pl.ds(j * bk, bk), head)
                plgpu.copy_gmem_to_smem(k_ref.at[tile], k_smem.at[slot], k_bar.at[slot])
                plgpu.copy_gmem_to_smem(v_ref.at[tile], v_smem.at[slot], v_bar.at[slot])

            memory_warpgroup(fetch, block_steps, stages, (k_used, v_used))

    def entry(q_ref, k_ref, v_ref, f_ref, o_ref):
        pl.run_scoped(
            lambda *scoped: kernel(q_ref, k_ref, v_ref, f_ref, o_ref, scoped),
            (
                plgpu.SMEM((2, bq, d), dtype, transforms=layout),  # d == dv: q's tile stages the output
                plgpu.SMEM((2, bq), jnp.float32),
                plgpu.SMEM((stages, bk, d), dtype, transforms=layout),
                plgpu.SMEM((stages, bk, dv), dtype, transforms=layout),
            ),
            (
                plgpu.Barrier(num_barriers=stages),
                plgpu.Barrier(num_barriers=stages),
                plgpu.Barrier(num_barriers=2),  # each compute warpgroup's query tile
                plgpu.Barrier(num_barriers=2),  # and its factor rows
            ),
            (plgpu.Barrier(num_arrivals=2, num_barriers=stages),) * 2,  # both compute warpgroups are done
            plgpu.Barrier(num_arrivals=2),  # the schedule barrier
            collective_axes="wg",
        )

    return plgpu.kernel(
        entry,
        out_type=jax.ShapeDtypeStruct((b, tq, h, dv), dtype),
        grid=(tq // (2 * bq), h, b),
        grid_names=("q_tiles", "heads", "batch"),
        num_threads=3,
        thread_name="wg",
    )(q, k, v, factor)


def _forward_unscaled(q, k, v, *, causal: bool, scale: float, sizes: MgpuBlockSizes):
    """Σ_j ReLU(q_i·k_j·scale) [j ≤ i if causal] v_j, `[B, T_q, H, D_v]` in v's dtype."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b, tq, h, d = q.shape
    tk, dv = k.shape[1], v.shape[-1]
    bq, bk, stages = sizes.block_q, sizes.block_k, sizes.stages
    num_q, num_k = pl.cdiv(tq, bq), pl.cdiv(tk, bk)
    dtype = q.dtype
    layout = swizzled(dtype)

    def kernel(q_ref, k_ref, v_ref, o_ref):
        batch, head, q_tile = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("q_tiles")
        q0 = q_tile * bq
        if causal:  # key tiles that start after this query tile's last row contribute nothing
            kv_steps = jnp.minimum(lax.div(q0 + bq + bk - 1, bk), num_k)
        else:
            kv_steps = num_k

        def fetch(step, slot, k_smem, v_smem, k_bar, v_bar):
            rows = (batch, pl.ds(step * bk, bk), head)
            plgpu.copy_gmem_to_smem(k_ref.at[rows], k_smem.at[slot], k_bar.at[slot])
            plgpu.copy_gmem_to_smem(v_ref.at[rows], v_smem.at[slot], v_bar.at[slot])

        def with_buffers(q_smem, k_smem, v_smem, o_smem, q_bar, k_bar, v_bar):
            plgpu.copy_gmem_to_smem(q_ref.at[batch, pl.ds(q0, bq), head], q_smem, q_bar.at[0])
            for slot in range(stages):  # fill the pipeline
                pl.when(slot < kv_steps)(functools.partial(fetch, slot, slot, k_smem, v_smem, k_bar, v_bar))

            plgpu.barrier_wait(q_bar.at[0])

            def with_accumulator(acc_ref):
                def step(j, carry):
                    slot = lax.rem(j, stages)
                    plgpu.barrier_wait(k_bar.at[slot])

                    p = jnp.maximum(scores_tile(q_smem, k_smem.at[slot], (bq, bk)) * scale, 0.0)
                    if causal:
                        p = jnp.where(visible(q0, j * bk, (bq, bk), "row_ge_col"), p, 0.0)
                    plgpu.barrier_wait(v_bar.at[slot])
                    plgpu.wgmma(acc_ref, p.astype(dtype), v_smem.at[slot])
                    plgpu.wgmma_wait(0)  # the slot is free once its tiles have been read

                    @pl.when(j + stages < kv_steps)
                    def _():
                        fetch(j + stages, slot, k_smem, v_smem, k_bar, v_bar)

                    return carry

                lax.fori_loop(0, kv_steps, step, None)
                o_smem[...] = acc_ref[...].astype(dtype)

            pl.run_scoped(with_accumulator, plgpu.ACC((bq, dv), jnp.float32))
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_smem, o_ref.at[batch, pl.ds(q0, bq), head])
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(
            with_buffers,
            plgpu.SMEM((bq, d), dtype, transforms=layout),
            plgpu.SMEM((stages, bk, d), dtype, transforms=layout),
            plgpu.SMEM((stages, bk, dv), dtype, transforms=layout),
            plgpu.SMEM((bq, dv), dtype, transforms=layout),
            plgpu.Barrier(num_barriers=1),
            plgpu.Barrier(num_barriers=stages),
            plgpu.Barrier(num_barriers=stages),
        )

    return plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((b, tq, h, dv), dtype),
        grid=(num_q, h, b),
        grid_names=("q_tiles", "heads", "batch"),
    )(q, k, v)


def _backward(q, k, v, factor, d_out, *, causal: bool, scale: float, sizes: MgpuBlockSizes):
    """dq, dk, dv (for the value rows the kernel saw) and Σ_j p_ij dP_ij per row `[B, H, T_q]` (= d factor).

    dq kernel, per query tile (K/V tiles through `stages` TMA slots): s = q kᵀ·scale, p = ReLU(s), dP = dO vᵀ,
    dS = 1[s>0] dP · f · scale, dq += dS k. dk/dv kernel, per key tile (q/dO/f tiles through the slots),
    transposed so that the key rows are the wgmma rows: sᵀ = k qᵀ·scale, aᵀ = ReLU(sᵀ) f, dv += aᵀ dO,
    dPᵀ = v dOᵀ, dSᵀ = 1[sᵀ>0] dPᵀ f · scale, dk += dSᵀ q. Causal loops visit only the tiles on or below
    the diagonal (dq: key tiles up to its last row; dk/dv: query tiles from its first row), as the forward.
    """
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b, tq, h, d = q.shape
    tk, dv_dim = k.shape[1], v.shape[-1]
    bq, bk, stages = sizes.block_q_bwd, sizes.block_k_bwd, sizes.stages
    num_q, num_k = pl.cdiv(tq, bq), pl.cdiv(tk, bk)
    dtype = q.dtype
    layout = swizzled(dtype)

    def pipelined(steps, fetch, step, carry):
        """`step(j, slot, carry)` for j < steps, tile j's copies (`fetch(j, slot)`) issued `stages` ahead."""
        for slot in range(stages):
            pl.when(slot < steps)(functools.partial(fetch, slot, slot))

        def body(j, carry):
            slot = lax.rem(j, stages)
            carry = step(j, slot, carry)
            plgpu.wgmma_wait(0)  # the slot is free once its tiles have been read

            @pl.when(j + stages < steps)
            def _():
                fetch(j + stages, slot)

            return carry

        return lax.fori_loop(0, steps, body, carry)

    def dq_kernel(q_ref, k_ref, v_ref, do_ref, f_ref, dq_ref, pdp_ref):
        batch, head, q_tile = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("q_tiles")
        q0 = q_tile * bq
        rows = (batch, pl.ds(q0, bq), head)
        kv_steps = jnp.minimum(lax.div(q0 + bq + bk - 1, bk), num_k) if causal else num_k

        def with_buffers(q_smem, do_smem, f_smem, pdp_smem, k_smem, v_smem, bar, k_bar, v_bar):
            plgpu.copy_gmem_to_smem(q_ref.at[rows], q_smem, bar.at[0])
            plgpu.copy_gmem_to_smem(do_ref.at[rows], do_smem, bar.at[1])
            plgpu.copy_gmem_to_smem(f_ref.at[batch, head, pl.ds(q0, bq)], f_smem, bar.at[2])

            def fetch(j, slot):
                tile = (batch, pl.ds(j * bk, bk), head)
                plgpu.copy_gmem_to_smem(k_ref.at[tile], k_smem.at[slot], k_bar.at[slot])
                plgpu.copy_gmem_to_smem(v_ref.at[tile], v_smem.at[slot], v_bar.at[slot])

            for i in range(3):
                plgpu.barrier_wait(bar.at[i])
            f = lax.broadcast_in_dim(load_reduced(f_smem, plgpu.Layout.WGMMA.reduce(1)), (bq, bk), [0])

            def with_accumulator(dq_acc):
                def step(j, slot, pdp):
                    plgpu.barrier_wait(k_bar.at[slot])
                    plgpu.barrier_wait(v_bar.at[slot])
                    s = scores_tile(q_smem, k_smem.at[slot], (bq, bk)) * scale
                    dp = scores_tile(do_smem, v_smem.at[slot], (bq, bk))
                    live = s > 0
                    if causal:
                        live = live & visible(q0, j * bk, (bq, bk), "row_ge_col")
                    pdp = pdp + jnp.sum(jnp.where(live, s, 0.0) * dp, axis=1)
                    ds = jnp.where(live, dp * f, 0.0) * scale
                    plgpu.wgmma(dq_acc, ds.astype(dtype), k_smem.at[slot])
                    return pdp

                pdp0 = plgpu.layout_cast(jnp.zeros((bq,), jnp.float32), plgpu.Layout.WGMMA.reduce(1))
                pdp_smem[...] = pipelined(kv_steps, fetch, step, pdp0)
                q_smem[...] = dq_acc[...].astype(dtype)  # q's tile is no longer read: it stages dq

            pl.run_scoped(with_accumulator, plgpu.ACC((bq, d), jnp.float32))
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[rows])
            plgpu.copy_smem_to_gmem(pdp_smem, pdp_ref.at[batch, head, pl.ds(q0, bq)])
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(
            with_buffers,
            plgpu.SMEM((bq, d), dtype, transforms=layout),
            plgpu.SMEM((bq, dv_dim), dtype, transforms=layout),
            plgpu.SMEM((bq,), jnp.float32),
            plgpu.SMEM((bq,), jnp.float32),
            plgpu.SMEM((stages, bk, d), dtype, transforms=layout),
            plgpu.SMEM((stages, bk, dv_dim), dtype, transforms=layout),
            plgpu.Barrier(num_barriers=3),
            plgpu.Barrier(num_barriers=stages),
            plgpu.Barrier(num_barriers=stages),
        )

    def dkdv_kernel(q_ref, k_ref, v_ref, do_ref, f_ref, dk_ref, dv_ref):
        batch, head, k_tile = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("k_tiles")
        k0 = k_tile * bk
        rows = (batch, pl.ds(k0, bk), head)
        first = lax.div(k0, bq) if causal else 0  # the first query tile with a row at or after k0

        def with_buffers(k_smem, v_smem, q_smem, do_smem, f_smem, bar, q_bar, do_bar, f_bar):
            plgpu.copy_gmem_to_smem(k_ref.at[rows], k_smem, bar.at[0])
            plgpu.copy_gmem_to_smem(v_ref.at[rows], v_smem, bar.at[1])

            def fetch(j, slot):
                i = first + j
                tile = (batch, pl.ds(i * bq, bq), head)
                plgpu.copy_gmem_to_smem(q_ref.at[tile], q_smem.at[slot], q_bar.at[slot])
                plgpu.copy_gmem_to_smem(do_ref.at[tile], do_smem.at[slot], do_bar.at[slot])
                plgpu.copy_gmem_to_smem(f_ref.at[batch, head, pl.ds(i * bq, bq)], f_smem.at[slot], f_bar.at[slot])

            plgpu.barrier_wait(bar.at[0])
            plgpu.barrier_wait(bar.at[1])

            def with_accumulators(dk_acc, dv_acc):
                def step(j, slot, carry):
                    for barrier in (q_bar, do_bar, f_bar):
                        plgpu.barrier_wait(barrier.at[slot])
                    s_t = scores_tile(k_smem, q_smem.at[slot], (bk, bq)) * scale
                    f = load_reduced(f_smem.at[slot], plgpu.Layout.WGMMA.reduce(0))
                    f = lax.broadcast_in_dim(f, (bk, bq), [1])
                    live = s_t > 0
                    if causal:
                        live = live & visible(k0, (first + j) * bq, (bk, bq), "row_le_col")
                    a_t = jnp.where(live, s_t, 0.0) * f
                    plgpu.wgmma(dv_acc, a_t.astype(dtype), do_smem.at[slot])
                    dp_t = scores_tile(v_smem, do_smem.at[slot], (bk, bq))
                    ds_t = jnp.where(live, dp_t * f, 0.0) * scale
                    plgpu.wgmma(dk_acc, ds_t.astype(dtype), q_smem.at[slot])
                    return carry

                pipelined(num_q - first, fetch, step, None)
                k_smem[...] = dk_acc[...].astype(dtype)  # k and v tiles are no longer read: they stage dk, dv
                v_smem[...] = dv_acc[...].astype(dtype)

            pl.run_scoped(with_accumulators, plgpu.ACC((bk, d), jnp.float32), plgpu.ACC((bk, dv_dim), jnp.float32))
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[rows])
            plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[rows])
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(
            with_buffers,
            plgpu.SMEM((bk, d), dtype, transforms=layout),
            plgpu.SMEM((bk, dv_dim), dtype, transforms=layout),
            plgpu.SMEM((stages, bq, d), dtype, transforms=layout),
            plgpu.SMEM((stages, bq, dv_dim), dtype, transforms=layout),
            plgpu.SMEM((stages, bq), jnp.float32),
            plgpu.Barrier(num_barriers=2),
            plgpu.Barrier(num_barriers=stages),
            plgpu.Barrier(num_barriers=stages),
            plgpu.Barrier(num_barriers=stages),
        )

    d_out = d_out.astype(dtype)
    dq, pdp = plgpu.kernel(
        dq_kernel,
        out_type=(jax.ShapeDtypeStruct(q.shape, dtype), jax.ShapeDtypeStruct(factor.shape, jnp.float32)),
        grid=(pl.cdiv(tq, bq), h, b),
        grid_names=("q_tiles", "heads", "batch"),
    )(q, k, v, d_out, factor)
    dk, dv = plgpu.kernel(
        dkdv_kernel,
        out_type=(jax.ShapeDtypeStruct(k.shape, dtype), jax.ShapeDtypeStruct(v.shape, dtype)),
        grid=(pl.cdiv(tk, bk), h, b),
        grid_names=("k_tiles", "heads", "batch"),
    )(q, k, v, d_out, factor)
    return dq, dk, dv, pdp


def _backward_fused(q, k, v, factor, d_out, *, causal: bool, scale: float, sizes: MgpuBlockSizes):
    """dq, dk, dv and Σ_j p_ij dP_ij per row `[B, H, T_q]` (= d factor) in one kernel over key tiles, as
    FlashAttention-3's backward: five products a tile and no pre-pass.

    One CUDA block per (pair of key tiles of `block_k_bwd` rows, head, batch): compute warpgroups 0 and 1 each
    hold a key tile (K, V in shared memory, dK, dV in fp32 registers); warpgroup 2 streams the query tiles (q,
    dO and the row factor f) through `stages` slots. Per query tile, transposed so that key rows are the wgmma
    rows: sᵀ = K qᵀ and dPᵀ = V dOᵀ (one wgmma group), aᵀ = ReLU(sᵀ)·f·scale, dSᵀ = 1[sᵀ>0]·dPᵀ·f·scale,
    dV += aᵀ dO and dK += dSᵀ q (one group), then dQ_i = dS K (dSᵀ through shared memory, read transposed) is
    added to an fp32 dQ in global memory by a TMA reduction, as is the row sum Σ_j p_ij dP_ij. Causal: the
    query tiles before a key tile are skipped (the second warpgroup only releases its sibling's), the diagonal
    ones masked, the rest unmasked.
    """
    from jax.experimental.pallas import mosaic_gpu as plgpu

    b, tq, h, d = q.shape
    tk, dv_dim = k.shape[1], v.shape[-1]
    bq, bk = sizes.block_q_bwd, sizes.block_k_bwd
    num_q = tq // bq
    dtype = q.dtype
    layout = swizzled(dtype)
    refs = [jax.new_ref(x, memory_space=plgpu.GMEM) for x in (q, k, v, d_out.astype(dtype), factor)]
    outs = [
        jax.new_ref(jnp.zeros(shape, dt), memory_space=plgpu.GMEM)
        for shape, dt in ((q.shape, jnp.float32), (k.shape, dtype), (v.shape, dtype), (factor.shape, jnp.float32))
    ]
    q_ref, k_ref, v_ref, do_ref, f_ref = refs
    dq_ref, dk_ref, dv_ref, pdp_ref = outs

    def kernel(smem, bars, used):
        k_smem2, v_smem2, q_smem, do_smem, f_smem, ds_smem2, dq_smem2, pdp_smem2 = smem
        kv_bar, q_bar, do_bar, f_bar = bars
        batch, head, wg = lax.axis_index("batch"), lax.axis_index("heads"), lax.axis_index("wg")
        block_k0 = lax.axis_index("k_tiles") * (2 * bk)
        block_first = lax.div(block_k0, bq) if causal else 0  # the first query tile any key of the block sees
        steps = num_q - block_first
        stages = sizes.stages

        @pl.when(wg < 2)
        def _compute():
            plgpu.set_max_registers(232, action="increase")
            k_smem, v_smem, ds_smem = k_smem2.at[wg], v_smem2.at[wg], ds_smem2.at[wg]
            dq_smem, pdp_smem = dq_smem2.at[wg], pdp_smem2.at[wg]
            k0 = block_k0 + wg * bk
            rows = (batch, pl.ds(k0, bk), head)
            plgpu.copy_gmem_to_smem(k_ref.at[rows], k_smem, kv_bar.at[2 * wg])
            plgpu.copy_gmem_to_smem(v_ref.at[rows], v_smem, kv_bar.at[2 * wg + 1])
            plgpu.barrier_wait(kv_bar.at[2 * wg])
            plgpu.barrier_wait(kv_bar.at[2 * wg + 1])

            def wait(slot):
                for barrier in (q_bar, do_bar, f_bar):
                    plgpu.barrier_wait(barrier.at[slot])

            def step(i, carry, masked):
                dk_acc, dv_acc = carry
                slot = lax.rem(i - block_first, stages)
                wait(slot)

                def scores(acc_refs):
                    s_ref, dp_ref = acc_refs
                    plgpu.wgmma(s_ref, k_smem, q_smem.at[slot].transpose((1, 0)))
                    plgpu.wgmma(dp_ref, v_smem, do_smem.at[slot].transpose((1, 0)))

                zeros = plgpu.layout_cast(jnp.zeros((bk, bq), jnp.float32), plgpu.Layout.WGMMA)
                s_t, dp_t = pl.run_state(scores)((plgpu.ACC.init(zeros), plgpu.ACC.init(zeros)))
                f = load_reduced(f_smem.at[slot], plgpu.Layout.WGMMA.reduce(0)) * scale
                f = lax.broadcast_in_dim(f, (bk, bq), [1])
                live = s_t > 0
                if masked:
                    live = live & visible(k0, i * bq, (bk, bq), "row_le_col")
                p_t = jnp.where(live, s_t, 0.0)
                pdp = jnp.sum(p_t * dp_t, axis=0) * scale  # this key tile's part of Σ_j p_ij dP_ij
                a_t = (p_t * f).astype(dtype)
                ds_t = jnp.where(live, dp_t * f, 0.0).astype(dtype)

                def grads(acc_refs):
                    dv_ref_, dk_ref_ = acc_refs
                    plgpu.wgmma(dv_ref_, a_t, do_smem.at[slot])
                    plgpu.wgmma(dk_ref_, ds_t, q_smem.at[slot])

                dv_acc, dk_acc = pl.run_state(grads)((plgpu.ACC.init(dv_acc), plgpu.ACC.init(dk_acc)))
                plgpu.barrier_arrive(used.at[slot])  # q, dO and f of this slot are read: it may be refilled
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last step's dQ and row sums have left
                ds_smem[...] = ds_t
                pdp_smem[...] = pdp
                plgpu.commit_smem()

                def dq_part(acc_ref):
                    plgpu.wgmma(acc_ref, ds_smem.transpose((1, 0)), k_smem)
                    return acc_ref[...]

                dq_smem[...] = pl.run_scoped(dq_part, plgpu.ACC((bq, d), jnp.float32))
                plgpu.commit_smem()
                q_rows = pl.ds(i * bq, bq)
                plgpu.copy_smem_to_gmem(dq_smem, dq_ref.at[batch, q_rows, head], reduction_op="add")
                plgpu.copy_smem_to_gmem(pdp_smem, pdp_ref.at[batch, head, q_rows], reduction_op="add")
                return dk_acc, dv_acc

            def release(i, carry):  # query tiles that see none of this key tile: let the memory warpgroup refill
                slot = lax.rem(i - block_first, stages)
                wait(slot)
                plgpu.barrier_arrive(used.at[slot])
                return carry

            carry = (
                plgpu.layout_cast(jnp.zeros((bk, d), jnp.float32), plgpu.Layout.WGMMA),
                plgpu.layout_cast(jnp.zeros((bk, dv_dim), jnp.float32), plgpu.Layout.WGMMA),
            )
            if causal:
                first = lax.div(k0, bq)
                whole = jnp.minimum(lax.div(k0 + bk + bq - 2, bq), num_q)  # from here on every row sees every key
                lax.fori_loop(block_first, first, release, None)
                carry = lax.fori_loop(first, whole, functools.partial(step, masked=True), carry)
                carry = lax.fori_loop(whole, num_q, functools.partial(step, masked=False), carry)
            else:
                carry = lax.fori_loop(0, num_q, functools.partial(step, masked=False), carry)
            dk_acc, dv_acc = carry
            k_smem[...] = dk_acc.astype(dtype)  # K and V are no longer read: their tiles stage dK and dV
            v_smem[...] = dv_acc.astype(dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[rows])
            plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[rows])
            plgpu.wait_smem_to_gmem(0)

        @pl.when(wg == 2)
        def _memory():
            def fetch(j, slot):
                tile = pl.ds((block_first + j) * bq, bq)
                plgpu.copy_gmem_to_smem(q_ref.at[batch, tile, head], q_smem.at[slot], q_bar.at[slot])
                plgpu.copy_gmem_to_smem(do_ref.at[batch, tile, head], do_smem.at[slot], do_bar.at[slot])
                plgpu.copy_gmem_to_smem(f_ref.at[batch, head, tile], f_smem.at[slot], f_bar.at[slot])

            memory_warpgroup(fetch, steps, stages, (used,))

    stages = sizes.stages
    mesh = plgpu.Mesh(
        grid=(tk // (2 * bk), h, b), grid_names=("k_tiles", "heads", "batch"), num_threads=3, thread_name="wg"
    )

    def backward():
        pl.run_scoped(
            kernel,
            (
                plgpu.SMEM((2, bk, d), dtype, transforms=layout),
                plgpu.SMEM((2, bk, dv_dim), dtype, transforms=layout),
                plgpu.SMEM((stages, bq, d), dtype, transforms=layout),
                plgpu.SMEM((stages, bq, dv_dim), dtype, transforms=layout),
                plgpu.SMEM((stages, bq), jnp.float32),
                plgpu.SMEM((2, bk, bq), dtype, transforms=layout),
                plgpu.SMEM((2, bq, d), jnp.float32),
                plgpu.SMEM((2, bq), jnp.float32),
            ),
            (
                plgpu.Barrier(num_barriers=4),  # each compute warpgroup's K and V tiles
                plgpu.Barrier(num_barriers=stages),
                plgpu.Barrier(num_barriers=stages),
                plgpu.Barrier(num_barriers=stages),
            ),
            plgpu.Barrier(num_arrivals=2, num_barriers=stages),  # both compute warpgroups are done with a slot
            collective_axes="wg",
        )

    # It writes the closed-over output refs. jax 0.11 deprecates `pl.core_map`; 0.10's `pl.kernel` would alias every
    # closed-over ref, the inputs too (5 more buffers XLA may copy), where its `core_map` aliases those written.
    if jax.__version_info__ < (0, 11):
        pl.core_map(mesh)(backward)
    else:
        pl.kernel(backward, mesh=mesh)()
    dq, dk, dv, pdp = (jax.freeze(ref) for ref in outs)
    return dq.astype(dtype), dk, dv, pdp


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _attend(q, k, v, key_mask, factor, causal, sizes, triton_sizes):
    v_visible = jnp.where(key_mask[:, :, None, None], v, jnp.zeros((), v.dtype))
    scale = 1 / math.sqrt(q.shape[-1])
    if sizes.warp_specialized and q.shape[-1] == v.shape[-1]:
        return _forward_specialized(q, k, v_visible, factor, causal=causal, scale=scale, sizes=sizes)
    out = _forward_unscaled(q, k, v_visible, causal=causal, scale=scale, sizes=sizes)
    return (out.astype(jnp.float32) * factor.transpose(0, 2, 1)[..., None]).astype(v.dtype)


def _attend_fwd(q, k, v, key_mask, factor, causal, sizes, triton_sizes):
    return _attend(q, k, v, key_mask, factor, causal, sizes, triton_sizes), (q, k, v, key_mask, factor)


def _attend_bwd(causal, sizes, triton_sizes, residuals, d_out):
    q, k, v, key_mask, factor = residuals
    if sizes.backward != "triton":
        v_visible = jnp.where(key_mask[:, :, None, None], v, jnp.zeros((), v.dtype))
        scale = 1 / math.sqrt(q.shape[-1])
        backward = _backward_fused if sizes.backward == "fused" else _backward
        dq, dk, dv, dfactor = backward(q, k, v_visible, factor, d_out, causal=causal, scale=scale, sizes=sizes)
        dv = jnp.where(key_mask[:, :, None, None], dv, jnp.zeros((), dv.dtype))  # through the zeroing of v
        return dq, dk, dv, None, dfactor
    from kernels.relu_attention.triton import relu_attention_triton

    def triton(q, k, v, factor):
        return relu_attention_triton(
            q, k, v, key_mask, factor, causal=causal, block_sizes=triton_sizes, backend="gpu", interpret=False
        )

    _, vjp = jax.vjp(triton, q, k, v, factor)
    dq, dk, dv, dfactor = vjp(d_out)
    return dq, dk, dv, None, dfactor


_attend.defvjp(_attend_fwd, _attend_bwd)


def relu_attention_mosaic_gpu(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array,
    factor: jax.Array,
    *,
    causal: bool,
    block_sizes: MgpuBlockSizes | None = None,
    backward_block_sizes=None,
) -> jax.Array:
    """Σ_j factor_i · ReLU(q_i·k_j/√d) · m_ij · v_j: forward by the Mosaic GPU kernel, backward by the Mosaic
    or the Triton kernels (`MgpuBlockSizes.backward`), from the arrays every ReLU backend takes (kernels/README.md);
    `backward_block_sizes`: the Triton backward's. Raises ValueError for inputs `supported` refuses."""
    sizes = block_sizes or default_block_sizes(max(q.shape[-1], v.shape[-1]))
    reason = supported(q, k, v, sizes, causal)
    if reason:
        raise ValueError(reason)
    if causal and q.shape[1] != k.shape[1]:
        raise ValueError(f"causal attention needs equal lengths, got {q.shape[1]} and {k.shape[1]}")
    return _attend(q, k, v, key_mask, factor.astype(jnp.float32), causal, sizes, backward_block_sizes)
