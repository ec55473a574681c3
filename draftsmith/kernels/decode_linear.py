"""The target's few-row products with what follows them folded in: the residual add or
SiLU-times-up after the product, in one launch.

A decoding step of a 1-8B target multiplies 1 to 16 rows by every weight of each layer; the
products are bound by reading the weights, and between them sat an add or a gate as launches of
their own, whose latency outweighed their bytes. Here the products carry them:

* ``h = h + attn @ W_o.T`` and ``h = h + act @ W_down.T`` (``residual``),
* ``act = silu(g) * u`` with ``[g | u] = x @ W_gate_up.T`` (``gated``),
* an LM head's fp32 logits (``out_dtype``).

Owns ``decode_linear`` beside its reference. Imports ``draftsmith.contract`` only.

Numerics: the product accumulates in fp32 and rounds to the input dtype before the add or the
gate, as the reference does; its sums run in another order than cuBLAS's. A row's result
depends on that
row alone: every program multiplies :data:`BLOCK_M` rows with tiles fixed by the weight's shape,
never by the row count, so verifying ``K + 1`` tokens rounds as decoding them one by one
(checked bit for bit by the tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels._launch import block_size, or_dummy, row_stride
from draftsmith.kernels.swiglu import silu_mul_reference


def decode_linear_reference(x: torch.Tensor, weight: torch.Tensor,
                            bias: torch.Tensor | None = None, *, gated: bool = False,
                            residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
                            out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x: [M, K]`` times ``weight: [N, K]`` (``bias: [N]``), with what surrounds it::

        y = x @ weight.T + bias                                  # [M, N]
        y = silu(y[:, :N/2]) * y[:, N/2:] if gated else y        # [M, N/2]
        y = residual + y if residual is not None else y

    Every intermediate rounds to ``x``'s dtype; the result is then cast to ``out_dtype`` (an
    LM head's fp32 logits). ``out`` (``[M, N]`` or ``[M, N/2]``, may be ``residual`` itself)
    receives the result when given.
    """
    y = torch.nn.functional.linear(x, weight, bias)
    if gated:
        y = silu_mul_reference(y)
    if residual is not None:
        y = residual + y
    y = y if out_dtype is None else y.to(out_dtype)
    return y if out is None else out.copy_(y)


@triton.jit
def _decode_linear_kernel(
    x_ptr, w_ptr, b_ptr, r_ptr, out_ptr,
    M, N, K, s_x, s_w, s_r, s_out,
    HAS_BIAS: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Program ``(m, n)``: output columns ``n * BLOCK_N ..`` of rows ``m * BLOCK_M ..``, the
    products over ``K`` in tiles of ``BLOCK_K`` (``N`` counts output columns: with ``GATED``
    the weight holds ``N`` gate rows, then ``N`` up rows). The programs of one column tile are
    neighbours in launch order, so its weight tile is read from memory once for all rows.
    Both operands stream through the pipeline untouched: anything done to a tile of ``x``
    between its load and the product stalls the pipeline (measured: a norm applied there
    doubled the time of an 8B layer's ``[q | k | v]``)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * s_x
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * s_w
    u_rows = w_rows + N.to(tl.int64) * s_w
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + rk) < K
        xk = tl.load(x_rows + (k0 + rk)[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_rows + (k0 + rk)[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(xk, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(xk, tl.trans(w), acc)
        if GATED:
            u = tl.load(u_rows + (k0 + rk)[None, :], mask=n_ok[:, None] & k_ok[None, :],
                        other=0.0)
            if IEEE:
                acc_up = tl.dot(xk, tl.trans(u), acc_up, input_precision="ieee")
            else:
                acc_up = tl.dot(xk, tl.trans(u), acc_up)
    odt = x_ptr.dtype.element_ty  # every step rounds to the input dtype
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y = acc.to(odt).to(tl.float32)
    if GATED:
        act = (y / (1.0 + tl.exp(-y))).to(odt).to(tl.float32)
        y = (act * acc_up.to(odt).to(tl.float32)).to(odt).to(tl.float32)
    ok = m_ok[:, None] & n_ok[None, :]
    if RESIDUAL:
        res = tl.load(r_ptr + rm.to(tl.int64)[:, None] * s_r + rn[None, :], mask=ok, other=0.0)
        y = res.to(tl.float32) + y
    y = y.to(odt).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rm.to(tl.int64)[:, None] * s_out + rn[None, :], y, mask=ok)


SHARED_BYTES = 200 * 1024
"""Shared memory the pipelined tiles may take (an H100 / H200 block has 227 KiB): the stages in
flight are as many as fit, up to four."""

BLOCK_M = 16
"""Rows one program multiplies: the smallest tile of a tensor-core product, the same for every
row count, so each row's sums run in one fixed order whatever the rows beside it."""


@dataclass(frozen=True)
class Blocks:
    """Launch sizes of :func:`decode_linear` for one weight shape."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def decode_linear_blocks(n: int, k: int, dtype: torch.dtype, gated: bool = False) -> Blocks:
    """Launch sizes for a weight of ``n`` output columns (``n`` gate and ``n`` up rows when
    ``gated``) and ``k`` input columns: fixed by the weight's shape and dtype, never by the row
    count (they fix the order of each row's sum).

    From a sweep on an H200 (``benchmarks/scale.py --gemms --sweep``, Llama-3.1-8B and
    Llama-3.2-1B layers, bf16, 1 and 8 rows): column tiles that give each product a few hundred
    programs, ``K`` tiles of 512 columns (256 when two weight tiles share the pass) and four
    stages in flight read a weight at 1.0-1.1x its floor from 28 MB up."""
    if gated:
        block_n = 64 if n >= 8192 else 32
    else:
        block_n = 16 if n < 4096 else 32 if n < 16384 else 64
    block_k = 256 if gated or dtype == torch.float32 else 512
    block_k = block_size(k, lo=16, hi=block_k)
    stage = (BLOCK_M + block_n * (2 if gated else 1)) * block_k * dtype.itemsize
    return Blocks(block_n=block_n, block_k=block_k, num_warps=4,
                  num_stages=max(1, min(4, SHARED_BYTES // stage)))


def decode_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                  gated: bool = False, residual: torch.Tensor | None = None,
                  out: torch.Tensor | None = None,
                  out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Kernel form of :func:`decode_linear_reference` (same arguments and result), one launch.

    ``x: [M, K]`` and ``weight: [N, K]`` share a dtype and have contiguous rows; ``residual``
    and ``out``: ``[M, N]`` (``[M, N/2]`` when ``gated``), ``out`` may be
    ``residual``; ``out_dtype`` (default ``x``'s) may be wider than ``x``'s dtype. Launch
    sizes come from :func:`decode_linear_blocks`.
    """
    check_tensor("x", x, ("M", "K"), FLOAT_DTYPES, unit_stride=True)
    sizes = {"K": int(x.shape[1])}
    check_tensor("weight", weight, (None, "K"), (x.dtype,), sizes, x.device, unit_stride=True)
    n_w, k = int(weight.shape[0]), int(x.shape[1])
    if gated and n_w % 2:
        raise ShapeError(f"a gated product needs an even number of weight rows ([gate | up]), "
                         f"got {n_w}")
    n = n_w // 2 if gated else n_w
    m = int(x.shape[0])
    if bias is not None:
        if gated:
            raise ShapeError("decode_linear takes no bias with gated = True")
        check_tensor("bias", bias, (n_w,), (x.dtype,), device=x.device)
    if residual is not None:
        check_tensor("residual", residual, (m, n), (x.dtype,), device=x.device,
                     unit_stride=True)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if out_dtype not in FLOAT_DTYPES:
        raise ShapeError(f"decode_linear writes fp32, bf16 or fp16, not {out_dtype}")
    if out is None:
        out = torch.empty(m, n, dtype=out_dtype, device=x.device)
    else:
        check_tensor("out", out, (m, n), (out_dtype,), device=x.device, unit_stride=True)
    if m == 0 or n == 0:
        return out
    b = decode_linear_blocks(n, k, x.dtype, gated)
    _decode_linear_kernel[(triton.cdiv(m, BLOCK_M), triton.cdiv(n, b.block_n))](
        x, weight, or_dummy(bias, weight), or_dummy(residual, out), out,
        m, n, k, x.stride(0), weight.stride(0), row_stride(residual), out.stride(0),
        HAS_BIAS=bias is not None, GATED=gated, RESIDUAL=residual is not None,
        IEEE=x.dtype == torch.float32,
        BLOCK_M=BLOCK_M, BLOCK_N=b.block_n, BLOCK_K=b.block_k, num_warps=b.num_warps,
        num_stages=b.num_stages)
    return out


__all__ = ["BLOCK_M", "Blocks", "decode_linear", "decode_linear_blocks",
           "decode_linear_reference"]
