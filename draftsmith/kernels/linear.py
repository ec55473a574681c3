"""``x @ weight.T (+ bias)`` for few rows: a GEMM whose result for a row does not depend on the
other rows.

A decoding step multiplies few rows (one token per request, or K + 1 per request while verifying)
by every weight of the target. cuBLAS picks its kernel by the row count: in fp32 without TF32 an
8-row product runs a tiled SIMT kernel several times slower than the one-row GEMV, and a row's
result changes in its last bits with the number of rows beside it, so verifying K + 1 tokens
rounds differently from decoding them one by one. This kernel computes each row on its own, in
one fixed order chosen by the weight's shape, so a row's output is bit-identical at any row
count; a weight tile read from memory once serves up to 8 rows from the cache. Owns ``linear``
beside its reference. Imports ``draftsmith.contract`` only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES


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
                   HAS_BIAS: tl.constexpr, ONE_CHUNK: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program ``(n, m)``: output columns ``n * BLOCK_N ..`` of rows ``m * BLOCK_M ..``, one row
    after the other, each row's sum over ``k`` in ``BLOCK_K`` chunks, fp32 accumulation. With
    one chunk the weight tile is loaded once for all the rows; with several it is re-read from
    the cache per row. A row past ``M`` costs nothing."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    col_ok = rn < N
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * s_w
    if HAS_BIAS:
        bias = tl.load(b_ptr + rn, mask=col_ok, other=0.0).to(tl.float32)
    if ONE_CHUNK:  # K <= BLOCK_K: the weight tile stays in registers for every row
        k_ok = rk < K
        w = tl.load(w_rows + rk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        w = w.to(tl.float32)
    for i in tl.static_range(BLOCK_M):
        row = tl.program_id(1) * BLOCK_M + i
        if row < M:
            x_row = x_ptr + row.to(tl.int64) * s_x
            if ONE_CHUNK:
                x = tl.load(x_row + rk, mask=k_ok, other=0.0).to(tl.float32)
                acc = tl.sum(w * x[None, :], axis=1)
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


def _blocks(n: int, k: int) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, BLOCK_K, num_warps)`` by the weight's shape only, never by the row
    count (so a row's rounding never depends on it)."""
    block_k = min(4096, max(16, triton.next_power_of_2(k)))
    if n >= 8192:  # an LM head: enough programs with one column each
        return 8, 1, block_k, 1 if block_k <= 1024 else 4
    if block_k <= 1024:
        return 2, 4, block_k, 2
    return 8, 4 if block_k <= 2048 else 2, block_k, 4


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
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    m = int(rows.shape[0])
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    elif out.shape != (m, n) or out.stride(-1) != 1 or out.dtype != x.dtype:
        raise ShapeError(f"linear's out must be [{m}, {n}] {x.dtype} with unit column stride, "
                         f"got {tuple(out.shape)} {out.dtype}")
    if m and n:
        block_m, block_n, block_k, warps = _blocks(n, k)
        _linear_kernel[(triton.cdiv(n, block_n), triton.cdiv(m, block_m))](
            rows, weight, bias if bias is not None else weight, out, m, n, k,
            rows.stride(0), weight.stride(0), out.stride(0), HAS_BIAS=bias is not None,
            ONE_CHUNK=k <= block_k, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
            num_warps=warps)
    return out.view(*x.shape[:-1], n)


__all__ = ["linear", "linear_reference"]
