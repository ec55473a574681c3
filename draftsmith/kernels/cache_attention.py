"""Decoding attention over a static key/value cache: each query token attends to its own slot's
columns ``0 .. position``, one program per token, key/value head and split of the columns.

The target's decoding step and its verification of ``K + 1`` tokens (padded or packed) attend
through this kernel instead of a masked attention over the whole ``[rows, Q, width]`` block:
a token reads only the columns up to its position (not the bucket's width), the work spreads
over ``tokens * kv_heads * splits`` programs (a split is :data:`SPLIT` columns), and a token's
result is a function of its own query, slot and position alone. Every token runs the same
program shape whatever the batch, its width or the other tokens, and a split past the token's
position contributes exact zeros, folded in a fixed order; so a token's output is bit-identical
whether it is decoded alone, verified in a block, or verified packed. Imports
``draftsmith.contract`` only.

Numerics: softmax is computed online in fp32 over tiles of 64 columns (the reference's softmax
is one pass), so outputs differ from the reference by fp32 rounding before the final cast.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor, value_checks_enabled
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels._softmax import _online_softmax

_I64 = torch.int64

SPLIT = 256
"""Columns one program folds; a token at position ``p`` uses ``ceil((p + 1) / SPLIT)`` splits."""

_BLOCK_N = 64


def cache_attention_reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                              rows: torch.Tensor, positions: torch.Tensor, columns: int,
                              scale: float) -> torch.Tensor:
    """Attention of ``q: [N, nq, hd]`` over a static cache ``keys, values: [S, nkv, L, hd]``.

    Token ``n`` reads slot ``rows[n]`` (``rows: [N] int64``) at columns
    ``0 .. positions[n]`` (``positions: [N] int64``, each below ``columns <= L``); query head
    ``h`` uses key/value head ``h // (nq / nkv)``. Softmax of ``scale * q . k`` in fp32;
    returns ``[N, nq, hd]`` in ``q``'s dtype.
    """
    n, nq, hd = q.shape
    nkv = keys.shape[1]
    group = nq // nkv
    k = keys[rows, :, :columns].float().repeat_interleave(group, dim=1)  # [N, nq, C, hd]
    v = values[rows, :, :columns].float().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,nhcd->nhc", q.float(), k) * scale
    hidden = torch.arange(columns, device=q.device)[None, :] > positions[:, None]
    scores = scores.masked_fill(hidden[:, None, :], float("-inf"))
    out = torch.einsum("nhc,nhcd->nhd", scores.softmax(-1), v)
    return out.to(q.dtype)


@triton.jit
def _cache_attention_kernel(
    q_ptr, k_ptr, v_ptr, rows_ptr, pos_ptr, out_ptr, m_ptr, l_ptr, acc_ptr,
    HD, NQ, scale,
    s_qn, s_qh, s_ks, s_kh, s_kl, s_vs, s_vh, s_vl, s_on, s_oh,
    GROUP: tl.constexpr, SPLITS: tl.constexpr, SPLIT_COLS: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Program ``(token, kv head, split)``: the ``GROUP`` query heads of that key/value head over
    the split's columns up to the token's position (one split: the output; else partials)."""
    n = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    sp = tl.program_id(2)
    m = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    m_ok = m < GROUP
    d_ok = d < HD
    head = kvh * GROUP + m
    q = tl.load(q_ptr + n * s_qn + head[:, None] * s_qh + d[None, :],
                mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    row = tl.load(rows_ptr + n)
    pos = tl.load(pos_ptr + n)
    qk_scale = scale * 1.4426950408889634  # softmax in base 2
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo = sp * SPLIT_COLS
    hi = tl.minimum(lo + SPLIT_COLS, pos + 1)
    k_base = k_ptr + row * s_ks + kvh * s_kh
    v_base = v_ptr + row * s_vs + kvh * s_vh
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        c_ok = cols < hi
        ld_ok = c_ok[:, None] & d_ok[None, :]
        kt = tl.load(k_base + cols[:, None].to(tl.int64) * s_kl + d[None, :], mask=ld_ok,
                     other=0.0)
        vt = tl.load(v_base + cols[:, None].to(tl.int64) * s_vl + d[None, :], mask=ld_ok,
                     other=0.0)
        ok = c_ok[None, :] & m_ok[:, None]
        m_i, l_i, acc = _online_softmax(q, kt, vt, ok, m_i, l_i, acc, qk_scale, IEEE)
    if SPLITS == 1:
        o = acc / tl.maximum(l_i, 1.0e-30)[:, None]
        tl.store(out_ptr + n * s_on + head[:, None] * s_oh + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
    else:
        part = (n * NQ + head) * SPLITS + sp
        tl.store(m_ptr + part, m_i, mask=m_ok)
        tl.store(l_ptr + part, l_i, mask=m_ok)
        tl.store(acc_ptr + part[:, None] * HD + d[None, :], acc,
                 mask=m_ok[:, None] & d_ok[None, :])


@triton.jit
def _combine_kernel(out_ptr, m_ptr, l_ptr, acc_ptr, HD, NQ, s_on, s_oh,
                    SPLITS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program ``(token, query head)``: the splits' partials folded in split order (splits past
    the token's position hold exact zeros and a -1e30 max, so they change no bit)."""
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HD
    base = (n * NQ + h) * SPLITS
    top = tl.load(m_ptr + base)
    for s in tl.static_range(1, SPLITS):
        top = tl.maximum(top, tl.load(m_ptr + base + s))
    total = tl.zeros([1], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for s in tl.static_range(SPLITS):
        w = tl.exp2(tl.load(m_ptr + base + s) - top)
        total += tl.load(l_ptr + base + s) * w
        acc += tl.load(acc_ptr + (base + s) * HD + d, mask=d_ok, other=0.0) * w
    o = acc / tl.maximum(total, 1.0e-30)
    tl.store(out_ptr + n * s_on + h * s_oh + d, o.to(out_ptr.dtype.element_ty), mask=d_ok)


def cache_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    rows: torch.Tensor, positions: torch.Tensor, columns: int,
                    scale: float) -> torch.Tensor:
    """Kernel form of :func:`cache_attention_reference` (same arguments and result).

    ``q`` needs a contiguous last dim (its rows and heads may be strided, e.g. a view of a fused
    ``[q | k | v]`` projection); ``keys`` and ``values`` too. ``columns`` is a static bound on
    every position plus one (it sets the number of splits, not the result). The slot ids and
    positions are range-checked with a read back to the host, except inside
    :func:`~draftsmith.contract.values_trusted` and during a CUDA-graph capture, where nothing
    is read back.
    """
    s: dict[str, int] = {}
    check_tensor("q", q, ("N", "nq", "hd"), FLOAT_DTYPES, s, unit_stride=True)
    check_tensor("keys", keys, ("S", "nkv", "L", "hd"), q.dtype, s, q.device, unit_stride=True)
    check_tensor("values", values, ("S", "nkv", "L", "hd"), q.dtype, s, q.device,
                 unit_stride=True)
    check_tensor("rows", rows, ("N",), _I64, s, q.device)
    check_tensor("positions", positions, ("N",), _I64, s, q.device)
    if s["nq"] % s["nkv"]:
        raise ShapeError(f"{s['nq']} query heads do not group over {s['nkv']} KV heads")
    if not 1 <= columns <= s["L"]:
        raise ShapeError(f"columns {columns} must be in 1 .. {s['L']} (the cache length)")
    n, nq, hd = q.shape
    nkv = s["nkv"]
    out = torch.empty(n, nq, hd, dtype=q.dtype, device=q.device)
    if n == 0:
        return out
    if value_checks_enabled(rows):
        if bool(((rows < 0) | (rows >= s["S"])).any()):
            raise ShapeError(f"rows hold slot ids outside 0 .. {s['S'] - 1}")
        if bool(((positions < 0) | (positions >= columns)).any()):
            raise ShapeError(f"positions must lie in 0 .. {columns - 1} (columns {columns})")
    splits = triton.cdiv(int(columns), SPLIT)
    block_d = max(16, triton.next_power_of_2(hd))
    if splits > 1:
        m = torch.empty(n, nq, splits, dtype=torch.float32, device=q.device)
        l_sum = torch.empty_like(m)
        acc = torch.empty(n, nq, splits, hd, dtype=torch.float32, device=q.device)
    else:
        m = l_sum = acc = out  # unused
    rows, positions = rows.contiguous(), positions.contiguous()
    _cache_attention_kernel[(n, nkv, splits)](
        q, keys, values, rows, positions, out, m, l_sum, acc,
        hd, nq, float(scale),
        q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2), out.stride(0), out.stride(1),
        GROUP=nq // nkv, SPLITS=splits, SPLIT_COLS=SPLIT, IEEE=q.dtype == torch.float32,
        BLOCK_M=max(16, triton.next_power_of_2(nq // nkv)), BLOCK_N=_BLOCK_N, BLOCK_D=block_d,
        num_warps=4,
    )
    if splits > 1:
        _combine_kernel[(n, nq)](out, m, l_sum, acc, hd, nq, out.stride(0), out.stride(1),
                                 SPLITS=splits, BLOCK_D=block_d, num_warps=1)
    return out


__all__ = ["SPLIT", "cache_attention", "cache_attention_reference"]
