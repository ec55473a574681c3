"""A drafter block's attention over its paged context plus the block itself.

Each block query attends to its request's context columns ``0 .. num_ctx - 1`` (keys and values
read straight from the paged pool through the block table) and to the block's own keys, under a
visibility rule on positions (causal and/or a window; context column ``c`` sits at position
``c``). In eager torch this is a gather of the context, a mask, two concatenations, the attention
and a transpose copy per layer; inside a captured round those cost launch latency. Owns
``block_attention`` beside its reference. Imports ``draftsmith.contract`` only.

Launches: one program per request and KV head holds the block's ``W x (nh / nkv)`` query rows.
Up to :data:`SPLIT_COLS` context columns (the static ``columns`` bound, not the data) one launch
does it all: each program folds every context column, then the block's keys, and writes the
output. That serial loop is the whole cost at long contexts (120 us at 4k columns, 468 us at 16k
on an H100 at batch 1, on two programs), so a wider bound splits the context: each of
``ceil(columns / SPLIT_COLS)`` programs per request and KV head folds one run of
:data:`SPLIT_COLS` columns, the last split also folds the block's own keys (exactly one split
does, so nothing counts twice; the last is the lightest, its run often past ``num_ctx``), and
each writes its fp32 running max, sum and unnormalised output per query row and head to a
scratch buffer. A second launch folds each query row and head's splits in split order
``0, 1, ...``. A split with no visible column writes exact zeros and a -1e30 max, which change
no bit of the fold and make no NaN. The number of splits depends on ``columns`` alone, so a CUDA
graph captured at one width stays valid for every ``num_ctx`` below it, and a request's result
depends neither on the batch nor on the call (no atomics, no order that depends on scheduling).
Both launches keep ``pdl``'s rule: every program waits before its first read or write.

Numerics: softmax is computed online in fp32 over tiles (the reference's softmax is one pass), so
outputs differ from the reference by fp32 rounding before the final cast. The split path folds
in a different order from the one-launch path, so their bits differ by that rounding too; the
one-launch path's bits are those of the kernel before the split.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels import pdl_on
from draftsmith.kernels._launch import block_size, pdl_kwargs, pdl_start
from draftsmith.kernels._softmax import _fold_splits, _online_softmax

_I64 = torch.int64

SPLIT_COLS = 256
"""Context columns one program folds once the context is split (the default ``split_cols``): a
``columns`` bound above it runs ``ceil(columns / SPLIT_COLS)`` programs per request and KV head
and a combine launch; at or below it, one launch with one program per request and KV head.

A program's tiles run one after another, so its time grows with its run's length: shorter runs
finish sooner at batch 1, and more programs cost more partials and scheduling at larger batches.
Measured on an H100 (bf16, 8 block queries, 4 query heads over 2 KV heads of 64, in a CUDA
graph, 2026-12-05): at batch 1 one launch takes 32.6 / 120.0 / 468.3 us at 1k / 4k / 16k
columns, splits of 256 columns 12.4 / 12.7 / 13.9 us and of 512 19.8 / 20.6 / 20.7 us; at batch
8 and 16k, 39.0 us against 34.5 (heads of 128: 74.7 against 73.5). Splits of 128 were faster
still at batch 1 (8.6 / 9.3 / 13.9 us, another run) but 18-24% slower than 256 at batch 8 and
16k. cache_attention splits at 256 too. The split depends on the width alone, so a request's
bits do not depend on the batch."""


def _launch_sizes(hd: int, dtype: torch.dtype) -> dict[str, int]:
    """Context tiles of 32 KiB of keys (32 to 256 columns) with two stages in flight: each tile
    of the context loop costs a few microseconds of latency whatever its width, so a drafter's
    context takes few of them. Measured on an H100 (``docs/benchmarks.md``, bf16, a block of 8
    queries alone in a CUDA graph), against tiles of 64 columns and three stages: 4 query heads
    over 2 KV heads of 64 at 160 context columns 8.5 -> 5.6 us, at 4k 13.6 -> 9.1; 32 over 8
    heads of 128 at 160, 12.5 -> 9.4. At two stages each tile's page ids load after the previous
    tile's barrier (three stages copy them ahead, and were 30-60% slower)."""
    tile = 32 * 1024 // (block_size(hd, lo=16) * dtype.itemsize)
    return dict(BLOCK_N=max(32, min(256, tile)), num_stages=2)


def visible(query_pos: torch.Tensor, key_pos: torch.Tensor, causal: bool,
            window: int | None) -> torch.Tensor:
    """``query_pos: [G, W]``, ``key_pos: [G, N]`` -> ``[G, W, N] bool``: key at ``kp`` is seen
    from ``qp`` iff ``(not causal or kp <= qp)`` and, with a window ``w``, ``qp - kp < w`` and
    (non-causal) ``kp - qp < w``."""
    qp, kp = query_pos[:, :, None], key_pos[:, None, :]
    out = torch.ones(qp.shape[0], qp.shape[1], kp.shape[2], dtype=torch.bool,
                     device=query_pos.device)
    if causal:
        out &= kp <= qp
    if window is not None:
        out &= (qp - kp) < window
        if not causal:
            out &= (kp - qp) < window
    return out


def paged_columns(block_tables: torch.Tensor, num_ctx: torch.Tensor, columns: int,
                  page_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where context columns ``0 .. columns - 1`` of each request sit in a paged pool:
    ``pages, offsets: [G, C] int64`` and ``valid: [G, C] bool`` (column ``c < num_ctx[b]``).
    ``block_tables: [G, max_pages]``; columns past the table read its last page (masked)."""
    cols = torch.arange(columns, device=num_ctx.device)
    page_idx = (cols // page_size).clamp(max=block_tables.shape[1] - 1)
    pages = block_tables[:, page_idx]
    offsets = (cols % page_size).expand_as(pages)
    return pages, offsets, cols[None, :] < num_ctx[:, None]


def block_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pool: torch.Tensor,
    block_tables: torch.Tensor, num_ctx: torch.Tensor, query_pos: torch.Tensor, columns: int,
    causal: bool, window: int | None, scale: float, *, pdl: bool = False,
    split_cols: int | None = SPLIT_COLS,
) -> torch.Tensor:
    """Attention of a block over its paged context and itself (``pdl`` and ``split_cols``, the
    kernel form's launch options, are accepted and ignored).

    ``q: [G, W, nh, hd]``, ``k, v: [G, W, nkv, hd]`` (the block's keys and values),
    ``pool: [pages, 2, nkv, P_sz, hd]`` (one layer's paged context: plane 0 keys, plane 1
    values), ``block_tables: [G, max_pages] int64``, ``num_ctx: [G] int64`` (context columns
    held, at most ``columns``), ``query_pos: [G, W] int64``. Returns ``[G, W, nh, hd]``.
    """
    g, w, nh, hd = q.shape
    pages, offsets, valid = paged_columns(block_tables, num_ctx, columns, pool.shape[3])
    entries = pool[pages, :, :, offsets]  # [G, C, 2, nkv, hd]
    cols = torch.arange(columns, device=q.device)
    entries = torch.where(valid[:, :, None, None, None], entries.to(q.dtype), 0)
    keys = torch.cat((entries[:, :, 0], k), dim=1).transpose(1, 2)
    values = torch.cat((entries[:, :, 1], v), dim=1).transpose(1, 2)
    key_pos = torch.cat((cols.expand(g, -1), query_pos), dim=1)
    key_ok = torch.cat((valid, torch.ones_like(query_pos, dtype=torch.bool)), dim=1)
    mask = visible(query_pos, key_pos, causal, window) & key_ok[:, None, :]
    o = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), keys, values, attn_mask=mask[:, None], scale=scale,
        enable_gqa=nh != k.shape[2])
    return o.transpose(1, 2)


@triton.jit
def _seen(qp, kp, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """``[M, N]`` visibility of keys at ``kp [N]`` from queries at ``qp [M]`` (WINDOW 0: none)."""
    diff = qp[:, None] - kp[None, :]
    ok = diff == diff
    if CAUSAL:
        ok = diff >= 0
    if WINDOW > 0:
        ok = ok & (diff < WINDOW)
        if not CAUSAL:
            ok = ok & (-diff < WINDOW)
    return ok


@triton.jit
def _load_block_keys(k_ptr, v_ptr, qpos_ptr, b, kvh, W, n_own, d, d_ok, s_kg, s_kw, s_kh, s_vg,
                     s_vw, s_vh, BLOCK_W: tl.constexpr):
    """``(kb, vb [BLOCK_W, BLOCK_D], kp [BLOCK_W], j_ok)``: the first ``n_own`` (``W`` or 0) of
    the block's own keys, values and their positions (request ``b``, KV head ``kvh``). Loaded
    before the context loop: after it they waited for its last barrier, one more round trip in
    series."""
    j = tl.arange(0, BLOCK_W)
    j_ok = j < n_own
    ld_ok = j_ok[:, None] & d_ok[None, :]
    kb = tl.load(k_ptr + b * s_kg + j[:, None] * s_kw + kvh * s_kh + d[None, :], mask=ld_ok,
                 other=0.0)
    vb = tl.load(v_ptr + b * s_vg + j[:, None] * s_vw + kvh * s_vh + d[None, :], mask=ld_ok,
                 other=0.0)
    kp = tl.load(qpos_ptr + b * W + j, mask=j_ok, other=0)
    return kb, vb, kp, j_ok


@triton.jit
def _fold_block_keys(q, qp, row_ok, m_i, l_i, acc, kb, vb, kp, j_ok, qk_scale,
                     CAUSAL: tl.constexpr, WINDOW: tl.constexpr, IEEE: tl.constexpr):
    """Fold the block's own keys and values (:func:`_load_block_keys`'s; key ``j`` at position
    ``kp[j]``) into the running max, sum and output of the query rows."""
    ok = _seen(qp, kp, CAUSAL, WINDOW) & j_ok[None, :] & row_ok[:, None]
    return _online_softmax(q, kb, vb, ok, m_i, l_i, acc, qk_scale, IEEE)


@triton.jit
def _block_attention_kernel(
    q_ptr, k_ptr, v_ptr, pool_ptr, tables_ptr, nctx_ptr, qpos_ptr, out_ptr, m_ptr, l_ptr,
    acc_ptr, W, HD, NH, COLUMNS, PAGE, MAX_PAGES, SPLITS, SPLIT_W, scale,
    s_qg, s_qw, s_qh, s_kg, s_kw, s_kh, s_vg, s_vw, s_vh,
    s_page, s_plane, s_ph, s_off, s_tg, s_og, s_ow, s_oh,
    REP: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, IEEE: tl.constexpr,
    SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
    BLOCK_D: tl.constexpr, PDL: tl.constexpr,
):
    """Program ``(b, kv_head, split)``: the ``W * REP`` query rows of that KV head's query
    heads. Without ``SPLIT`` (one split): every context column, then the block's keys, into the
    output. With it: context columns ``split * SPLIT_W ..`` (up to ``SPLIT_W`` of them, below
    ``num_ctx``), the block's keys in the last of the ``SPLITS`` splits only, into the partials
    ``m, l: [G, W, NH, SPLITS]`` and ``acc: [G, W, NH, SPLITS, HD]`` (fp32)."""
    pdl_start(PDL, True)
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    m = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    row_w = m // REP
    head = kvh * REP + m % REP
    row_ok = row_w < W
    d_ok = d < HD
    q = tl.load(q_ptr + b * s_qg + row_w[:, None] * s_qw + head[:, None] * s_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    qp = tl.load(qpos_ptr + b * W + row_w, mask=row_ok, other=0)
    qk_scale = scale * 1.4426950408889634  # softmax in base 2
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    n_ctx = tl.minimum(tl.load(nctx_ptr + b), COLUMNS)
    if SPLIT:  # this split's run of columns (none where it starts at or past num_ctx)
        sp = tl.program_id(2)
        lo = sp * SPLIT_W
        hi = tl.minimum(lo + SPLIT_W, n_ctx)
        own = sp == SPLITS - 1  # exactly one split counts the block's own keys
        n_own = tl.where(own, W, 0)
    else:
        lo = 0
        hi = n_ctx
        n_own = W
    kb, vb, kp, j_ok = _load_block_keys(k_ptr, v_ptr, qpos_ptr, b, kvh, W, n_own, d, d_ok, s_kg,
                                        s_kw, s_kh, s_vg, s_vw, s_vh, BLOCK_W)
    head_base = pool_ptr + kvh * s_ph
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        c_ok = cols < hi
        page_idx = tl.minimum(cols // PAGE, MAX_PAGES - 1)
        page = tl.load(tables_ptr + b * s_tg + page_idx, mask=c_ok, other=0)
        where = head_base + page * s_page + (cols % PAGE).to(tl.int64) * s_off
        ld_ok = c_ok[:, None] & d_ok[None, :]
        kt = tl.load(where[:, None] + d[None, :], mask=ld_ok, other=0.0)
        vt = tl.load(where[:, None] + s_plane + d[None, :], mask=ld_ok, other=0.0)
        ok = _seen(qp, cols.to(tl.int64), CAUSAL, WINDOW) & c_ok[None, :] & row_ok[:, None]
        m_i, l_i, acc = _online_softmax(q, kt, vt, ok, m_i, l_i, acc, qk_scale, IEEE)
    if SPLIT:
        if own:
            m_i, l_i, acc = _fold_block_keys(q, qp, row_ok, m_i, l_i, acc, kb, vb, kp, j_ok,
                                             qk_scale, CAUSAL, WINDOW, IEEE)
        # every split writes its partials, an empty one too (the scratch is uninitialised)
        part = ((b * W + row_w) * NH + head) * SPLITS + sp
        tl.store(m_ptr + part, m_i, mask=row_ok)
        tl.store(l_ptr + part, l_i, mask=row_ok)
        tl.store(acc_ptr + part[:, None] * HD + d[None, :], acc,
                 mask=row_ok[:, None] & d_ok[None, :])
    else:
        m_i, l_i, acc = _fold_block_keys(q, qp, row_ok, m_i, l_i, acc, kb, vb, kp, j_ok,
                                         qk_scale, CAUSAL, WINDOW, IEEE)
        o = acc / tl.maximum(l_i, 1.0e-30)[:, None]
        tl.store(out_ptr + b * s_og + row_w[:, None] * s_ow + head[:, None] * s_oh + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _combine_kernel(out_ptr, m_ptr, l_ptr, acc_ptr, W, HD, NH, s_og, s_ow, s_oh, SPLITS,
                    BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    """Program ``(b * W + w, head)``: the ``SPLITS`` partials of query row ``w`` of request
    ``b`` and ``head`` folded in split order into the output (a split that saw no column holds
    exact zeros and a -1e30 max: its weight is 0, or 1 on zeros where no split saw one, so it
    changes no bit and makes no NaN)."""
    pdl_start(PDL, True)
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HD
    o = _fold_splits(m_ptr, l_ptr, acc_ptr, (row * NH + h) * SPLITS, d, d_ok, HD, SPLITS)
    b = row // W
    tl.store(out_ptr + b * s_og + (row - b * W) * s_ow + h * s_oh + d,
             o.to(out_ptr.dtype.element_ty), mask=d_ok)


def context_splits(columns: int, split_cols: int | None = SPLIT_COLS) -> int:
    """Programs per request and KV head over a context of at most ``columns`` columns: 1 up to
    ``split_cols`` columns (or with ``split_cols=None``: never split), else
    ``ceil(columns / split_cols)``. A function of the static bound alone, never of ``num_ctx``."""
    if split_cols is None or columns <= split_cols:
        return 1
    return triton.cdiv(columns, split_cols)


def block_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pool: torch.Tensor,
    block_tables: torch.Tensor, num_ctx: torch.Tensor, query_pos: torch.Tensor, columns: int,
    causal: bool, window: int | None, scale: float, *, pdl: bool = False,
    split_cols: int | None = SPLIT_COLS,
) -> torch.Tensor:
    """Kernel form of :func:`block_attention_reference` (same arguments, ``[G, W, nh, hd]`` in
    ``q``'s dtype); every tensor needs a contiguous last dim. Reads nothing back to the host.
    ``pdl``: launch with programmatic dependent launch where the device has it
    (:func:`~draftsmith.kernels.pdl_on`), both launches where the context is split.
    ``split_cols``: context columns per program once ``columns`` exceeds it
    (:func:`context_splits`; ``None``: one launch whatever the width, the kernel's bits before
    the split). The split path allocates its fp32 partials (``G * W * nh * splits * (hd + 2)``
    floats) with ``torch.empty`` on each call, from the graph's pool under a CUDA-graph
    capture."""
    s: dict[str, int] = {}
    check_tensor("q", q, ("G", "W", "nh", "hd"), FLOAT_DTYPES, s, unit_stride=True)
    check_tensor("k", k, ("G", "W", "nkv", "hd"), q.dtype, s, q.device, unit_stride=True)
    check_tensor("v", v, ("G", "W", "nkv", "hd"), q.dtype, s, q.device, unit_stride=True)
    check_tensor("pool", pool, ("pages", 2, "nkv", "P_sz", "hd"), FLOAT_DTYPES, s, q.device,
                 unit_stride=True)
    check_tensor("block_tables", block_tables, ("G", "max_pages"), _I64, s, q.device,
                 unit_stride=True)
    check_tensor("num_ctx", num_ctx, ("G",), _I64, s, q.device)
    check_tensor("query_pos", query_pos, ("G", "W"), _I64, s, q.device, contiguous=True)
    if s["nh"] % s["nkv"]:
        raise ShapeError(f"{s['nh']} query heads do not group over {s['nkv']} KV heads")
    if window is not None and window < 1:
        raise ShapeError(f"window must be >= 1 or None, got {window}")
    if split_cols is not None and split_cols < 1:
        raise ShapeError(f"split_cols must be >= 1 or None (never split), got {split_cols}")
    g, w, nh, hd = q.shape
    nkv, rep = s["nkv"], nh // s["nkv"]
    out = torch.empty(g, w, nh, hd, dtype=q.dtype, device=q.device)
    if g == 0:
        return out
    splits = context_splits(int(columns), split_cols)
    if splits > 1:  # partials per query row and head, splits innermost
        m = torch.empty(g, w, nh, splits, dtype=torch.float32, device=q.device)
        l_sum = torch.empty_like(m)
        acc = torch.empty(g, w, nh, splits, hd, dtype=torch.float32, device=q.device)
    else:
        m = l_sum = acc = out  # unused
    block_m = block_size(w * rep, lo=16)
    block_d = block_size(hd, lo=16)
    on = pdl_on(pdl, q)
    _block_attention_kernel[(g, nkv, splits)](
        q, k, v, pool, block_tables, num_ctx, query_pos, out, m, l_sum, acc,
        w, hd, nh, int(columns), pool.shape[3], block_tables.shape[1], splits,
        int(split_cols) if splits > 1 else 0, float(scale),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        pool.stride(0), pool.stride(1), pool.stride(2), pool.stride(3), block_tables.stride(0),
        out.stride(0), out.stride(1), out.stride(2),
        REP=rep, CAUSAL=bool(causal), WINDOW=int(window or 0), IEEE=q.dtype == torch.float32,
        SPLIT=splits > 1, BLOCK_M=block_m, BLOCK_W=block_size(w, lo=16), BLOCK_D=block_d,
        PDL=on, num_warps=4, **_launch_sizes(hd, q.dtype), **pdl_kwargs(on),
    )
    if splits > 1:
        _combine_kernel[(g * w, nh)](out, m, l_sum, acc, w, hd, nh, out.stride(0),
                                     out.stride(1), out.stride(2), SPLITS=splits,
                                     BLOCK_D=block_d, PDL=on, num_warps=1, **pdl_kwargs(on))
    return out


__all__ = ["SPLIT_COLS", "block_attention", "block_attention_reference", "context_splits",
           "paged_columns", "visible"]
