"""Absorbed multi-head latent attention (MLA) of a drafter block over its paged latent context
plus the block itself, in one launch, beside its reference.

With the key up-projection absorbed into the queries, MLA is multi-query attention with one KV
"head": every key is a latent row ``[kv_lora | d_rope]`` (``D_lat`` wide; the context's read
straight from the paged pool through the block table, the block's own given), every value is
its first ``kv_lora`` dims, and head ``h``'s query is ``[q_nope @ W_kb[h] ; rope(q_rope)]``. The
kernel also applies the queries' interleaved RoPE, the absorption ``q_nope @ W_kb`` and the
value up-projection ``W_vb``, so it maps the ``q_b_proj`` output to each head's values for
``o_proj``. In eager torch this is a gather of the context, a mask, two concatenations, four
einsums, a softmax and their casts: about twenty launches per layer inside a captured round.
Given ``own_norm`` it also norms and rotates the block's own raw latent rows, which is
``latent_norm_rope``'s launch otherwise.
Block queries see context columns ``0 .. num_ctx - 1`` and the whole block (non-causal, no
window). Imports ``draftsmith.contract``, ``kernels.block_attention`` (the paged column map),
``kernels.latent_norm_rope`` (the RoPE reference), the shared softmax step and launch helpers.

Numerics: the absorbed query, the rotated query and the attention output round to the input
dtype where the reference rounds them; softmax is computed online in fp32 over tiles (the
reference's is one pass) and, in half precision, the probabilities are rounded to the input
dtype before they weight the values (the reference keeps them fp32), so outputs differ from the
reference by fp32 rounding in fp32 and by about one half-precision rounding otherwise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels import pdl_on
from draftsmith.kernels._launch import block_size, pdl_kwargs, pdl_start
from draftsmith.kernels._softmax import _dot, _online_softmax
from draftsmith.kernels.block_attention import paged_columns
from draftsmith.kernels.latent_norm_rope import (
    interleaved_rope_reference,
    latent_norm_rope_reference,
)

_I64 = torch.int64

OWN_NORM_MAX_WIDTH = 128
"""The widest latent tile (``D_lat`` rounded up to a power of two) whose launch also norms and
rotates the block's own latents: at 256 and above the sm_90 build of that variant spills
registers (ptxas, Triton 3.6; none without it at 256 and 512), so the caller keeps the separate
``latent_norm_rope`` launch there."""


def own_norm_inside(d_lat: int) -> bool:
    """Whether :func:`mla_attention` should take ``own_norm`` for latent rows of ``d_lat``
    dims (see :data:`OWN_NORM_MAX_WIDTH`)."""
    return block_size(d_lat, lo=16) <= OWN_NORM_MAX_WIDTH


def mla_attention_reference(
    q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, latent: torch.Tensor,
    kv_b: torch.Tensor, pool: torch.Tensor, block_tables: torch.Tensor, num_ctx: torch.Tensor,
    columns: int, scale: float, *, own_norm: tuple[torch.Tensor, float] | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """Absorbed MLA of a block over its paged latent context and itself (``pdl``, the kernel
    form's launch option, is accepted and ignored).

    ``q: [G, W, n, d_nope + d_rope]`` this rank's heads' queries (``q_b_proj`` output, the rope
    slice not yet rotated); ``cos, sin: [G, W, d_rope]`` at the block positions (Hugging Face
    halves layout); ``latent: [G, W, D_lat]`` the block's own latents (normed and rotated);
    ``kv_b: [n, d_nope + d_v, kv_lora]`` the heads' ``kv_b_proj`` rows (``W_kb`` then ``W_vb``);
    ``pool: [pages, 1, 1, P_sz, D_lat]`` one layer's paged latents; ``block_tables: [G,
    max_pages] int64``; ``num_ctx: [G] int64`` context columns held (at most ``columns`` are
    read). Returns ``probs @ latent[:, :kv_lora]`` mapped by ``W_vb``: ``[G, W, n, d_v]`` in
    ``q``'s dtype.

    ``own_norm = (weight [kv_lora], eps)``: ``latent`` holds the block's raw latent rows, which
    are first normed and rotated as :func:`latent_norm_rope_reference` does.
    """
    g, w, _, qk = q.shape
    kv_lora = kv_b.shape[2]
    d_rope = latent.shape[-1] - kv_lora
    d_nope = qk - d_rope
    if own_norm is not None:
        rows = latent.reshape(g * w, 1, latent.shape[-1])
        latent = latent_norm_rope_reference(rows, own_norm[0], own_norm[1],
                                            cos.reshape(g * w, -1),
                                            sin.reshape(g * w, -1)).view(latent.shape)
    q_nope, q_rope = q.split((d_nope, d_rope), dim=-1)
    q_rope = interleaved_rope_reference(q_rope, cos, sin)
    w_kb, w_vb = kv_b[:, :d_nope], kv_b[:, d_nope:]
    query = torch.cat((torch.einsum("gwhd,hdc->gwhc", q_nope, w_kb), q_rope), dim=-1)

    pages, offsets, valid = paged_columns(block_tables, num_ctx, columns, pool.shape[3])
    ctx = pool[pages, 0, 0, offsets].to(q.dtype)  # [G, C, D_lat]
    # Columns past num_ctx hold whatever the page holds (maybe NaN): zero them, then mask.
    ctx = ctx.masked_fill(~valid[..., None], 0)
    keys = torch.cat((ctx, latent), dim=1)  # [G, C + W, D_lat]
    visible = torch.cat((valid, torch.ones(g, w, dtype=torch.bool, device=q.device)), dim=1)
    scores = torch.einsum("gwhc,gtc->gwht", query.float(), keys.float()) * scale
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out_latent = torch.einsum("gwht,gtc->gwhc", probs, keys[..., :kv_lora].float())
    return torch.einsum("gwhc,hvc->gwhv", out_latent.to(q.dtype), w_vb)


@triton.jit
def _mla_attention_kernel(
    q_ptr, cos_ptr, sin_ptr, lat_ptr, kvb_ptr, pool_ptr, tables_ptr, nctx_ptr, out_ptr, nw_ptr,
    W, D_NOPE, KV_LORA, D_LAT, D_V, COLUMNS, PAGE, MAX_PAGES, scale, eps,
    s_qg, s_qw, s_qh, s_cg, s_cw, s_lg, s_lw, s_kh, s_kr, s_page, s_off, s_tg,
    s_og, s_ow, s_oh,
    IEEE: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, NORM_OWN: tl.constexpr, PDL: tl.constexpr,
):
    """Program ``(b, h)``: the ``W`` block queries of head ``h`` of request ``b``.

    The query is built as one ``[W, D_lat]`` tile: columns below ``KV_LORA`` hold
    ``q_nope @ W_kb``, the rest the rotated rope slice, so one product against a latent tile
    scores all of it, and the same tile serves as the values (its rope columns are dropped
    before ``W_vb``).

    ``NORM_OWN``: the block's own latent rows arrive raw; the program norms their first
    ``KV_LORA`` dims (weight ``nw_ptr``) and turns their rope pairs with the queries' cos and
    sin, rounding where ``latent_norm_rope`` rounds (one launch less a layer)."""
    pdl_start(PDL, True)
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    dt = q_ptr.dtype.element_ty
    w = tl.arange(0, BLOCK_W)
    w_ok = w < W
    d = tl.arange(0, BLOCK_D)
    lat_ok = d < D_LAT
    lora = d < KV_LORA
    rope = lat_ok & (d >= KV_LORA)
    q_row = q_ptr + b * s_qg + w * s_qw + h * s_qh
    kvb_head = kvb_ptr + h * s_kh

    # the absorbed query q_nope @ W_kb, rounded to the dtype as the reference's einsum
    q_abs = tl.zeros([BLOCK_W, BLOCK_D], tl.float32)
    for k0 in range(0, D_NOPE, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < D_NOPE
        q_nope = tl.load(q_row[:, None] + k[None, :], mask=w_ok[:, None] & k_ok[None, :],
                         other=0.0)
        w_kb = tl.load(kvb_head + k[:, None] * s_kr + d[None, :],
                       mask=k_ok[:, None] & lora[None, :], other=0.0)
        q_abs += _dot(q_nope, w_kb, IEEE)
    # interleaved RoPE of the rope slice: rope column j pairs with j ^ 1 and turns by pair j // 2
    j = tl.where(rope, d - KV_LORA, 0)
    partner = j + 1 - 2 * (j % 2)
    r_ok = w_ok[:, None] & rope[None, :]
    x = tl.load(q_row[:, None] + D_NOPE + j[None, :], mask=r_ok, other=0.0).to(tl.float32)
    xp = tl.load(q_row[:, None] + D_NOPE + partner[None, :], mask=r_ok, other=0.0).to(tl.float32)
    trig = b * s_cg + w[:, None] * s_cw + (j // 2)[None, :]
    c = tl.load(cos_ptr + trig, mask=r_ok, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + trig, mask=r_ok, other=0.0).to(tl.float32)
    # each product rounded to the dtype, then the sum: x c - x' s (even j), x' s + x c (odd j)
    t_c = (x * c).to(dt).to(tl.float32)
    t_s = (xp * s).to(dt).to(tl.float32)
    q_rot = tl.where((j % 2 == 0)[None, :], t_c - t_s, t_c + t_s)
    query = tl.where(rope[None, :], q_rot.to(dt), q_abs.to(dt))

    qk_scale = scale * 1.4426950408889634  # softmax in base 2
    m_i = tl.full([BLOCK_W], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_W], tl.float32)
    acc = tl.zeros([BLOCK_W, BLOCK_D], tl.float32)
    n_ctx = tl.minimum(tl.load(nctx_ptr + b), COLUMNS)
    for n0 in range(0, n_ctx, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        c_ok = cols < n_ctx
        page_idx = tl.minimum(cols // PAGE, MAX_PAGES - 1)
        page = tl.load(tables_ptr + b * s_tg + page_idx, mask=c_ok, other=0)
        where = pool_ptr + page * s_page + (cols % PAGE).to(tl.int64) * s_off
        keys = tl.load(where[:, None] + d[None, :], mask=c_ok[:, None] & lat_ok[None, :],
                       other=0.0)
        ok = w_ok[:, None] & c_ok[None, :]
        m_i, l_i, acc = _online_softmax(query, keys, keys, ok, m_i, l_i, acc, qk_scale, IEEE)
    # the block's own latents
    own_row = lat_ptr + b * s_lg + w[:, None] * s_lw
    own = tl.load(own_row + d[None, :], mask=w_ok[:, None] & lat_ok[None, :], other=0.0)
    if NORM_OWN:
        h32 = tl.where(lora[None, :], own.to(tl.float32), 0.0)
        inv = 1.0 / tl.sqrt(tl.sum(h32 * h32, axis=1) / KV_LORA + eps)
        y = (h32 * inv[:, None]).to(dt).to(tl.float32)
        nw = tl.load(nw_ptr + d, mask=lora, other=0.0).to(tl.float32)
        normed = (nw[None, :] * y).to(dt)
        own_p = tl.load(own_row + KV_LORA + partner[None, :], mask=r_ok, other=0.0)
        o_c = (own.to(tl.float32) * c).to(dt).to(tl.float32)
        o_s = (own_p.to(tl.float32) * s).to(dt).to(tl.float32)
        turned = tl.where((j % 2 == 0)[None, :], o_c - o_s, o_c + o_s).to(dt)
        own = tl.where(lora[None, :], normed, tl.where(r_ok, turned, tl.zeros_like(normed)))
    ok = w_ok[:, None] & w_ok[None, :]
    m_i, l_i, acc = _online_softmax(query, own, own, ok, m_i, l_i, acc, qk_scale, IEEE)

    out_latent = acc / tl.maximum(l_i, 1.0e-30)[:, None]
    out_latent = tl.where(lora[None, :], out_latent, 0.0).to(dt)  # values: the kv_lora dims
    out_row = out_ptr + b * s_og + w * s_ow + h * s_oh
    for v0 in range(0, D_V, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V)
        v_ok = v < D_V
        w_vb = tl.load(kvb_head + (D_NOPE + v)[None, :] * s_kr + d[:, None],
                       mask=lora[:, None] & v_ok[None, :], other=0.0)
        o = _dot(out_latent, w_vb, IEEE)
        tl.store(out_row[:, None] + v[None, :], o.to(dt), mask=w_ok[:, None] & v_ok[None, :])


def _launch_sizes(w: int, d_lat: int, d_nope: int, d_v: int) -> dict[str, int]:
    """Block sizes: the whole block and a latent row per tile (every ``tl.dot`` side at least
    16); the ``W_kb`` and ``W_vb`` tiles narrow as the latent widens, to stay in registers.

    Context tiles hold ``16384 / BLOCK_D`` columns (32 to 256): each tile of the context loop
    costs a few microseconds of latency whatever its width, so a launch over a drafter's
    context takes few of them. Measured on an H100 (``docs/benchmarks.md``, a block of 7 over
    160 context columns): a 40-wide latent 18.9 -> 7.2 us at 256 columns a tile (64 before), a
    72-wide one 207 -> 10.4 us at 128, DeepSeek's 576-wide one 83 -> 72 us at 32 (16 before);
    two stages in flight."""
    block_d = block_size(d_lat, lo=16)
    return dict(
        BLOCK_W=block_size(w, lo=16), BLOCK_D=block_d,
        BLOCK_N=max(32, min(256, 16384 // block_d)),
        BLOCK_K=max(16, min(block_size(d_nope), 4096 // block_d)),
        BLOCK_V=max(16, min(block_size(d_v), 4096 // block_d)),
        num_warps=8 if block_d >= 512 else 4,
        num_stages=2,
    )


def mla_attention(
    q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, latent: torch.Tensor,
    kv_b: torch.Tensor, pool: torch.Tensor, block_tables: torch.Tensor, num_ctx: torch.Tensor,
    columns: int, scale: float, *, own_norm: tuple[torch.Tensor, float] | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """Kernel form of :func:`mla_attention_reference` (same arguments; ``[G, W, n, d_v]`` in
    ``q``'s dtype), one launch; every tensor needs a contiguous last dim, and ``q``, ``cos``,
    ``sin``, ``latent``, ``kv_b`` and ``own_norm``'s weight one dtype. ``latent`` may be a
    row-strided view (the raw rows inside a packed product's output, with ``own_norm``). The
    normed dims of the own latents may differ from :func:`latent_norm_rope`'s by one rounding of
    the dtype (the mean of squares sums in another order). Reads nothing back to the host.
    ``pdl``: launch with programmatic dependent launch where the device has it
    (:func:`~draftsmith.kernels.pdl_on`)."""
    s: dict[str, int] = {}
    check_tensor("q", q, ("G", "W", "n", "qk"), FLOAT_DTYPES, s, unit_stride=True)
    check_tensor("latent", latent, ("G", "W", "D_lat"), q.dtype, s, q.device, unit_stride=True)
    check_tensor("kv_b", kv_b, ("n", None, "kv_lora"), q.dtype, s, q.device, unit_stride=True)
    d_rope = s["D_lat"] - s["kv_lora"]
    d_nope = s["qk"] - d_rope
    d_v = int(kv_b.shape[1]) - d_nope
    if d_rope < 2 or d_rope % 2 or d_nope < 1 or d_v < 1:
        raise ShapeError(
            f"latent rows of {s['D_lat']} dims, kv_b {tuple(kv_b.shape)} and queries of {s['qk']} "
            f"dims leave d_rope = {d_rope} (even, >= 2), d_nope = {d_nope} and d_v = {d_v} "
            "(each >= 1)")
    check_tensor("cos", cos, ("G", "W", d_rope), q.dtype, s, q.device, unit_stride=True)
    check_tensor("sin", sin, ("G", "W", d_rope), q.dtype, s, q.device, unit_stride=True)
    check_tensor("pool", pool, ("pages", 1, 1, "P_sz", "D_lat"), FLOAT_DTYPES, s, q.device,
                 unit_stride=True)
    check_tensor("block_tables", block_tables, ("G", "max_pages"), _I64, s, q.device,
                 unit_stride=True)
    check_tensor("num_ctx", num_ctx, ("G",), _I64, s, q.device)
    norm_weight = None
    if own_norm is not None:
        norm_weight = check_tensor("own_norm weight", own_norm[0], ("kv_lora",), q.dtype, s,
                                   q.device, contiguous=True)
    if sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    g, w, n = s["G"], s["W"], s["n"]
    out = torch.empty(g, w, n, d_v, dtype=q.dtype, device=q.device)
    if g == 0 or n == 0 or w == 0:
        return out
    on = pdl_on(pdl, q)
    _mla_attention_kernel[(g, n)](
        q, cos, sin, latent, kv_b, pool, block_tables, num_ctx, out,
        kv_b if norm_weight is None else norm_weight,
        w, d_nope, s["kv_lora"], s["D_lat"], d_v, int(columns), s["P_sz"], s["max_pages"],
        float(scale), 0.0 if own_norm is None else float(own_norm[1]),
        q.stride(0), q.stride(1), q.stride(2), cos.stride(0), cos.stride(1),
        latent.stride(0), latent.stride(1), kv_b.stride(0), kv_b.stride(1),
        pool.stride(0), pool.stride(3), block_tables.stride(0),
        out.stride(0), out.stride(1), out.stride(2),
        IEEE=q.dtype == torch.float32, **_launch_sizes(w, s["D_lat"], d_nope, d_v),
        NORM_OWN=own_norm is not None, PDL=on,
        enable_fp_fusion=False,  # no FMA: the query's rotation rounds as the reference's
        **pdl_kwargs(on),
    )
    return out


__all__ = ["OWN_NORM_MAX_WIDTH", "mla_attention", "mla_attention_reference", "own_norm_inside"]
