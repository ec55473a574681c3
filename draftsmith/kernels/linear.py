"""``x @ weight.T (+ bias)`` for few rows: a GEMM whose result for a row does not depend on the
other rows.

A decoding step multiplies few rows (one token per request, or K + 1 per request while verifying)
by every weight of the target. cuBLAS picks its kernel by the row count: in fp32 without TF32 an
8-row product runs a tiled SIMT kernel several times slower than the one-row GEMV, and a row's
result changes in its last bits with the number of rows beside it, so verifying K + 1 tokens
rounds differently from decoding them one by one. This kernel computes each row on its own, in
one fixed order chosen by the weight's shape, so a row's output is bit-identical at any row
count; a weight tile held in registers serves up to 64 rows. Owns ``linear`` beside its
reference. Imports ``draftsmith.contract`` only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels._launch import block_size, or_dummy, unit_rows


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x: [..., K]``, ``weight: [N, K]``, ``bias: [N]`` -> ``[..., N]`` (torch's own GEMM),
    written into ``out: [rows, N]`` when given."""
    y = torch.nn.functional.linear(x, weight, bias)
    if out is None:
        return y
    out.copy_(y.reshape(out.shape))
    return out.view(y.shape)


@triton.jit
def _linear_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, s_x, s_w, s_out,
                   HAS_BIAS: tl.constexpr, TILES: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_K2: tl.constexpr):
    """Program ``(n, m)``: output columns ``n * BLOCK_N ..`` of rows ``m * BLOCK_M ..``, one row
    after the other, fp32 accumulation. ``TILES = 1``: the weight tile ``[BLOCK_N, BLOCK_K]``
    (``K <= BLOCK_K``) stays in registers for every row; ``TILES = 2``: two tiles, columns
    ``[0, BLOCK_K)`` and ``[BLOCK_K, BLOCK_K + BLOCK_K2)``, so that ``K = 576`` takes
    ``512 + 64`` lanes and not 1024; ``TILES = 0``: a loop over ``BLOCK_K`` chunks, the tile
    re-read from the cache per row. A row's sum never depends on ``BLOCK_M`` or on the other
    rows; a row past ``M`` costs nothing."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    col_ok = rn < N
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * s_w
    if HAS_BIAS:
        bias = tl.load(b_ptr + rn, mask=col_ok, other=0.0).to(tl.float32)
    if TILES >= 1:
        k_ok = rk < K
        w = tl.load(w_rows + rk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        w = w.to(tl.float32)
    if TILES == 2:
        rk2 = BLOCK_K + tl.arange(0, BLOCK_K2)
        k2_ok = rk2 < K
        w2 = tl.load(w_rows + rk2[None, :], mask=col_ok[:, None] & k2_ok[None, :], other=0.0)
        w2 = w2.to(tl.float32)
    for i in tl.static_range(BLOCK_M):
        row = tl.program_id(1) * BLOCK_M + i
        if row < M:
            x_row = x_ptr + row.to(tl.int64) * s_x
            if TILES >= 1:
                x = tl.load(x_row + rk, mask=k_ok, other=0.0).to(tl.float32)
                acc = tl.sum(w * x[None, :], axis=1)
                if TILES == 2:
                    x2 = tl.load(x_row + rk2, mask=k2_ok, other=0.0).to(tl.float32)
                    acc += tl.sum(w2 * x2[None, :], axis=1)
            else:
                acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
                for k0 in range(0, K, BLOCK_K):
                    k = k0 + rk
                    k_ok = k < K
                    wk = tl.load(w_rows + k[None, :], mask=col_ok[:, None] & k_ok[None, :],
                                 other=0.0)
                    x = tl.load(x_row + k, mask=k_ok, other=0.0)
                    acc += tl.sum(wk.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
            if HAS_BIAS:
                acc += bias
            tl.store(out_ptr + row.to(tl.int64) * s_out + rn,
                     acc.to(out_ptr.dtype.element_ty), mask=col_ok)


MAX_TILE = 4096
"""Widest weight tile (``BLOCK_K + BLOCK_K2``) held in registers; a wider ``K`` loops."""
MAX_ROWS_PER_PROGRAM = 64
MIN_PROGRAMS = 1024
"""Rows per program double while the launch keeps at least this many programs: a large weight
(an LM head: tens of thousands of column programs) is then read from memory once for up to
:data:`MAX_ROWS_PER_PROGRAM` rows, while a small one keeps enough programs to fill the GPU."""


def _blocks(n: int, k: int) -> tuple[int, int, int, int, int]:
    """``(TILES, BLOCK_N, BLOCK_K, BLOCK_K2, num_warps)`` by the weight's shape only, never by
    the row count (they fix the order of each row's sum). ``K`` that is a power of two plus a
    small rest takes two tiles without padding (576 = 512 + 64, 1536 = 1024 + 512)."""
    padded = block_size(k, lo=16)
    head = min(padded, 1 << (k.bit_length() - 1)) if k > 16 else padded
    rest = block_size(k - head, lo=16) if k > head else 0
    if rest and head + rest < padded and head + rest <= MAX_TILE:
        tiles, block_k, block_k2, width = 2, head, rest, head + rest
    else:
        block_k = min(MAX_TILE, padded)
        tiles, block_k2, width = (1 if k <= block_k else 0), 16, block_k
    if width <= 1536:  # two columns a warp: the H200 sweep's best at 8 to 64 rows
        return tiles, 2, block_k, block_k2, 1
    if n >= 8192:  # an LM head: enough programs with one column each
        return tiles, 1, block_k, block_k2, 4
    return tiles, 4 if width <= 2048 else 2, block_k, block_k2, 4


def _rows_per_program(m: int, column_programs: int) -> int:
    """``BLOCK_M`` for ``m`` rows (see :data:`MIN_PROGRAMS`); a power of two."""
    block_m = 1
    while (block_m < min(m, MAX_ROWS_PER_PROGRAM)
           and column_programs * triton.cdiv(m, 2 * block_m) >= MIN_PROGRAMS):
        block_m *= 2
    return block_m


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Kernel form of :func:`linear_reference`: ``x: [..., K]``, ``weight: [N, K]`` (contiguous
    rows), ``bias: [N]`` -> ``[..., N]`` in ``x``'s dtype, fp32 accumulation (no TF32).
    Row ``i`` of the result depends on row ``i`` of ``x`` only, bit for bit."""
    check_tensor("x", x, None, FLOAT_DTYPES)
    check_tensor("weight", weight, None, (x.dtype,))
    if weight.ndim != 2 or x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise ShapeError(f"linear needs x [..., K] and weight [N, K], got {tuple(x.shape)} "
                         f"and {tuple(weight.shape)}")
    n, k = int(weight.shape[0]), int(weight.shape[1])
    if bias is not None:
        check_tensor("bias", bias, (n,), (x.dtype,))
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    rows = unit_rows(x, k)
    m = int(rows.shape[0])
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    elif out.shape != (m, n) or out.stride(-1) != 1 or out.dtype != x.dtype:
        raise ShapeError(f"linear's out must be [{m}, {n}] {x.dtype} with unit column stride, "
                         f"got {tuple(out.shape)} {out.dtype}")
    if m and n:
        tiles, block_n, block_k, block_k2, warps = _blocks(n, k)
        block_m = _rows_per_program(m, triton.cdiv(n, block_n))
        _linear_kernel[(triton.cdiv(n, block_n), triton.cdiv(m, block_m))](
            rows, weight, or_dummy(bias, weight), out, m, n, k,
            rows.stride(0), weight.stride(0), out.stride(0), HAS_BIAS=bias is not None,
            TILES=tiles, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
            BLOCK_K2=block_k2, num_warps=warps)
    return out.view(*x.shape[:-1], n)


__all__ = ["linear", "linear_reference"]
