"""The block attention's kernel as it was before the split of the context (commit b1a62e1,
verbatim; the online-softmax step it calls is the package's, unchanged): ``test_block_attention``
checks that the one-launch path (a context at or below the split width, or ``split_cols=None``)
still gives its bits after the split of the context was added beside it."""

from __future__ import annotations

import triton
import triton.language as tl

from draftsmith.kernels._launch import pdl_start
from draftsmith.kernels._softmax import _online_softmax


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
def _block_attention_kernel(
    q_ptr, k_ptr, v_ptr, pool_ptr, tables_ptr, nctx_ptr, qpos_ptr, out_ptr,
    W, HD, COLUMNS, PAGE, MAX_PAGES, scale,
    s_qg, s_qw, s_qh, s_kg, s_kw, s_kh, s_vg, s_vw, s_vh,
    s_page, s_plane, s_ph, s_off, s_tg, s_og, s_ow, s_oh,
    REP: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program ``(b, kv_head)``: the ``W * REP`` query rows of that KV head's query heads."""
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
    head_base = pool_ptr + kvh * s_ph
    for n0 in range(0, n_ctx, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        c_ok = cols < n_ctx
        page_idx = tl.minimum(cols // PAGE, MAX_PAGES - 1)
        page = tl.load(tables_ptr + b * s_tg + page_idx, mask=c_ok, other=0)
        where = head_base + page * s_page + (cols % PAGE).to(tl.int64) * s_off
        ld_ok = c_ok[:, None] & d_ok[None, :]
        kt = tl.load(where[:, None] + d[None, :], mask=ld_ok, other=0.0)
        vt = tl.load(where[:, None] + s_plane + d[None, :], mask=ld_ok, other=0.0)
        ok = _seen(qp, cols.to(tl.int64), CAUSAL, WINDOW) & c_ok[None, :] & row_ok[:, None]
        m_i, l_i, acc = _online_softmax(q, kt, vt, ok, m_i, l_i, acc, qk_scale, IEEE)
    # the block's own keys and values
    j = tl.arange(0, BLOCK_W)
    j_ok = j < W
    ld_ok = j_ok[:, None] & d_ok[None, :]
    kb = tl.load(k_ptr + b * s_kg + j[:, None] * s_kw + kvh * s_kh + d[None, :], mask=ld_ok,
                 other=0.0)
    vb = tl.load(v_ptr + b * s_vg + j[:, None] * s_vw + kvh * s_vh + d[None, :], mask=ld_ok,
                 other=0.0)
    kp = tl.load(qpos_ptr + b * W + j, mask=j_ok, other=0)
    ok = _seen(qp, kp, CAUSAL, WINDOW) & j_ok[None, :] & row_ok[:, None]
    m_i, l_i, acc = _online_softmax(q, kb, vb, ok, m_i, l_i, acc, qk_scale, IEEE)
    o = acc / tl.maximum(l_i, 1.0e-30)[:, None]
    tl.store(out_ptr + b * s_og + row_w[:, None] * s_ow + head[:, None] * s_oh + d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
