"""Decoding attention over a static key/value cache: each query token attends to its own slot's
columns ``0 .. position``, one program per chunk of a row's tokens, key/value head and split of
the columns.

The target's decoding step and its verification of ``K + 1`` tokens (padded or packed) attend
through this kernel instead of a masked attention over the whole ``[rows, Q, width]`` block: a
token reads only the columns up to its position (not the bucket's width), the work spreads over
``chunks * kv_heads * splits`` programs (a split is :data:`SPLIT` columns), and a token's result
is a function of its own query, slot and position alone. A chunk is up to :func:`chunk_tokens`
consecutive tokens of one row (``tokens_per_row``), which share the slot: each key and value
tile is read once for all of them (a bf16 verification of ``K + 1 = 8`` tokens with SmolLM2's
heads reads the row's cache once, not eight times; fp32 twice). Every token runs the same tile
shape whatever the batch, its width, the chunk or the other tokens; tiles and splits past a
token's position contribute exact zeros, folded in a fixed order; so a token's output is
bit-identical whether it is decoded alone, verified in a block, or verified packed (for a cache
of finite values: a non-finite value at a later position of the same row would reach the chunk's
earlier tokens through the shared tile). Imports ``draftsmith.contract`` only.

Numerics: softmax is computed online in fp32 over tiles of 64 columns (the reference's softmax
is one pass), so outputs differ from the reference by fp32 rounding before the final cast.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor, value_checks_enabled
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels import pdl_on
from draftsmith.kernels._launch import block_size, pdl_kwargs, pdl_start
from draftsmith.kernels._softmax import _fold_splits, _online_softmax

_I64 = torch.int64

SPLIT = 256
"""Columns one program folds; a token at position ``p`` uses ``ceil((p + 1) / SPLIT)`` splits."""

_BLOCK_N = 64


def cache_attention_reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                              rows: torch.Tensor, positions: torch.Tensor, columns: int,
                              scale: float, tokens_per_row: int = 1, *,
                              pdl: bool = False) -> torch.Tensor:
    """Attention of ``q: [N, nq, hd]`` over a static cache ``keys, values: [S, nkv, L, hd]``.

    Token ``n`` reads slot ``rows[n]`` (``rows: [N] int64``) at columns
    ``0 .. positions[n]`` (``positions: [N] int64``, each below ``columns <= L``); query head
    ``h`` uses key/value head ``h // (nq / nkv)``. Softmax of ``scale * q . k`` in fp32;
    returns ``[N, nq, hd]`` in ``q``'s dtype. ``tokens_per_row`` states how the kernel may
    share reads (rows of that many tokens on one slot); each token's result is the same.
    ``pdl`` (the kernel form's launch option) is accepted and ignored.
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
    HD, NQ, Q, CHUNKS, scale,
    s_qn, s_qh, s_ks, s_kh, s_kl, s_vs, s_vh, s_vl, s_on, s_oh,
    SPLITS, GROUP: tl.constexpr, GROUP_P2: tl.constexpr, CHUNK: tl.constexpr,
    SPLIT: tl.constexpr, SPLIT_COLS: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr,
):
    """Program ``(chunk, kv head, split)``: up to ``CHUNK`` tokens of one row (one slot) times
    the ``GROUP`` query heads of that key/value head, over the split's columns up to each
    token's position (one split: the output; else partials). Tile row ``m`` is token
    ``m // GROUP_P2`` of the chunk, query head ``m % GROUP_P2`` of the group."""
    pdl_start(PDL, True)
    chunk = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    sp = tl.program_id(2)
    b = chunk // CHUNKS
    j0 = (chunk % CHUNKS) * CHUNK
    m = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    t = m // GROUP_P2
    g = m % GROUP_P2
    m_ok = (g < GROUP) & (t < CHUNK) & (j0 + t < Q)
    d_ok = d < HD
    n = b * Q + j0 + t  # each tile row's token
    head = kvh * GROUP + g
    q = tl.load(q_ptr + n[:, None] * s_qn + head[:, None] * s_qh + d[None, :],
                mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    row = tl.load(rows_ptr + b * Q + j0)  # every token of a chunk reads one slot
    pos = tl.load(pos_ptr + n, mask=m_ok, other=-1)
    qk_scale = scale * 1.4426950408889634  # softmax in base 2
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo = sp * SPLIT_COLS
    hi = tl.minimum(lo + SPLIT_COLS, tl.max(pos, axis=0) + 1)
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
        ok = c_ok[None, :] & (cols[None, :] <= pos[:, None]) & m_ok[:, None]
        m_i, l_i, acc = _online_softmax(q, kt, vt, ok, m_i, l_i, acc, qk_scale, IEEE)
    if not SPLIT:
        o = acc / tl.maximum(l_i, 1.0e-30)[:, None]
        tl.store(out_ptr + n[:, None] * s_on + head[:, None] * s_oh + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
    else:
        part = (n * NQ + head) * SPLITS + sp
        tl.store(m_ptr + part, m_i, mask=m_ok)
        tl.store(l_ptr + part, l_i, mask=m_ok)
        tl.store(acc_ptr + part[:, None] * HD + d[None, :], acc,
                 mask=m_ok[:, None] & d_ok[None, :])


@triton.jit
def _combine_kernel(out_ptr, m_ptr, l_ptr, acc_ptr, HD, NQ, s_on, s_oh, SPLITS,
                    BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    """Program ``(token, query head)``: the splits' partials folded in split order (splits past
    the token's position hold exact zeros and a -1e30 max, so they change no bit)."""
    pdl_start(PDL, True)
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HD
    o = _fold_splits(m_ptr, l_ptr, acc_ptr, (n * NQ + h) * SPLITS, d, d_ok, HD, SPLITS)
    tl.store(out_ptr + n * s_on + h * s_oh + d, o.to(out_ptr.dtype.element_ty), mask=d_ok)


def chunk_tokens(group: int, dtype: torch.dtype) -> tuple[int, int]:
    """``(tokens, tile rows)`` of one program for ``group`` query heads per key/value head and
    the query ``dtype``: the tile has a fixed height whatever the tokens per row, so that a
    token's bits do not depend on how many share its tile. 32 rows for 16-bit queries (tensor
    core products, which cost the same at 16 and 32 rows); 16 for fp32, whose exact products
    run as multiply-adds over every row of the tile (32 rows doubled the one-token step's
    attention on an H200: 15 to 29 us a layer at 8 rows, 2026-12-04)."""
    group_p2 = block_size(group)
    block_m = max(16 if dtype == torch.float32 else 32, group_p2)
    return block_m // group_p2, block_m


def cache_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    rows: torch.Tensor, positions: torch.Tensor, columns: int,
                    scale: float, tokens_per_row: int = 1, *,
                    pdl: bool = False) -> torch.Tensor:
    """Kernel form of :func:`cache_attention_reference` (same arguments and result).

    ``tokens_per_row``: ``Q``, with ``N = G * Q`` tokens row-major whose row's ``Q`` tokens
    share one slot (``rows[b * Q + j] == rows[b * Q]``): consecutive tokens of a row share a
    program and its reads of the cache. ``q`` needs a contiguous last dim (its rows and heads
    may be strided, e.g. a view of a fused ``[q | k | v]`` projection); ``keys`` and ``values``
    too. ``columns`` is a static bound on every position plus one (it sets the number of splits,
    not the result). The slot ids and positions are range-checked with a read back to the host,
    except inside :func:`~draftsmith.contract.values_trusted` and during a CUDA-graph capture,
    where nothing is read back. ``pdl``: as :func:`~draftsmith.kernels.rms_norm.rms_norm`'s,
    for both launches.
    """
    s: dict[str, int] = {}
    check_tensor("q", q, ("N", "nq", "hd"), FLOAT_DTYPES, s, unit_stride=True)
    check_tensor("keys", keys, ("S", "nkv", "L", "hd"), q.dtype, s, q.device, unit_stride=True)
    check_tensor("values", values, ("S", "nkv", "L", "hd"), q.dtype, s, q.device,
                 unit_stride=True)
    check_tensor("rows", rows, ("N",), _I64, s, q.device)
    check_tensor("positions", positions, ("N",), _I64, s, q.device)
    if not s["nq"] or not s["nkv"] or s["nq"] % s["nkv"]:
        raise ShapeError(f"{s['nq']} query heads do not group over {s['nkv']} KV heads (each "
                         "KV head serves one or more query heads)")
    if not 1 <= columns <= s["L"]:
        raise ShapeError(f"columns {columns} must be in 1 .. {s['L']} (the cache length)")
    if tokens_per_row < 1 or s["N"] % tokens_per_row:
        raise ShapeError(f"{s['N']} tokens are not rows of tokens_per_row = {tokens_per_row}")
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
        by_row = rows.view(-1, tokens_per_row)
        if bool((by_row != by_row[:, :1]).any()):
            raise ShapeError(f"the {tokens_per_row} tokens of a row must read one slot")
    splits = triton.cdiv(int(columns), SPLIT)
    block_d = block_size(hd, lo=16)
    if splits > 1:
        m = torch.empty(n, nq, splits, dtype=torch.float32, device=q.device)
        l_sum = torch.empty_like(m)
        acc = torch.empty(n, nq, splits, hd, dtype=torch.float32, device=q.device)
    else:
        m = l_sum = acc = out  # unused
    rows, positions = rows.contiguous(), positions.contiguous()
    group = nq // nkv
    chunk, block_m = chunk_tokens(group, q.dtype)
    chunks = triton.cdiv(tokens_per_row, chunk)
    on = pdl_on(pdl, q)
    _cache_attention_kernel[(n // tokens_per_row * chunks, nkv, splits)](
        q, keys, values, rows, positions, out, m, l_sum, acc,
        hd, nq, tokens_per_row, chunks, float(scale),
        q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2), out.stride(0), out.stride(1),
        SPLITS=splits, GROUP=group, GROUP_P2=block_size(group), CHUNK=chunk, SPLIT=splits > 1,
        SPLIT_COLS=SPLIT, IEEE=q.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=_BLOCK_N, BLOCK_D=block_d, PDL=on, num_warps=4,
        **pdl_kwargs(on))
    if splits > 1:
        _combine_kernel[(n, nq)](out, m, l_sum, acc, hd, nq, out.stride(0), out.stride(1),
                                 SPLITS=splits, BLOCK_D=block_d, PDL=on, num_warps=1,
                                 **pdl_kwargs(on))
    return out


__all__ = ["SPLIT", "cache_attention", "cache_attention_reference", "chunk_tokens"]
