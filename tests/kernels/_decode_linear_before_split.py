"""The few-row product's kernel as it was before the split of ``K`` (commit 2ed0d27, verbatim):
``test_decode_linear`` checks that the whole-``K`` launch (``split_k = 1``) still gives its
bits after the epilogue and the ``K`` loop moved into helpers shared with the split kernel."""

from __future__ import annotations

import triton
import triton.language as tl


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
