"""Pallas kernels for linear attention (docs/kernels.md): chunked prefix sums forward, two scans backward.

One program per (batch, head) walks the sequence in chunks of C, carrying the fp32 state S (m × d_v)
and z (m) in registers/VMEM; inside a chunk the causal part is a masked C×C product:

    acc_c = φq_c S + tril(φq_c φk_cᵀ) v_c,   den_c = φq_c z + rowsum(tril(φq_c φk_cᵀ)),   out = acc/stab(den)

(stab: ε added by the chosen `eps_mode`, see kernels/linear_attention.py.) Backward, with g = dO/stab(den)
and h = −(dO·out)/stab(den) per row (computed outside, O(T); stab has slope 1):

    dφq_i = S_i g_i + z_i h_i                         (forward scan, same state as the forward pass)
    dφk_j = R_j v_j + r_j,  dv_j = R_jᵀ φk_j          (reverse scan: R_j = Σ_{i≥j} φq_i g_iᵀ, r_j = Σ_{i≥j} φq_i h_i)

Non-causal attention uses the same kernels with the totals instead of prefixes. The normaliser's
path into dφk (the r term) is explicit: public kernels have dropped it before (docs/kernels.md). Products take
bf16 operands for bf16 inputs — g, the states and the intra-chunk matrices rounded as fla's chunk kernels round
them — and fp32 otherwise (g = dO/den, and z at long lengths, can pass float16's range); every product
accumulates in fp32 and the states are carried in fp32.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from kernels.numerics import lower_triangle, round_up, stabilise_denominator, triton_compiler_params
from kernels.triton_tiles import Extent, load_tile, store_tile


@dataclasses.dataclass(frozen=True)
class LinearBlockSizes:
    """chunk: sequence positions per step of the scan. block_dv: the value columns one program owns (a power
    of two ≥ 16): the grid becomes batch × heads × d_v/block_dv, so a small batch · heads still fills the GPU's
    SMs (S splits by columns; dφq and dφk, which sum over d_v, are summed over the column blocks after the
    kernels). None: every column in one program."""

    chunk: int = 64
    num_warps: int | None = None
    num_stages: int = 2
    block_dv: int | None = None

    def __post_init__(self):
        if self.block_dv is not None and (self.block_dv < 16 or self.block_dv & (self.block_dv - 1)):
            raise ValueError(f"LinearBlockSizes.block_dv={self.block_dv} must be a power of two ≥ 16 (or None)")


def operand_dtype(dtype) -> jnp.dtype:
    """The dtype the products with a state or with g take their operands in: bf16 for bf16 inputs, else fp32
    (module docstring)."""
    return jnp.dtype(jnp.bfloat16) if jnp.dtype(dtype) == jnp.bfloat16 else jnp.dtype(jnp.float32)


def _dot(a, b, contract_a, contract_b):
    return lax.dot_general(a, b, (((contract_a,), (contract_b,)), ((), ())), preferred_element_type=jnp.float32)


def _advance(s, z, k, v):
    """Adds one chunk of keys to the state: S += φkᵀ v, z += Σ φk."""
    return s + _dot(k, v, 0, 0), z + jnp.sum(k.astype(jnp.float32), axis=0)


@dataclasses.dataclass(frozen=True)
class _Dims:
    """The axes the tiles cover (for the masks of `kernels.triton_tiles`) and the value columns per program."""

    rows: Extent
    features: Extent
    values: Extent
    block_dv: int

    @classmethod
    def of(cls, t: int, t_pad: int, m: int, dv: int, block_dv: int) -> _Dims:
        return cls(Extent(t, t_pad), Extent.power_of_two(m), Extent.power_of_two(dv), block_dv)

    def chunk_of(self, ref, start, chunk, col0=None):
        """Rows [start, start + chunk) of a feature tile or, given its first column `col0` (see `first_column`),
        of this program's value-column tile."""
        cols, col0 = (self.features, 0) if col0 is None else (self.values, col0)
        return load_tile(ref.at[pl.ds(start, chunk), :], self.rows, start, cols, col0)

    def store(self, ref, start, chunk, value, col0=None):
        cols, col0 = (self.features, 0) if col0 is None else (self.values, col0)
        store_tile(ref.at[pl.ds(start, chunk), :], value, self.rows, start, cols, col0)

    def first_column(self) -> jax.Array:
        """This program's first value column (read at the kernel's top level: interpret mode cannot read
        program ids inside loops)."""
        return pl.program_id(2) * self.block_dv


def _initial_state(k_ref, v_ref, chunk, causal, dims):
    """(S, z) to start the scan from: zeros when causal, the totals over every key otherwise."""
    t, m = k_ref.shape
    init = (jnp.zeros((m, v_ref.shape[-1]), jnp.float32), jnp.zeros((m,), jnp.float32))
    if causal:
        return init
    col0 = dims.first_column()

    def totals(c, carry):
        s, z = carry
        k = dims.chunk_of(k_ref, c * chunk, chunk)
        v = dims.chunk_of(v_ref, c * chunk, chunk, col0)
        return _advance(s, z, k, v)

    return lax.fori_loop(0, t // chunk, totals, init)


def _fwd_kernel(q_ref, k_ref, v_ref, o_ref, den_ref, *, chunk, eps, eps_mode, causal, dims):
    n = q_ref.shape[0] // chunk
    operands = operand_dtype(q_ref.dtype)
    col0 = dims.first_column()
    mask = lower_triangle(chunk) if causal else None

    def body(c, carry):
        s, z = carry
        start = c * chunk
        q = dims.chunk_of(q_ref, start, chunk)
        num = _dot(q.astype(operands), s.astype(operands), 1, 0)
        den = jnp.sum(q.astype(jnp.float32) * z[None, :], axis=1)
        if causal:
            k = dims.chunk_of(k_ref, start, chunk)
            v = dims.chunk_of(v_ref, start, chunk, col0)
            scores = jnp.where(mask, _dot(q, k, 1, 1), 0.0)
            num = num + _dot(scores.astype(v.dtype), v, 1, 0)
            den = den + jnp.sum(scores, axis=1)
            s, z = _advance(s, z, k, v)
        dims.store(o_ref, start, chunk, num / stabilise_denominator(den, eps, eps_mode)[:, None], col0)
        den_ref[pl.ds(start, chunk)] = den
        return s, z

    lax.fori_loop(0, n, body, _initial_state(k_ref, v_ref, chunk, causal, dims))


def _first_column_block() -> jax.Array:
    """1.0 in the programs of the first d_v block, else 0.0: terms that do not split by columns (the
    normaliser's h) are counted there only, so the sum over column blocks counts them once."""
    return (pl.program_id(2) == 0).astype(jnp.float32)


def _dq_kernel(k_ref, v_ref, q_ref, g_ref, h_ref, dq_ref, *, chunk, causal, dims):
    """dφq_i = S_i g_i + z_i h_i (S, z prefix sums when causal, totals otherwise), for this column block."""
    n = k_ref.shape[0] // chunk
    mask = lower_triangle(chunk) if causal else None
    once = _first_column_block()
    col0 = dims.first_column()

    def body(c, carry):
        s, z = carry
        start = c * chunk
        g = dims.chunk_of(g_ref, start, chunk, col0)  # in the products' operand dtype
        h = h_ref[pl.ds(start, chunk)] * once
        dq = _dot(g, s.astype(g.dtype), 1, 1) + h[:, None] * z[None, :]
        if causal:
            k = dims.chunk_of(k_ref, start, chunk).astype(g.dtype)
            v = dims.chunk_of(v_ref, start, chunk, col0).astype(g.dtype)
            # A_ij = g_i·v_j + h_i for j ≤ i within the chunk; dφq_c += A φk_c.
            a = jnp.where(mask, _dot(g, v, 1, 1) + h[:, None], 0.0)
            dq = dq + _dot(a.astype(g.dtype), k, 1, 0)
            s, z = _advance(s, z, k, v)
        dims.store(dq_ref, start, chunk, dq)
        return s, z

    lax.fori_loop(0, n, body, _initial_state(k_ref, v_ref, chunk, causal, dims))


def _dkdv_kernel(q_ref, g_ref, h_ref, k_ref, v_ref, dk_ref, dv_ref, *, chunk, causal, dims):
    """Reverse scan: R = Σ_{i≥j} φq_i g_iᵀ, r = Σ_{i≥j} φq_i h_i; dφk_j = R v_j + r, dv_j = Rᵀ φk_j (this
    column block's part of dφk)."""
    t, m = q_ref.shape
    n = t // chunk
    mask = lower_triangle(chunk) if causal else None
    once = _first_column_block()
    col0 = dims.first_column()

    def totals(c, carry):
        big_r, r = carry
        g = dims.chunk_of(g_ref, c * chunk, chunk, col0)  # in the products' operand dtype
        q = dims.chunk_of(q_ref, c * chunk, chunk).astype(g.dtype)
        h = h_ref[pl.ds(c * chunk, chunk)] * once
        return big_r + _dot(q, g, 0, 0), r + jnp.sum(q.astype(jnp.float32) * h[:, None], axis=0)

    def body(step, carry):
        big_r, r = carry
        start = (n - 1 - step) * chunk
        g = dims.chunk_of(g_ref, start, chunk, col0)  # in the products' operand dtype
        k, q = (dims.chunk_of(ref, start, chunk).astype(g.dtype) for ref in (k_ref, q_ref))
        v = dims.chunk_of(v_ref, start, chunk, col0).astype(g.dtype)
        state = big_r.astype(g.dtype)
        dk = _dot(v, state, 1, 1) + r[None, :]
        dv = _dot(k, state, 1, 0)
        h = h_ref[pl.ds(start, chunk)] * once
        if causal:
            # Within the chunk, key j gets queries i ≥ j: masks indexed [i, j].
            scores = jnp.where(mask, _dot(q, k, 1, 1), 0.0)  # φq_i·φk_j
            a = jnp.where(mask, _dot(g, v, 1, 1) + h[:, None], 0.0)  # g_i·v_j + h_i
            dv = dv + _dot(scores.astype(g.dtype), g, 0, 0)
            dk = dk + _dot(a.astype(g.dtype), q, 0, 0)
            big_r = big_r + _dot(q, g, 0, 0)
            r = r + jnp.sum(q.astype(jnp.float32) * h[:, None], axis=0)
        dims.store(dk_ref, start, chunk, dk)
        dims.store(dv_ref, start, chunk, dv, col0)
        return big_r, r

    init = (jnp.zeros((m, g_ref.shape[-1]), jnp.float32), jnp.zeros((m,), jnp.float32))
    if not causal:
        init = lax.fori_loop(0, n, totals, init)
    lax.fori_loop(0, n, body, init)


# BlockSpecs over the caller's `[B, T, H, ·]` arrays (grid: batch, head, value-column block), padded to whole
# tiles only in the block shape (`kernels.triton_tiles` masks the rest).
def _full(t, d):
    return pl.BlockSpec((None, t, None, d), lambda b, h, j: (b, 0, h, 0))


def _columns(t, block):
    """Column block j of a `[B, T, H, d_v]` array."""
    return pl.BlockSpec((None, t, None, block), lambda b, h, j: (b, 0, h, j))


def _partial(t, d):
    """Column block j's part of a sum over d_v: `[n_blocks, B, T, H, d]`, summed after the kernel."""
    return pl.BlockSpec((None, None, t, None, d), lambda b, h, j: (j, b, 0, h, 0))


def _rows(t):
    return pl.BlockSpec((None, None, t), lambda b, h, j: (b, h, 0))


def _call(kernel, ins, out_shapes, out_specs, in_specs, sizes, backend, interpret, name, head_dim, n_blocks):
    b, h = ins[0].shape[0], ins[0].shape[2]
    return pl.pallas_call(
        kernel,
        grid=(b, h, n_blocks),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shapes,
        compiler_params=triton_compiler_params(backend, sizes.num_warps, sizes.num_stages, head_dim),
        interpret=interpret,
        name=name,
    )(*ins)


def _column_block(sizes: LinearBlockSizes, dv: int) -> tuple[int, int]:
    """(columns per program, number of column blocks) for d_v (padded to a power of two in the tiles)."""
    dv_pad = pl.next_power_of_2(dv)
    block = dv_pad if sizes.block_dv is None else min(sizes.block_dv, dv_pad)
    return block, dv_pad // block


def _forward(q, k, v, t_pad, causal, eps, eps_mode, sizes, backend, interpret):
    b, t, h, m = q.shape
    dv = v.shape[-1]
    m_pad = pl.next_power_of_2(m)
    block, n_blocks = _column_block(sizes, dv)
    dims = _Dims.of(t, t_pad, m, dv, block)
    kernel = functools.partial(_fwd_kernel, chunk=sizes.chunk, eps=eps, eps_mode=eps_mode, causal=causal, dims=dims)
    # Every column block computes the same denominator; each writes it (identical values).
    return _call(
        kernel,
        (q, k, v),
        [jax.ShapeDtypeStruct((b, t, h, dv), v.dtype), jax.ShapeDtypeStruct((b, h, t_pad), jnp.float32)],
        [_columns(t_pad, block), _rows(t_pad)],
        [_full(t_pad, m_pad), _full(t_pad, m_pad), _columns(t_pad, block)],
        sizes,
        backend,
        interpret,
        "linear_attention_fwd",
        m_pad,
        n_blocks,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7, 8, 9))
def _attend(q, k, v, t_pad, causal, eps, eps_mode, sizes, backend, interpret):
    return _forward(q, k, v, t_pad, causal, eps, eps_mode, sizes, backend, interpret)[0]


def _attend_fwd(q, k, v, t_pad, causal, eps, eps_mode, sizes, backend, interpret):
    out, den = _forward(q, k, v, t_pad, causal, eps, eps_mode, sizes, backend, interpret)
    return out, (q, k, v, out, den)


def _attend_bwd(t_pad, causal, eps, eps_mode, sizes, backend, interpret, residuals, d_out):
    q, k, v, out, den = residuals
    t, m = q.shape[1], q.shape[-1]
    m_pad, dv_dim = pl.next_power_of_2(m), v.shape[-1]
    # Per-row O(B·H·T) terms in the kernels' [B, H, T_pad] row layout; g stays [B, T, H, d_v].
    inv = 1.0 / stabilise_denominator(den, eps, eps_mode)
    inv_tokens = inv[:, :, :t].transpose(0, 2, 1)
    g = (d_out.astype(jnp.float32) * inv_tokens[..., None]).astype(operand_dtype(v.dtype))
    h_coef = -jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1).transpose(0, 2, 1)
    h_coef = jnp.pad(h_coef, ((0, 0), (0, 0), (0, t_pad - t))) * inv
    block, n_blocks = _column_block(sizes, dv_dim)
    dims = _Dims.of(t, t_pad, m, dv_dim, block)
    partial = jax.ShapeDtypeStruct((n_blocks, *q.shape), jnp.float32)
    full, columns = _full(t_pad, m_pad), _columns(t_pad, block)
    dq = _call(
        functools.partial(_dq_kernel, chunk=sizes.chunk, causal=causal, dims=dims),
        (k, v, q, g, h_coef),
        partial,
        _partial(t_pad, m_pad),
        [full, columns, full, columns, _rows(t_pad)],
        sizes,
        backend,
        interpret,
        "linear_attention_bwd_dq",
        m_pad,
        n_blocks,
    )
    dk, dv = _call(
        functools.partial(_dkdv_kernel, chunk=sizes.chunk, causal=causal, dims=dims),
        (q, g, h_coef, k, v),
        [partial, jax.ShapeDtypeStruct(v.shape, v.dtype)],
        [_partial(t_pad, m_pad), columns],
        [full, columns, _rows(t_pad), full, columns],
        sizes,
        backend,
        interpret,
        "linear_attention_bwd_dkdv",
        m_pad,
        n_blocks,
    )
    dq, dk = jnp.sum(dq, axis=0).astype(q.dtype), jnp.sum(dk, axis=0).astype(k.dtype)
    return dq, dk, dv


_attend.defvjp(_attend_fwd, _attend_bwd)


def linear_attention_triton(
    phi_q: jax.Array,
    phi_k: jax.Array,
    v: jax.Array,
    *,
    causal: bool,
    eps: float,
    eps_mode: str = "add",
    block_sizes: LinearBlockSizes | None = None,
    backend: str | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """The Triton kernels, from what every linear backend takes (kernels/README.md). `backend`: the platform to
    build for (default: the running one); `interpret`: Pallas interpret mode (default: on a CPU)."""
    backend = backend or jax.default_backend()  # the platform to build for (lowering for another is allowed)
    interpret = jax.default_backend() == "cpu" if interpret is None else interpret
    sizes = block_sizes or LinearBlockSizes()
    # Whole chunks in the grid; the arrays stay as they are (rows and columns past the end are masked inside
    # the kernels and read as zeros, which add nothing to S, z or the outputs).
    t_pad = round_up(phi_q.shape[1], sizes.chunk)
    return _attend(phi_q, phi_k, v, t_pad, causal, eps, eps_mode, sizes, backend, interpret)
