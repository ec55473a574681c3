"""The packed ``[q | k | v]`` product of a few rows with RoPE and the cache writes in its
epilogue: one launch where the few-row path ran two (``decode_linear``, then ``rope_store``).

Each program multiplies the weight rows of whole rotation pairs: its ``BLOCK_N`` columns are
``BLOCK_N / 2`` pairs ``(i, i + hd/2)`` of one or more heads, gathered by row index (the weight
is not reordered, so every other path keeps using it as loaded). With both halves of a pair in
its tile, the epilogue rounds the sums to the input dtype, rotates query and key pairs at each
row's position, and stores the rotated queries ``[R, n_q * hd]`` for the attention, the
rotated keys and the values into the cache at the row's slot and position. Heads that are
normalised before RoPE (Qwen3's q/k norm) need a whole head in one program: those keep
``decode_linear`` and ``rope_store``.

Owns ``qkv_rope`` beside its reference. Imports ``draftsmith.contract``, the product's helpers
of ``kernels.decode_linear``, ``kernels.rope_cos_sin``'s angle and rotation rules, the references of
``kernels.rope_store`` and the kernels' launch helpers only.

Numerics: the bits of ``decode_linear`` followed by ``rope_store`` (each product of a column
sums in the same order, whichever columns share its program; the rotation rounds as
``rope_store`` does, by :func:`~draftsmith.kernels.rope_cos_sin.rotate_at` with angles by
:func:`~draftsmith.kernels.rope_cos_sin.cos_sin_at`, and
like it the launch contracts no product into an FMA).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels import interpreted, pdl_on
from draftsmith.kernels._launch import or_dummy, pdl_kwargs, pdl_release, pdl_start
from draftsmith.kernels.decode_linear import (
    BLOCK_M,
    _epilogue_inputs,
    _prefetch_l2,
    _products,
    decode_linear_blocks,
    decode_linear_reference,
)
from draftsmith.kernels.rope_cos_sin import cos_sin_at, rotate_at
from draftsmith.kernels.rope_store import rope_store_reference

_I64 = torch.int64


def qkv_rope_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       positions: torch.Tensor, inv_freq: torch.Tensor, keys: torch.Tensor,
                       values: torch.Tensor, rows: torch.Tensor, num_q_heads: int,
                       scale: float = 1.0, *, pdl: bool = False,
                       prefetch: int = 0) -> torch.Tensor:
    """``x: [R, K]`` times the packed ``weight: [(n_q + 2 n_kv) hd, K]`` (``bias``), then
    :func:`~draftsmith.kernels.rope_store.rope_store_reference` on its heads (no q/k norm):
    keys and values written to ``keys, values: [S, n_kv, L, hd]`` at slot ``rows[r]``,
    column ``positions[r]``; returns the rotated queries ``[R, n_q * hd]``. ``pdl`` and
    ``prefetch`` (the kernel form's launch options) are accepted and ignored."""
    hd = int(keys.shape[-1])
    qkv = decode_linear_reference(x, weight, bias)
    heads = qkv.view(qkv.shape[0], -1, hd)
    rope_store_reference(heads, positions, inv_freq, keys, values, rows, num_q_heads, scale)
    return heads[:, :num_q_heads].reshape(qkv.shape[0], num_q_heads * hd)


@triton.jit
def _qkv_rope_kernel(
    x_ptr, w_ptr, b_ptr, q_ptr, pos_ptr, freq_ptr, k_ptr, v_ptr, rows_ptr,
    M, K, NQ, NKV, HD, scale, s_x, s_w, s_q, s_ks, s_kh, s_kl, s_vs, s_vh, s_vl,
    HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr, PF_TILES: tl.constexpr,
    PF_LINES: tl.constexpr, PF_LINE: tl.constexpr,
):
    """Program ``(m, n)``: rows ``m * BLOCK_M ..``, rotation pairs ``n * BLOCK_N / 2 ..``
    (pair ``p``: head ``p // (HD / 2)``, element ``i = p % (HD / 2)`` and ``i + HD / 2``).
    Column ``j < BLOCK_N / 2`` of its tile is the first element of pair ``j``, column
    ``BLOCK_N / 2 + j`` the second. Under ``PDL`` as ``decode_linear``'s kernel."""
    PAIRS: tl.constexpr = BLOCK_N // 2
    half = HD // 2
    heads = NQ + 2 * NKV
    n_pairs = heads * half
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = rm < M
    j = tl.arange(0, BLOCK_N)
    pj = tl.program_id(1) * PAIRS + j % PAIRS
    rn = (pj // half) * HD + pj % half + (j >= PAIRS).to(tl.int32) * half
    n_ok = pj < n_pairs
    if PDL and PF_TILES > 0:
        _prefetch_l2(w_ptr, rn, n_ok, heads * HD, 0, K, s_w, False, PF_TILES, PF_LINES, PF_LINE,
                     BLOCK_K)
    pdl_start(PDL, False)
    # every load before the products (after their loop each would wait for its last barrier)
    bias, _ = _epilogue_inputs(b_ptr, b_ptr, rm, rn, m_ok, n_ok, 0, HAS_BIAS, False)
    p = tl.program_id(1) * PAIRS + tl.arange(0, PAIRS)
    p_ok = p < n_pairs
    head = p // half
    i = p % half
    pos = tl.load(pos_ptr + rm, mask=m_ok, other=0)
    slot = tl.load(rows_ptr + rm, mask=m_ok, other=0)
    freq = tl.load(freq_ptr + i, mask=p_ok, other=0.0)
    dt = x_ptr.dtype.element_ty
    # the angles before the products: off the critical path, and their slow path's table
    # loads (large angles) wait for no barrier
    c, s = cos_sin_at(pos.to(tl.float32)[:, None], freq[None, :], scale, dt)
    acc, _ = _products(x_ptr, w_ptr, rm, rn, m_ok, n_ok, heads * HD, 0, K, s_x, s_w, False, IEEE,
                       BLOCK_M, BLOCK_N, BLOCK_K, STAGES)
    pdl_release(PDL)
    if HAS_BIAS:
        acc += bias.to(tl.float32)[None, :]
    y = acc.to(dt).to(tl.float32)  # the bf16 [q | k | v] rope_store would read
    a, b = tl.split(tl.permute(tl.reshape(y, [BLOCK_M, 2, PAIRS]), [0, 2, 1]))
    c, s = c.to(tl.float32), s.to(tl.float32)
    r1 = rotate_at(a, -b, c, s, dt).to(dt)
    r2 = rotate_at(b, a, c, s, dt).to(dt)
    ok = m_ok[:, None] & p_ok[None, :]
    is_q = (head < NQ)[None, :]
    is_k = ((head >= NQ) & (head < NQ + NKV))[None, :]
    is_v = (head >= NQ + NKV)[None, :]
    qp = q_ptr + rm.to(tl.int64)[:, None] * s_q + (head * HD + i)[None, :]
    tl.store(qp, r1, mask=ok & is_q)
    tl.store(qp + half, r2, mask=ok & is_q)
    at = slot.to(tl.int64)[:, None]
    col = pos.to(tl.int64)[:, None]
    kp = k_ptr + at * s_ks + (head - NQ).to(tl.int64)[None, :] * s_kh + col * s_kl + i[None, :]
    tl.store(kp, r1, mask=ok & is_k)
    tl.store(kp + half, r2, mask=ok & is_k)
    vp = (v_ptr + at * s_vs + (head - NQ - NKV).to(tl.int64)[None, :] * s_vh + col * s_vl
          + i[None, :])
    tl.store(vp, a.to(dt), mask=ok & is_v)
    tl.store(vp + half, b.to(dt), mask=ok & is_v)


def qkv_rope(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
             positions: torch.Tensor, inv_freq: torch.Tensor, keys: torch.Tensor,
             values: torch.Tensor, rows: torch.Tensor, num_q_heads: int, scale: float = 1.0,
             *, pdl: bool = False, prefetch: int = 0) -> torch.Tensor:
    """Kernel form of :func:`qkv_rope_reference` (same arguments, effect and result), one
    launch, with ``decode_linear``'s launch sizes for the weight (whole ``K`` a program, also
    where that launch would split it). ``pdl``, ``prefetch``: as ``decode_linear``'s.

    ``x``, ``weight``, the caches: one dtype, bf16 or fp16 (fp32 under Triton's interpreter
    only); contiguous rows; ``inv_freq: [hd / 2] float32``; ``positions, rows: [R] int64``
    (trusted, as ``rope_store``'s).
    """
    s: dict[str, int] = {}
    nq = int(num_q_heads)
    dtypes = FLOAT_DTYPES if interpreted() else (torch.bfloat16, torch.float16)
    check_tensor("x", x, ("R", "K"), dtypes, s, unit_stride=True)
    check_tensor("keys", keys, ("S", "nkv", "L", "hd"), x.dtype, s, x.device, unit_stride=True)
    check_tensor("values", values, ("S", "nkv", "L", "hd"), x.dtype, s, x.device,
                 unit_stride=True)
    hd, nkv = s["hd"], s["nkv"]
    if hd % 2 or nq < 1:
        raise ShapeError(f"qkv_rope needs heads of an even width and at least one query head, "
                         f"got width {hd}, {nq} query heads")
    n = (nq + 2 * nkv) * hd
    check_tensor("weight", weight, (n, "K"), x.dtype, s, x.device, unit_stride=True)
    if bias is not None:
        check_tensor("bias", bias, (n,), x.dtype, device=x.device)
    check_tensor("positions", positions, ("R",), _I64, s, x.device)
    check_tensor("rows", rows, ("R",), _I64, s, x.device)
    check_tensor("inv_freq", inv_freq, (hd // 2,), torch.float32, device=x.device,
                 contiguous=True)
    q = torch.empty(s["R"], nq * hd, dtype=x.dtype, device=x.device)
    if s["R"] == 0:
        return q
    b = decode_linear_blocks(n, s["K"], x.dtype)
    on = pdl_on(pdl, x)
    line = max(1, 128 // x.element_size())
    _qkv_rope_kernel[(triton.cdiv(s["R"], BLOCK_M), triton.cdiv(n, b.block_n))](
        x, weight, or_dummy(bias, weight), q, positions.contiguous(), inv_freq,
        keys, values, rows.contiguous(), s["R"], s["K"], nq, nkv, hd, float(scale),
        x.stride(0), weight.stride(0), q.stride(0), keys.stride(0), keys.stride(1),
        keys.stride(2), values.stride(0), values.stride(1), values.stride(2),
        HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32, BLOCK_M=BLOCK_M,
        BLOCK_N=b.block_n, BLOCK_K=b.block_k, STAGES=b.num_stages, PDL=on,
        PF_TILES=max(0, int(prefetch)) if on else 0, PF_LINES=max(1, b.block_k // line),
        PF_LINE=line, num_warps=b.num_warps, num_stages=b.num_stages,
        enable_fp_fusion=False,  # no FMA: the rotation's products round as rope_store's
        **pdl_kwargs(on))
    return q


__all__ = ["qkv_rope", "qkv_rope_reference"]
