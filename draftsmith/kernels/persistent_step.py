"""The few-row decoding step of a Llama / Qwen3 decoder as one persistent launch (Gluon, sm_90): every layer's
products, norms, RoPE, attention, SiLU x up and residual adds, one program an SM. The kernel can also run an LM
head's items after the last layer (``step_items(head=True)``); :class:`StepRunner` never asks for them, since
draftsmith's fp32 head follows the step.

The target's layer loop runs it as ``target.few_rows = step`` (:class:`StepRunner`, from
``draftsmith.runtime.targets.hf_layers``; ``docs/decoding.md`` says what it takes). Imports torch and triton (Gluon)
only.

Work is cut into items of 16 output rows of one product over the whole input (``[q | k | v]``, ``o``, ``[gate | up]``
with 8 gate and the 8 matching up rows, ``down``, the head), dealt round-robin to the programs in layer order. A
program's loader warp streams each item's weight tiles ``[64, 128]`` (the item's rows for each quarter of the input,
eight TMA boxes ``[16, 64]`` read straight from row-major weights) into a ring in shared memory; its compute warpgroup
multiplies them by X ``[(quarter, row), K / 4]`` on wgmma after waiting for the product X comes from (an acquire count
a product); its storer warp sums the four quarters, applies the epilogue (SiLU x up, the residual add) and releases the
count once the program's last item of that product is stored. The first ``o`` items of a layer carry the attention:
a duty a (key/value head, split of the context) for every row, one combining duty a row; the splits holding the
step's own positions write their keys and values into the cache first. At eight rows ``down``'s X is
streamed in 512-column chunks through two buffers.

Glossary: ``R`` rows of the step (one request's consecutive tokens, 1 to 8), ``RP`` rows padded (2 or 8), ``L``
layers, ``D`` hidden size, ``NQKV = (NH + 2 NKV) HD``, ``F`` intermediate size, ``V`` vocabulary, ``T = CTX + 16``
positions a cache row holds. Tensors: ``hs [2L + 1, RP, D]`` (slot 0 unused: the first layer reads the embedding rows;
``2l + 1`` after layer l's ``o``, ``2l + 2`` after its ``down``: the drafter's features), ``qkv [L, RP, NQKV]``,
``m [L, RP, F]``, ``z [L, RP, D]``, ``ap [L, NKV, APN, (512 / HD) (HD + 2)]`` fp32 attention partials,
``cs [16, HD]`` fp32 cos / sin of each row's position (halves), ``gamma [4L + 1, D]`` norms (``2l`` input, ``2l + 1``
post-attention, ``2L`` final, ``2L + 1 + 2l`` / ``+ 2`` Qwen3's q / k norms in the first ``HD`` columns),
``kc, vc`` int64 ``[L]`` addresses of each layer's cache row ``[NKV, T, HD]`` of the request's slot, ``done`` int32
counts, ``err`` int32 ``[spin timeouts, the context length, arrivals, launches]``. Weights: ``WD [L (NQKV + D + 2F) + V,
D]`` (each layer's ``[q | k | v]``, ``o``, gate, up rows, then the head's table), ``WF [L D, F]`` (``down``).

Numerics: bf16 storage, fp32 sums in a fixed order per row whatever the row count: the products' by construction,
attention's because its splits are fixed blocks of positions (not a share of the context) and a step's own keys are
written into the cache and read back with the rest, each row masked at its own position, so row r of a step has the
bits of a step of that token alone. RoPE with fp32 cos / sin, rounded once (draftsmith's launches round as
transformers does, so the two paths' bits differ).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

_tbar = getattr(gl, "thread_barrier", None) or gl.barrier  # triton 3.6 / 3.9
_REINT_NEW = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

CHUNKS = gl.constexpr(65536)
"""``done``: counts ``[0, 4L + 1)`` a product; ``CHUNKS + 64 p + c`` product p's 512-column
chunk c; ``2 CHUNKS + ABN l`` layer l's attention counts."""
ABN = gl.constexpr(256)
"""A layer's attention counts: ``+ 32 + g`` key/value head g's duties done, ``+ 224 + c`` z's
chunk c's rows combined."""
APN = gl.constexpr(128)
"""Attention partials a (layer, key/value head): rows x splits."""
MMA8 = gl.constexpr(
    gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4, 1], instr_shape=[16, 8])
)
A8 = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=MMA8.value, k_width=2))
B8 = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=MMA8.value, k_width=2))
BL8 = gl.constexpr(gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0]))


@gluon.jit
def _decode(
    item,
    C0: gl.constexpr,
    C1: gl.constexpr,
    C2: gl.constexpr,
    C3: gl.constexpr,
    T0: gl.constexpr,
    T1: gl.constexpr,
    T2: gl.constexpr,
    T3: gl.constexpr,
    NLAYERS: gl.constexpr,
):
    """layer, product (0 qkv, 1 o, 2 g|u, 3 down, 4 the head after the last layer), item within the
    product, its tiles, its first tile, and the items of the product before it."""
    E0: gl.constexpr = C0
    E1: gl.constexpr = E0 + C1
    E2: gl.constexpr = E1 + C2
    IPL: gl.constexpr = E2 + C3
    B1: gl.constexpr = C0 * T0
    B2: gl.constexpr = B1 + C1 * T1
    B3: gl.constexpr = B2 + C2 * T2
    TPL: gl.constexpr = B3 + C3 * T3
    l = gl.minimum(item // IPL, NLAYERS)
    h = (l == NLAYERS).to(gl.int32)
    r = item - l * IPL
    a0 = (r >= E0).to(gl.int32)
    a1 = (r >= E1).to(gl.int32)
    a2 = (r >= E2).to(gl.int32)
    k = (a0 + a1 + a2) * (1 - h) + 4 * h
    j = (r - (a0 * E0 + a1 * (E1 - E0) + a2 * (E2 - E1))) * (1 - h) + r * h
    KT = (T0 + a0 * (T1 - T0) + a1 * (T2 - T1) + a2 * (T3 - T2)) * (1 - h) + T0 * h
    tile0 = l * TPL + (a0 * B1 + a1 * (B2 - B1) + a2 * (B3 - B2)) * (1 - h) + j * KT
    need = (C3 + a0 * (C0 - C3) + a1 * (C1 - C0) + a2 * (C2 - C1)) * (1 - h) + C3 * h
    return l, k, j, KT, tile0, need


@gluon.jit
def _ld_acquire(ptr):
    return gl.inline_asm_elementwise(
        "ld.global.acquire.gpu.b32 $0, [$1];", "=r,l", [ptr], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def _spin4(ptr, need, err_ptr, limit):
    """Waits until the four counts at ptr .. ptr + 3 all reach need (one round trip a poll)."""
    i4 = gl.arange(0, 4, layout=gl.BlockedLayout([1], [32], [4], [0]))
    f = gl.min(_ld_acquire(ptr + i4), axis=0)
    spins = 0
    while (f < need) & (spins < limit):
        f = gl.min(_ld_acquire(ptr + i4), axis=0)
        spins += 1
    if f < need:
        gl.atomic_add(err_ptr, 1)


@gluon.jit
def _spin_duty8(cb0, g, err_ptr, limit, NH: gl.constexpr, NKV: gl.constexpr, HD: gl.constexpr):
    """Wait for key/value head g's query, key and value chunks of [q | k | v] (one poll a round
    trip for the three)."""
    GQ: gl.constexpr = NH // NKV
    QCH: gl.constexpr = NH * HD // 512
    KVCH: gl.constexpr = NKV * HD // 512
    gl.static_assert(512 % (GQ * HD) == 0)
    qc = (g * GQ * HD) // 512
    kc = (g * HD) // 512
    i4 = gl.arange(0, 4, layout=gl.BlockedLayout([1], [32], [4], [0]))
    off = gl.where(i4 == 0, qc, gl.where(i4 == 1, QCH + kc, QCH + KVCH + kc))
    f = gl.min(_ld_acquire(cb0 + off), axis=0)
    spins = 0
    while (f < 32) & (spins < limit):
        f = gl.min(_ld_acquire(cb0 + off), axis=0)
        spins += 1
    if f < 32:
        gl.atomic_add(err_ptr, 1)


@gluon.jit
def _split8(c2, ctx, R: gl.constexpr, NSPL: gl.constexpr, TB8: gl.constexpr):
    """Split c2's positions [lo, hi): the TB8 positions from c2 * TB8 whatever the context (the
    last split also every position after its block), cut at the step's last row ctx + R. Fixed
    bounds give a row the same blocks, in the same order, at any row count."""
    lo = c2 * TB8
    hi = gl.minimum(lo + TB8, ctx + R)
    if c2 == NSPL - 1:
        hi = ctx + R
    return lo, hi


@gluon.jit
def _cache_at(c_ptr, l, g, NKV: gl.constexpr, T: gl.constexpr, HD: gl.constexpr):
    """Layer l's key / value head g in the cache: [T, HD] rows, from the layer's slot-row address in the table c_ptr."""
    base = gl.load(c_ptr + l).to(gl.pointer_type(gl.bfloat16), bitcast=True)
    return base + g * (T * HD)


@gluon.jit
def _kv_block8(
    kc_ptr,
    vc_ptr,
    l,
    g,
    lo,
    hi,
    R: gl.constexpr,
    NKV: gl.constexpr,
    HD: gl.constexpr,
    CTX: gl.constexpr,
    TB8: gl.constexpr,
):
    """Cached positions lo .. lo + TB8 (those below hi) of key/value head g: keys transposed ([HH, TB8] halves) and
    values ([TB8, HH] halves), bf16, in mma_v2's B operand layout."""
    HH: gl.constexpr = HD // 2
    T: gl.constexpr = CTX + 16
    t = gl.arange(0, TB8, layout=gl.SliceLayout(1, BL8))
    d = gl.arange(0, HH, layout=gl.SliceLayout(0, BL8))
    msk = ((lo + t)[:, None] < hi) & (d[None, :] < HH)
    o = (lo + t)[:, None] * HD + d[None, :]
    kb = _cache_at(kc_ptr, l, g, NKV, T, HD)
    vb = _cache_at(vc_ptr, l, g, NKV, T, HD)
    k1 = gl.load(kb + o, mask=msk, other=0.0)
    k2 = gl.load(kb + o + HH, mask=msk, other=0.0)
    v1 = gl.load(vb + o, mask=msk, other=0.0)
    v2 = gl.load(vb + o + HH, mask=msk, other=0.0)
    return (
        gl.convert_layout(gl.permute(k1, (1, 0)), B8),
        gl.convert_layout(gl.permute(k2, (1, 0)), B8),
        gl.convert_layout(v1, B8),
        gl.convert_layout(v2, B8),
    )


@gluon.jit
def _attn_combine8(
    ap_ptr,
    z_ptr,
    l,
    g,
    r,
    RP: gl.constexpr,
    NH: gl.constexpr,
    NKV: gl.constexpr,
    HD: gl.constexpr,
    NSPL: gl.constexpr,
):
    """z columns of key/value head g's query heads, row r, from its NSPL splits at ap[l, g], in
    split order."""
    HPC: gl.constexpr = 512 // HD
    GQ: gl.constexpr = NH // NKV
    NSP: gl.constexpr = triton.next_power_of_2(NSPL)
    C3: gl.constexpr = gl.BlockedLayout(
        [1, 1, 4], [1, 2, 16], [4, 1, 1], [2, 1, 0]
    )  # [GQ, NSP, HD]
    ML: gl.constexpr = gl.SliceLayout(2, C3)
    ZL: gl.constexpr = gl.SliceLayout(1, C3)
    APS: gl.constexpr = HPC * (HD + 2)
    base = ap_ptr + ((l * NKV + g) * APN + r * NSPL) * APS
    mh = gl.arange(0, GQ, layout=gl.SliceLayout(1, ML))
    mc = gl.arange(0, NSP, layout=gl.SliceLayout(0, ML))
    mo = base + mc[None, :] * APS + mh[:, None] * (HD + 2) + HD
    mmask = (mc[None, :] < NSPL) & (mh[:, None] < GQ)
    mv = gl.load(mo, mask=mmask, other=-1.0e30, cache_modifier=".cg")
    lv = gl.load(mo + 1, mask=mmask, other=0.0, cache_modifier=".cg")
    M = gl.max(mv, axis=1)
    w = gl.exp(mv - M[:, None])
    Ls = gl.sum(w * lv, axis=1)
    a3h = gl.arange(0, GQ, layout=gl.SliceLayout(1, gl.SliceLayout(2, C3)))
    a3c = gl.arange(0, NSP, layout=gl.SliceLayout(0, gl.SliceLayout(2, C3)))
    a3d = gl.arange(0, HD, layout=gl.SliceLayout(0, gl.SliceLayout(1, C3)))
    ao = base + a3c[None, :, None] * APS + a3h[:, None, None] * (HD + 2) + a3d[None, None, :]
    amask = (a3c[None, :, None] < NSPL) & (a3h[:, None, None] < GQ) & (a3d[None, None, :] < HD)
    av = gl.load(ao, mask=amask, other=0.0, cache_modifier=".cg")
    zacc = gl.sum(w[:, :, None] * av, axis=1)
    zi = gl.convert_layout(Ls, gl.SliceLayout(1, ZL))[:, None]
    zh = gl.arange(0, GQ, layout=gl.SliceLayout(1, ZL))
    zd = gl.arange(0, HD, layout=gl.SliceLayout(0, ZL))
    gl.store(
        z_ptr + l * (RP * NH * HD) + r * (NH * HD) + (g * GQ + zh)[:, None] * HD + zd[None, :],
        (zacc / zi).to(gl.bfloat16),
    )


@gluon.jit
def _nopack_tile(
    d16, d8, df, ring, bar, s, l, k, j, kt, D: gl.constexpr, NQKV: gl.constexpr, F: gl.constexpr
):
    """Ring tile s (rows (quarter, output row), 128 columns) of item (l, k, j) from the row-major
    weights: quarter q's 16 rows at input columns q * K/4 + kt * 128, in two 64-column boxes a
    quarter (the [64, 128] slot is two [64, 64] halves)."""
    L64: gl.constexpr = d16.layout
    NS: gl.constexpr = ring.shape[0]
    if _REINT_NEW:
        rh = ring.reinterpret(gl.bfloat16, [NS * 2, 64, 64], L64)
    else:
        rh = ring._reinterpret(gl.bfloat16, [NS * 2, 64, 64], L64)
    LROWS: gl.constexpr = NQKV + D + 2 * F
    if k == 3:
        row = l * D + j * 16
        for q in gl.static_range(4):
            for h in gl.static_range(2):
                _tma_load(
                    df,
                    [row, q * (F // 4) + kt * 128 + h * 64],
                    bar,
                    rh.index(2 * s + h).slice(16 * q, 16, 0),
                )
    elif k == 2:
        row = l * LROWS + NQKV + D + j * 8
        for q in gl.static_range(4):
            for h in gl.static_range(2):
                col = q * (D // 4) + kt * 128 + h * 64
                _tma_load(d8, [row, col], bar, rh.index(2 * s + h).slice(16 * q, 8, 0))
                _tma_load(d8, [row + F, col], bar, rh.index(2 * s + h).slice(16 * q + 8, 8, 0))
    else:
        row = l * LROWS + j * 16 + (k == 1).to(gl.int32) * NQKV
        for q in gl.static_range(4):
            for h in gl.static_range(2):
                _tma_load(
                    d16,
                    [row, q * (D // 4) + kt * 128 + h * 64],
                    bar,
                    rh.index(2 * s + h).slice(16 * q, 16, 0),
                )


@gluon.jit
def _reset_counts(done_ptr, err_ptr, SPIN: gl.constexpr, NLAYERS: gl.constexpr):
    """After this program's work, wait for the launch's other programs, then zero this program's
    share of the counts the step uses ([0, 4L + 1), CHUNKS + [0, 64 (4L + 1)), 2 CHUNKS + [0, L ABN));
    the last program to arrive advances the launch number. err[2] counts arrivals over every launch
    (int32, compared wrap-safe), err[3] the launches."""
    pid = gl.program_id(0)
    G = gl.num_programs(0)
    gen = gl.load(err_ptr + 3)
    arrived = gl.atomic_add(err_ptr + 2, 1, sem="acq_rel", scope="gpu")
    target = G * (gen + 1)
    f = _ld_acquire(err_ptr + 2)
    spins = 0
    while ((f - target) < 0) & (spins < SPIN):
        f = _ld_acquire(err_ptr + 2)
        spins += 1
    if (f - target) < 0:
        gl.atomic_add(err_ptr, 1)
    lane = gl.arange(0, 128, layout=gl.BlockedLayout([1], [32], [4], [0]))
    zero = gl.zeros([128], gl.int32, gl.BlockedLayout([1], [32], [4], [0]))
    N0: gl.constexpr = 4 * NLAYERS + 1
    N1: gl.constexpr = 64 * (4 * NLAYERS + 1)
    N2: gl.constexpr = NLAYERS * ABN
    for b in range(pid * 128, N1, G * 128):
        gl.store(done_ptr + CHUNKS + b + lane, zero, mask=b + lane < N1)
    for b in range(pid * 128, N2, G * 128):
        gl.store(done_ptr + 2 * CHUNKS + b + lane, zero, mask=b + lane < N2)
    for b in range(pid * 128, N0, G * 128):  # 4L + 1 passes 128 from 32 layers on
        gl.store(done_ptr + b + lane, zero, mask=b + lane < N0)
    if arrived == target - 1:
        gl.store(err_ptr + 3, gen + 1)


@gluon.jit
def _attn_rows8(
    qkvb_ptr,
    kc_ptr,
    vc_ptr,
    k1,
    k2,
    v1,
    v2,
    cs_ptr,
    gamma_ptr,
    eps,
    ap_ptr,
    l,
    g,
    c2,
    ctx,
    R: gl.constexpr,
    RP: gl.constexpr,
    NQKV: gl.constexpr,
    NH: gl.constexpr,
    NKV: gl.constexpr,
    HD: gl.constexpr,
    CTX: gl.constexpr,
    NSPL: gl.constexpr,
    QKN: gl.constexpr,
    NLAYERS: gl.constexpr,
    GROW: gl.constexpr,
    TB8: gl.constexpr,
):
    """After the wait: the partials (max, sum, unnormalised output) of split c2 for every row and
    query head of key/value head g, stored at ap[l, g, r * NSPL + c2] (head hq at hq * (HD + 2)).
    k1 .. v2: the split's first block of positions before the step's rows (loaded before the
    wait). A split holding some of the step's rows writes their keys (normed and rotated here) and
    values into the cache at ctx + r first and reads the block again; the last split's later
    blocks are loaded here. Row r sees the positions up to ctx + r, in the same blocks and order
    as a step of that row alone: its bits do not depend on the step's row count."""
    HH: gl.constexpr = HD // 2
    HPC: gl.constexpr = 512 // HD
    GQ: gl.constexpr = NH // NKV
    gl.static_assert(R * GQ <= 64)
    m_ = gl.arange(0, 64, layout=gl.SliceLayout(1, BL8))
    d = gl.arange(0, HH, layout=gl.SliceLayout(0, BL8))
    rr = m_ // GQ
    hq = m_ % GQ
    rmask = (rr[:, None] < R) & (d[None, :] < HH)
    qa = qkvb_ptr + l * (RP * NQKV) + rr[:, None] * NQKV + (g * GQ + hq)[:, None] * HD + d[None, :]
    q1 = gl.load(qa, mask=rmask, other=0.0, cache_modifier=".cg").to(gl.float32)
    q2 = gl.load(qa + HH, mask=rmask, other=0.0, cache_modifier=".cg").to(gl.float32)
    cq = gl.load(cs_ptr + rr[:, None] * HD + d[None, :], mask=rmask, other=0.0)
    sq = gl.load(cs_ptr + rr[:, None] * HD + HH + d[None, :], mask=rmask, other=0.0)
    if QKN:
        qg = gamma_ptr + (2 * NLAYERS + 1 + 2 * l) * GROW
        rq = gl.rsqrt((gl.sum(q1 * q1, axis=1) + gl.sum(q2 * q2, axis=1)) / HD + eps)[:, None]
        qga = gl.load(qg + d)
        qgb = gl.load(qg + HH + d)
        q1 = (
            ((q1 * rq).to(gl.bfloat16).to(gl.float32) * qga[None, :].to(gl.float32))
            .to(gl.bfloat16)
            .to(gl.float32)
        )
        q2 = (
            ((q2 * rq).to(gl.bfloat16).to(gl.float32) * qgb[None, :].to(gl.float32))
            .to(gl.bfloat16)
            .to(gl.float32)
        )
    a1 = gl.convert_layout((q1 * cq - q2 * sq).to(gl.bfloat16), A8)
    a2 = gl.convert_layout((q2 * cq + q1 * sq).to(gl.bfloat16), A8)
    scale = 1.0 / (HD**0.5)
    sm = gl.arange(0, 64, layout=gl.SliceLayout(1, MMA8))
    st = gl.arange(0, TB8, layout=gl.SliceLayout(0, MMA8))
    lo, hi = _split8(c2, ctx, R, NSPL, TB8)
    last = ctx + sm // GQ  # each row's own position: it sees the positions up to it
    if (hi > ctx) & (hi > lo):
        # the split holds some of the step's rows: their keys normed and rotated at their own
        # angles, written into the cache with their values (each position by the one split
        # holding it), then the split's first block read again with them
        t = gl.arange(0, 16, layout=gl.SliceLayout(1, BL8))
        nm = (t[:, None] < R) & (d[None, :] < HH)
        nb = qkvb_ptr + l * (RP * NQKV) + t[:, None] * NQKV + g * HD + d[None, :]
        x1 = gl.load(nb + NH * HD, mask=nm, other=0.0, cache_modifier=".cg").to(gl.float32)
        x2 = gl.load(nb + NH * HD + HH, mask=nm, other=0.0, cache_modifier=".cg").to(gl.float32)
        if QKN:
            kg = gamma_ptr + (2 * NLAYERS + 2 + 2 * l) * GROW
            kga = gl.load(kg + d)
            kgb = gl.load(kg + HH + d)
            rk = gl.rsqrt((gl.sum(x1 * x1, axis=1) + gl.sum(x2 * x2, axis=1)) / HD + eps)[:, None]
            x1 = (
                ((x1 * rk).to(gl.bfloat16).to(gl.float32) * kga[None, :].to(gl.float32))
                .to(gl.bfloat16)
                .to(gl.float32)
            )
            x2 = (
                ((x2 * rk).to(gl.bfloat16).to(gl.float32) * kgb[None, :].to(gl.float32))
                .to(gl.bfloat16)
                .to(gl.float32)
            )
        cn = gl.load(cs_ptr + t[:, None] * HD + d[None, :], mask=nm, other=0.0)
        sn = gl.load(cs_ptr + t[:, None] * HD + HH + d[None, :], mask=nm, other=0.0)
        vr1 = gl.load(nb + (NH + NKV) * HD, mask=nm, other=0.0, cache_modifier=".cg")
        vr2 = gl.load(nb + (NH + NKV) * HD + HH, mask=nm, other=0.0, cache_modifier=".cg")
        kr1 = (x1 * cn - x2 * sn).to(gl.bfloat16)
        kr2 = (x2 * cn + x1 * sn).to(gl.bfloat16)
        T: gl.constexpr = CTX + 16
        mine = nm & ((ctx + t)[:, None] >= lo) & ((ctx + t)[:, None] < hi)
        dst = (ctx + t)[:, None] * HD + d[None, :]
        kd = _cache_at(kc_ptr, l, g, NKV, T, HD)
        vd = _cache_at(vc_ptr, l, g, NKV, T, HD)
        gl.store(kd + dst, kr1, mask=mine)
        gl.store(kd + dst + HH, kr2, mask=mine)
        gl.store(vd + dst, vr1, mask=mine)
        gl.store(vd + dst + HH, vr2, mask=mine)
        _tbar()
        k1, k2, v1, v2 = _kv_block8(kc_ptr, vc_ptr, l, g, lo, hi, R, NKV, HD, CTX, TB8)
    ok = ((lo + st)[None, :] < hi) & ((lo + st)[None, :] <= last[:, None])
    sc = mma_v2(a1, k1, gl.zeros([64, TB8], gl.float32, MMA8))
    sc = mma_v2(a2, k2, sc)
    sc = gl.where(ok, sc * scale, -1.0e30)
    m = gl.max(sc, axis=1)
    pe = gl.where(ok, gl.exp(sc - m[:, None]), 0.0)
    lsum = gl.sum(pe, axis=1)
    pa = gl.convert_layout(pe.to(gl.bfloat16), A8)
    o1 = mma_v2(pa, v1, gl.zeros([64, HH], gl.float32, MMA8))
    o2 = mma_v2(pa, v2, gl.zeros([64, HH], gl.float32, MMA8))
    for b0 in range(lo + TB8, hi, TB8):  # the last split's positions past its block
        kb1, kb2, vb1, vb2 = _kv_block8(kc_ptr, vc_ptr, l, g, b0, hi, R, NKV, HD, CTX, TB8)
        okb = ((b0 + st)[None, :] < hi) & ((b0 + st)[None, :] <= last[:, None])
        sb = mma_v2(a1, kb1, gl.zeros([64, TB8], gl.float32, MMA8))
        sb = mma_v2(a2, kb2, sb)
        sb = gl.where(okb, sb * scale, -1.0e30)
        mb = gl.maximum(m, gl.max(sb, axis=1))
        ab_ = gl.exp(m - mb)
        pbk = gl.where(okb, gl.exp(sb - mb[:, None]), 0.0)
        lsum = lsum * ab_ + gl.sum(pbk, axis=1)
        pk = gl.convert_layout(pbk.to(gl.bfloat16), A8)
        o1 = mma_v2(pk, vb1, o1 * ab_[:, None])
        o2 = mma_v2(pk, vb2, o2 * ab_[:, None])
        m = mb
    APS: gl.constexpr = HPC * (HD + 2)
    od = gl.arange(0, HH, layout=gl.SliceLayout(0, MMA8))
    sr = sm // GQ
    sh = sm % GQ
    base = ap_ptr + ((l * NKV + g) * APN + sr * NSPL + c2) * APS + sh * (HD + 2)
    omask = (sr[:, None] < R) & (od[None, :] < HH)
    gl.store(base[:, None] + od[None, :], o1, mask=omask)
    gl.store(base[:, None] + HH + od[None, :], o2, mask=omask)
    gl.store(base + HD, m, mask=sr < R)
    gl.store(base + HD + 1, lsum, mask=sr < R)


@gluon.jit
def _loader(
    d16,
    d8,
    df,
    ring,
    ready,
    empty,
    n_items,
    SP: gl.constexpr,
    C0: gl.constexpr,
    C1: gl.constexpr,
    C2: gl.constexpr,
    C3: gl.constexpr,
    T0: gl.constexpr,
    T1: gl.constexpr,
    T2: gl.constexpr,
    T3: gl.constexpr,
    NLAYERS: gl.constexpr,
    D: gl.constexpr,
    NQKV: gl.constexpr,
    F: gl.constexpr,
):
    """Fills the ring with the tiles of the SM's items, in item order, from the row-major weights."""
    pid = gl.program_id(0)
    G = gl.num_programs(0)
    c = 0
    for item in range(pid, n_items, G):
        l, k, j, KT, tile0, need = _decode(item, C0, C1, C2, C3, T0, T1, T2, T3, NLAYERS)
        for kt in range(KT):
            s = (c + kt) % SP
            mbarrier.wait(empty.index(s), (((c + kt) // SP) & 1) ^ 1)
            mbarrier.expect(ready.index(s), 64 * 128 * 2)
            _nopack_tile(d16, d8, df, ring, ready.index(s), s, l, k, j, kt, D, NQKV, F)
        c += KT


@gluon.jit
def _compute(
    hs_ptr,
    qkv_ptr,
    m_ptr,
    z_ptr,
    kc_ptr,
    vc_ptr,
    cs_ptr,
    ap_ptr,
    gamma_ptr,
    emb_ptr,
    tok_ptr,
    done_ptr,
    err_ptr,
    ring,
    xf,
    scratch,
    ready,
    empty,
    sfull,
    sfree,
    n_items,
    eps,
    NH: gl.constexpr,
    NKV: gl.constexpr,
    HD: gl.constexpr,
    CTX: gl.constexpr,
    NSPL: gl.constexpr,
    R: gl.constexpr,
    RP: gl.constexpr,
    D: gl.constexpr,
    NQKV: gl.constexpr,
    F: gl.constexpr,
    BK: gl.constexpr,
    SP: gl.constexpr,
    SPIN: gl.constexpr,
    KQMAX: gl.constexpr,
    XSTREAM: gl.constexpr,
    C0: gl.constexpr,
    C1: gl.constexpr,
    C2: gl.constexpr,
    C3: gl.constexpr,
    T0: gl.constexpr,
    T1: gl.constexpr,
    T2: gl.constexpr,
    T3: gl.constexpr,
    QKN: gl.constexpr,
    NLAYERS: gl.constexpr,
    TB8: gl.constexpr,
):
    """The compute warpgroup: the SM's items in order (attention duties inside the first o items), X reloaded only
    when the product changes (down's streamed X: every item)."""
    NB: gl.constexpr = 4 * RP
    KTMAX: gl.constexpr = KQMAX // BK
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, NB, 16]
    )
    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([NB, BK], gl.bfloat16)
    gl.static_assert(x_layout.swizzle_byte_width == 128)
    if _REINT_NEW:
        x_tiles = xf.reinterpret(gl.bfloat16, [KTMAX, NB, BK], x_layout)
    else:
        x_tiles = xf._reinterpret(gl.bfloat16, [KTMAX, NB, BK], x_layout)
    c_layout: gl.constexpr = gl.BlockedLayout(
        [1, 8], [1, 32], [4, 1], [1, 0]
    )  # [NB, 512]: X chunks
    pid = gl.program_id(0)
    G = gl.num_programs(0)
    gl.static_assert((D // 4) % 512 == 0)
    gl.static_assert((D // 4) // 512 <= 2)
    c = 0
    prev = -1
    i = 0
    for item in range(pid, n_items, G):
        l, k, j, KT, tile0, need = _decode(item, C0, C1, C2, C3, T0, T1, T2, T3, NLAYERS)
        p = 4 * l + k - 4 * (k == 4).to(gl.int32)  # the head counts at 4 * layers
        fresh = (p != prev) | ((k == 3) & (XSTREAM > 0))
        prev = p
        _item(
            hs_ptr,
            qkv_ptr,
            m_ptr,
            z_ptr,
            kc_ptr,
            vc_ptr,
            cs_ptr,
            ap_ptr,
            gamma_ptr,
            emb_ptr,
            tok_ptr,
            done_ptr,
            err_ptr,
            ring,
            xf,
            x_tiles,
            scratch,
            ready,
            empty,
            sfull,
            sfree,
            i,
            eps,
            NH,
            NKV,
            HD,
            CTX,
            NSPL,
            l,
            k,
            j,
            KT,
            need,
            p,
            fresh,
            c,
            SPIN,
            R,
            RP,
            D,
            NQKV,
            F,
            BK,
            SP,
            NB,
            XSTREAM,
            c_layout,
            mma_layout,
            QKN,
            NLAYERS,
            TB8,
        )
        c += KT
        i += 1


@gluon.jit
def _wait_count(ptr, need, err_ptr, limit):
    """Spin until the count at ptr reaches need (acquire); a timeout counts in err[0]."""
    flag = _ld_acquire(ptr)
    spins = 0
    while (flag < need) & (spins < limit):
        flag = _ld_acquire(ptr)
        spins += 1
    if flag < need:
        gl.atomic_add(err_ptr, 1)


@gluon.jit
def _duty8(
    qkv_ptr,
    kc_ptr,
    vc_ptr,
    cs_ptr,
    ap_ptr,
    z_ptr,
    gamma_ptr,
    done_ptr,
    err_ptr,
    eps,
    ab,
    l,
    j,
    limit,
    NH: gl.constexpr,
    NKV: gl.constexpr,
    HD: gl.constexpr,
    CTX: gl.constexpr,
    NSPL: gl.constexpr,
    R: gl.constexpr,
    RP: gl.constexpr,
    NQKV: gl.constexpr,
    QKN: gl.constexpr,
    NLAYERS: gl.constexpr,
    GROW: gl.constexpr,
    TB8: gl.constexpr,
):
    """o item j < NKV * NSPL's attention duty (key/value head j // NSPL, split j % NSPL): its first block of cached
    keys and values loaded before the wait for the head's [q | k | v] chunks, every row's partial, then the duties with
    c2 < R wait for the head's NSPL duties and combine row c2 into z."""
    sa = j // NSPL
    c2 = j % NSPL
    ctx = gl.load(err_ptr + 1)  # the step's context length (device memory: graph replays)
    lo, hi = _split8(c2, ctx, R, NSPL, TB8)
    # positions before the step's rows only: the rows' own keys are not in the cache yet
    k1, k2, v1, v2 = _kv_block8(kc_ptr, vc_ptr, l, sa, lo, gl.minimum(hi, ctx), R, NKV, HD, CTX, TB8)
    _spin_duty8(done_ptr + CHUNKS + (4 * l) * 64, sa, err_ptr, limit, NH, NKV, HD)
    _attn_rows8(
        qkv_ptr,
        kc_ptr,
        vc_ptr,
        k1,
        k2,
        v1,
        v2,
        cs_ptr,
        gamma_ptr,
        eps,
        ap_ptr,
        l,
        sa,
        c2,
        ctx,
        R,
        RP,
        NQKV,
        NH,
        NKV,
        HD,
        CTX,
        NSPL,
        QKN,
        NLAYERS,
        GROW,
        TB8,
    )
    _tbar()
    gl.atomic_add(ab + 32 + sa, 1, sem="release", scope="gpu")
    if c2 < R:
        _wait_count(ab + 32 + sa, NSPL, err_ptr, limit)
        _attn_combine8(ap_ptr, z_ptr, l, sa, c2, RP, NH, NKV, HD, NSPL)
        _tbar()
        gl.atomic_add(ab + 224 + (sa * (NH // NKV) * HD) // 512, 1, sem="release", scope="gpu")


@gluon.jit
def _item(
    hs_ptr,
    qkv_ptr,
    m_ptr,
    z_ptr,
    kc_ptr,
    vc_ptr,
    cs_ptr,
    ap_ptr,
    gamma_ptr,
    emb_ptr,
    tok_ptr,
    done_ptr,
    err_ptr,
    ring,
    xf,
    x_tiles,
    scratch,
    ready,
    empty,
    sfull,
    sfree,
    si,
    eps,
    NH: gl.constexpr,
    NKV: gl.constexpr,
    HD: gl.constexpr,
    CTX: gl.constexpr,
    NSPL: gl.constexpr,
    l,
    k,
    j,
    KT,
    need,
    p,
    fresh,
    c,
    limit,
    R: gl.constexpr,
    RP: gl.constexpr,
    D: gl.constexpr,
    NQKV: gl.constexpr,
    F: gl.constexpr,
    BK: gl.constexpr,
    SP: gl.constexpr,
    NB: gl.constexpr,
    XSTREAM: gl.constexpr,
    c_layout: gl.constexpr,
    mma_layout: gl.constexpr,
    QKN: gl.constexpr,
    NLAYERS: gl.constexpr,
    TB8: gl.constexpr,
):
    """One item: (the o items' attention duty), X into shared memory when fresh (after the wait for what it reads),
    the products over the ring's tiles on wgmma, the accumulator handed to the storer's slot."""
    KQD: gl.constexpr = D // 4
    KQF: gl.constexpr = F // 4
    NSD: gl.constexpr = D // 4 // 512  # 512-column X chunks of a quarter of D (1 or 2)
    QC: gl.constexpr = NH * HD // 512  # query chunks of 512 columns (z's chunks)
    cn = gl.arange(0, NB, layout=gl.SliceLayout(1, c_layout))
    cc = gl.arange(0, 512, layout=gl.SliceLayout(0, c_layout))
    c_q = cn // RP
    c_t = cn % RP
    c_mask = (c_t[:, None] < R) & (cc[None, :] < 512)
    # X[(q, t), c'] = x[t, q * K/4 + c']
    cbase = cc[None, :] + c_q[:, None] * 0
    cstep = 512
    norm_in = (k == 0) | (k == 2) | (k == 4)
    hin = 2 * l + (k // 2) * (k < 4).to(gl.int32)  # the head: h after the last layer
    ab = done_ptr + 2 * CHUNKS + l * ABN  # the layer's attention counts
    if k == 1:
        if j < NKV * NSPL:
            _duty8(
                qkv_ptr,
                kc_ptr,
                vc_ptr,
                cs_ptr,
                ap_ptr,
                z_ptr,
                gamma_ptr,
                done_ptr,
                err_ptr,
                eps,
                ab,
                l,
                j,
                limit,
                NH,
                NKV,
                HD,
                CTX,
                NSPL,
                R,
                RP,
                NQKV,
                QKN,
                NLAYERS,
                D,
                TB8,
            )
    if fresh:
        # gamma depends on nothing: loaded before the wait, in X's (quarter, row) arrangement
        gm = gl.load(gamma_ptr + hin * D + c_q[:, None] * KQD + cbase).to(gl.float32)
        if NSD > 1:
            gm1 = gl.load(gamma_ptr + hin * D + c_q[:, None] * KQD + cbase + cstep).to(gl.float32)
        if k == 1:
            for zq in gl.static_range(QC // 4):
                _spin4(ab + 224 + 4 * zq, R * (512 // ((NH // NKV) * HD)), err_ptr, limit)
        elif p > 0:
            _wait_count(done_ptr + (p - 1), need, err_ptr, limit)
        if norm_in:
            # each (quarter, row) line of X reads its row's four quarters: the sum of squares over all D in the
            # order q' = 0..3, whatever RP, and keeps its own quarter; slot 0 is the embedding rows of the tokens
            ctok = gl.load(tok_ptr + c_t, mask=c_t < R, other=0).to(gl.int64)
            hrow = gl.where(hin == 0, emb_ptr + ctok * D, hs_ptr + hin * (RP * D) + c_t * D)
            hb = hrow[:, None] + cbase
            h0 = gl.load(hb + 0 * KQD, mask=c_mask, other=0.0, cache_modifier=".cg")
            h1 = gl.load(hb + 1 * KQD, mask=c_mask, other=0.0, cache_modifier=".cg")
            h2 = gl.load(hb + 2 * KQD, mask=c_mask, other=0.0, cache_modifier=".cg")
            h3 = gl.load(hb + 3 * KQD, mask=c_mask, other=0.0, cache_modifier=".cg")
            if NSD > 1:
                # the quarters' second 512-column chunks (D = 4096), loaded with the first
                k0 = gl.load(hb + cstep + 0 * KQD, mask=c_mask, other=0.0, cache_modifier=".cg")
                k1 = gl.load(hb + cstep + 1 * KQD, mask=c_mask, other=0.0, cache_modifier=".cg")
                k2 = gl.load(hb + cstep + 2 * KQD, mask=c_mask, other=0.0, cache_modifier=".cg")
                k3 = gl.load(hb + cstep + 3 * KQD, mask=c_mask, other=0.0, cache_modifier=".cg")
            f0 = h0.to(gl.float32)
            f1 = h1.to(gl.float32)
            f2 = h2.to(gl.float32)
            f3 = h3.to(gl.float32)
            ss = (
                gl.sum(f0 * f0, axis=1)
                + gl.sum(f1 * f1, axis=1)
                + gl.sum(f2 * f2, axis=1)
                + gl.sum(f3 * f3, axis=1)
            )
            qq = c_q[:, None]
            own = gl.where(qq == 0, f0, gl.where(qq == 1, f1, gl.where(qq == 2, f2, f3)))
            if NSD > 1:
                e0 = k0.to(gl.float32)
                e1 = k1.to(gl.float32)
                e2 = k2.to(gl.float32)
                e3 = k3.to(gl.float32)
                ss += (
                    gl.sum(e0 * e0, axis=1)
                    + gl.sum(e1 * e1, axis=1)
                    + gl.sum(e2 * e2, axis=1)
                    + gl.sum(e3 * e3, axis=1)
                )
                own1 = gl.where(qq == 0, e0, gl.where(qq == 1, e1, gl.where(qq == 2, e2, e3)))
            rstd = gl.rsqrt(ss / D + eps)[:, None]
            xf.slice(0, 512, 1).store(
                ((own * rstd).to(gl.bfloat16).to(gl.float32) * gm).to(gl.bfloat16)
            )
            if NSD > 1:
                xf.slice(512, 512, 1).store(
                    ((own1 * rstd).to(gl.bfloat16).to(gl.float32) * gm1).to(gl.bfloat16)
                )
        elif k == 1:
            xsrc = z_ptr + l * (RP * D) + c_t[:, None] * D
            xv = gl.load(
                xsrc + c_q[:, None] * KQD + cbase, mask=c_mask, other=0.0, cache_modifier=".cg"
            )
            if NSD > 1:
                xv1 = gl.load(
                    xsrc + c_q[:, None] * KQD + cbase + cstep,
                    mask=c_mask,
                    other=0.0,
                    cache_modifier=".cg",
                )
            xf.slice(0, 512, 1).store(xv)
            if NSD > 1:
                xf.slice(512, 512, 1).store(xv1)
        else:
            # m: every chunk's load issued before the first store (streamed: chunk 0 only)
            gl.static_assert(KQF % 512 == 0)
            gl.static_assert(KQF // 512 <= 8)
            NCH: gl.constexpr = (KQF // 512) * (1 - XSTREAM) + XSTREAM
            mb = m_ptr + l * (RP * F) + c_t[:, None] * F + c_q[:, None] * KQF + cbase
            m0 = gl.load(mb, mask=c_mask, other=0.0, cache_modifier=".cg")
            if NCH > 1:
                m1 = gl.load(mb + cstep, mask=c_mask, other=0.0, cache_modifier=".cg")
            if NCH > 2:
                m2 = gl.load(mb + 2 * cstep, mask=c_mask, other=0.0, cache_modifier=".cg")
            if NCH > 3:
                m3 = gl.load(mb + 3 * cstep, mask=c_mask, other=0.0, cache_modifier=".cg")
            if NCH > 4:
                m4 = gl.load(mb + 4 * cstep, mask=c_mask, other=0.0, cache_modifier=".cg")
            if NCH > 5:
                m5 = gl.load(mb + 5 * cstep, mask=c_mask, other=0.0, cache_modifier=".cg")
            if NCH > 6:
                m6 = gl.load(mb + 6 * cstep, mask=c_mask, other=0.0, cache_modifier=".cg")
            if NCH > 7:
                m7 = gl.load(mb + 7 * cstep, mask=c_mask, other=0.0, cache_modifier=".cg")
            xf.slice(0, 512, 1).store(m0)
            if NCH > 1:
                xf.slice(512, 512, 1).store(m1)
            if NCH > 2:
                xf.slice(1024, 512, 1).store(m2)
            if NCH > 3:
                xf.slice(1536, 512, 1).store(m3)
            if NCH > 4:
                xf.slice(2048, 512, 1).store(m4)
            if NCH > 5:
                xf.slice(2560, 512, 1).store(m5)
            if NCH > 6:
                xf.slice(3072, 512, 1).store(m6)
            if NCH > 7:
                xf.slice(3584, 512, 1).store(m7)
    fence_async_shared()
    _tbar()
    acc = gl.zeros([64, NB], gl.float32, mma_layout)
    n_generic = KT
    if XSTREAM:
        if k == 3:
            # down's X in 512-column chunks through two buffers: chunk cb + 1 loaded from global during chunk cb's MMAs
            NCS: gl.constexpr = KQF // 512
            mbs = m_ptr + l * (RP * F) + c_t[:, None] * F + c_q[:, None] * KQF + cbase
            for cb in gl.static_range(NCS):
                if cb + 1 < NCS:
                    xn = gl.load(
                        mbs + (cb + 1) * cstep, mask=c_mask, other=0.0, cache_modifier=".cg"
                    )
                for kk in gl.static_range(4):
                    t = cb * 4 + kk
                    st = (c + t) % SP
                    mbarrier.wait(ready.index(st), ((c + t) // SP) & 1)
                    acc = warpgroup_mma(
                        ring.index(st),
                        x_tiles.index((cb % 2) * 4 + kk).permute((1, 0)),
                        acc,
                        is_async=True,
                    )
                    acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                    _tbar()
                    if t > 0:
                        mbarrier.arrive(empty.index((c + t - 1) % SP))
                if cb + 1 < NCS:
                    # the MMAs of chunk cb - 1, which read the other buffer, are complete (one outstanding)
                    xf.slice(((cb + 1) % 2) * 512, 512, 1).store(xn)
                    fence_async_shared()
                    _tbar()
            n_generic = KT * (k != 3).to(gl.int32)
    for kt in range(n_generic):
        st = (c + kt) % SP
        mbarrier.wait(ready.index(st), ((c + kt) // SP) & 1)
        acc = warpgroup_mma(ring.index(st), x_tiles.index(kt).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        _tbar()
        if kt > 0:
            mbarrier.arrive(empty.index((c + kt - 1) % SP))
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    _tbar()
    mbarrier.arrive(empty.index((c + KT - 1) % SP))
    # the accumulator to the storer's slot; the storer does the rest
    NSC: gl.constexpr = scratch.shape[0]
    ssl = si % NSC
    mbarrier.wait(sfree.index(ssl), ((si // NSC) & 1) ^ 1)
    scratch.index(ssl).store(acc)
    _tbar()
    mbarrier.arrive(sfull.index(ssl))


@gluon.jit
def _storer(
    hs_ptr,
    qkv_ptr,
    m_ptr,
    emb_ptr,
    tok_ptr,
    lg_ptr,
    done_ptr,
    scs,
    sfull,
    sfree,
    n_items,
    R: gl.constexpr,
    RP: gl.constexpr,
    D: gl.constexpr,
    NQKV: gl.constexpr,
    F: gl.constexpr,
    C0: gl.constexpr,
    C1: gl.constexpr,
    C2: gl.constexpr,
    C3: gl.constexpr,
    T0: gl.constexpr,
    T1: gl.constexpr,
    T2: gl.constexpr,
    T3: gl.constexpr,
    NLAYERS: gl.constexpr,
    VOCAB: gl.constexpr,
):
    """One warp doing every item's epilogue from the accumulator the compute warpgroup left in slot i % NSC: the four
    quarters' sum, SiLU(gate) x up into m, [q | k | v] rows, the residual add into h, the logits; then the product's
    count (released once an SM a product, after its last item of it, adding how many it did) and, for [q | k | v], the
    512-column chunks' counts the attention duties wait for."""
    y_layout: gl.constexpr = gl.BlockedLayout([1, 1], [16, 2], [1, 1], [0, 1])  # [16, RP]
    g_layout: gl.constexpr = gl.BlockedLayout([1, 1], [8, 4], [1, 1], [0, 1])  # [8, RP]
    yr = gl.arange(0, 16, layout=gl.SliceLayout(1, y_layout))
    yt = gl.arange(0, RP, layout=gl.SliceLayout(0, y_layout))
    y_mask = (yt[None, :] < R) & (yr[:, None] < 16)
    gr = gl.arange(0, 8, layout=gl.SliceLayout(1, g_layout))
    gt = gl.arange(0, RP, layout=gl.SliceLayout(0, g_layout))
    g_mask = (gt[None, :] < R) & (gr[:, None] < 8)
    ytok = gl.load(tok_ptr + yt, mask=yt < R, other=0).to(gl.int64)
    NSC: gl.constexpr = scs.shape[0]
    pid = gl.program_id(0)
    G = gl.num_programs(0)
    run = 0
    i = 0
    for item in range(pid, n_items, G):
        l, k, j, KT, tile0, need = _decode(item, C0, C1, C2, C3, T0, T1, T2, T3, NLAYERS)
        p = 4 * l + k - 4 * (k == 4).to(gl.int32)
        run += 1
        pn = -1
        if item + G < n_items:
            ln, kn, jn, KTn, tile0n, needn = _decode(
                item + G, C0, C1, C2, C3, T0, T1, T2, T3, NLAYERS
            )
            pn = 4 * ln + kn - 4 * (kn == 4).to(gl.int32)
        rel = run * (pn != p).to(gl.int32)
        run = run * (pn == p).to(gl.int32)
        hin = 2 * l + (k // 2) * (k < 4).to(gl.int32)
        ssl = i % NSC
        mbarrier.wait(sfull.index(ssl), (i // NSC) & 1)
        sc = scs.index(ssl)
        if k == 2:
            g = sc.slice(0, 8, 0).slice(0, RP, 1).load(g_layout)
            u = sc.slice(8, 8, 0).slice(0, RP, 1).load(g_layout)
            for q in gl.static_range(1, 4):
                g += sc.slice(q * 16, 8, 0).slice(q * RP, RP, 1).load(g_layout)
                u += sc.slice(q * 16 + 8, 8, 0).slice(q * RP, RP, 1).load(g_layout)
            _tbar()
            mbarrier.arrive(sfree.index(ssl))
            gbf = g.to(gl.bfloat16).to(gl.float32)
            act = (gbf / (1.0 + gl.exp(-gbf))).to(gl.bfloat16).to(gl.float32)
            mm = (act * u.to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16)
            gl.store(m_ptr + l * (RP * F) + gt[None, :] * F + j * 8 + gr[:, None], mm, mask=g_mask)
        else:
            y = sc.slice(0, 16, 0).slice(0, RP, 1).load(y_layout)
            for q in gl.static_range(1, 4):
                y += sc.slice(q * 16, 16, 0).slice(q * RP, RP, 1).load(y_layout)
            _tbar()
            mbarrier.arrive(sfree.index(ssl))
            if k == 0:
                gl.store(
                    qkv_ptr + l * (RP * NQKV) + yt[None, :] * NQKV + j * 16 + yr[:, None],
                    y.to(gl.bfloat16),
                    mask=y_mask,
                )
            elif k == 4:
                gl.store(
                    lg_ptr + yt[None, :] * VOCAB + j * 16 + yr[:, None],
                    y.to(gl.bfloat16),
                    mask=y_mask,
                )
            else:
                rrow = gl.where(hin == 0, emb_ptr + ytok * D, hs_ptr + hin * (RP * D) + yt * D)
                hres = gl.load(
                    rrow[None, :] + j * 16 + yr[:, None],
                    mask=y_mask,
                    other=0.0,
                    cache_modifier=".cg",
                )
                hn = (hres.to(gl.float32) + y.to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16)
                gl.store(
                    hs_ptr + (hin + 1) * (RP * D) + yt[None, :] * D + j * 16 + yr[:, None],
                    hn,
                    mask=y_mask,
                )
        _tbar()
        if rel > 0:
            gl.atomic_add(done_ptr + p, rel, sem="release", scope="gpu")
        if k == 0:
            # a count per 512-column chunk, nothing waited for but the duties (which write the cache)
            gl.atomic_add(done_ptr + CHUNKS + p * 64 + j // 32, 1, sem="release", scope="gpu")
        i += 1


@gluon.jit
def step_kernel(
    d16,
    d8,
    df,
    hs_ptr,
    qkv_ptr,
    m_ptr,
    z_ptr,
    kc_ptr,
    vc_ptr,
    cs_ptr,
    ap_ptr,
    gamma_ptr,
    emb_ptr,
    tok_ptr,
    lg_ptr,
    done_ptr,
    err_ptr,
    n_items,
    eps,
    NH: gl.constexpr,
    NKV: gl.constexpr,
    HD: gl.constexpr,
    CTX: gl.constexpr,
    NSPL: gl.constexpr,
    R: gl.constexpr,
    RP: gl.constexpr,
    D: gl.constexpr,
    NQKV: gl.constexpr,
    F: gl.constexpr,
    SP: gl.constexpr,
    SPIN: gl.constexpr,
    KQMAX: gl.constexpr,
    XSTREAM: gl.constexpr,
    C0: gl.constexpr,
    C1: gl.constexpr,
    C2: gl.constexpr,
    C3: gl.constexpr,
    T0: gl.constexpr,
    T1: gl.constexpr,
    T2: gl.constexpr,
    T3: gl.constexpr,
    NLAYERS: gl.constexpr,
    VOCAB: gl.constexpr,
    QKN: gl.constexpr,
    TB8: gl.constexpr,
):
    """The whole step, one program an SM: a loader warp (weights into the ring), the compute warpgroup, a storer warp.
    err: [spin timeouts, the context length, arrivals, launches] (int32). ``XSTREAM``: down's X
    streamed in 512-column chunks (eight rows: the whole X of F / 4 columns would leave too few ring
    stages)."""
    BK: gl.constexpr = 128
    NB: gl.constexpr = 4 * RP
    ring = gl.allocate_shared_memory(
        gl.bfloat16, [SP, 64, BK], gl.NVMMASharedLayout.get_default_for([64, BK], gl.bfloat16)
    )
    xf_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([NB, KQMAX], gl.bfloat16)
    gl.static_assert(xf_layout.swizzle_byte_width == 128)
    sc_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    xf = gl.allocate_shared_memory(gl.bfloat16, [NB, KQMAX], xf_layout)
    NSCK: gl.constexpr = 4 if RP <= 2 else 2
    scs = gl.allocate_shared_memory(gl.float32, [NSCK, 64, NB], sc_layout)
    sfull = gl.allocate_shared_memory(gl.int64, [NSCK, 1], mbarrier.MBarrierLayout())
    sfree = gl.allocate_shared_memory(gl.int64, [NSCK, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NSCK):
        mbarrier.init(sfull.index(i), count=1)
        mbarrier.init(sfree.index(i), count=1)
    ready = gl.allocate_shared_memory(gl.int64, [SP, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [SP, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(SP):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    fence_async_shared()
    _tbar()
    gl.warp_specialize(
        [
            (
                _compute,
                (
                    hs_ptr,
                    qkv_ptr,
                    m_ptr,
                    z_ptr,
                    kc_ptr,
                    vc_ptr,
                    cs_ptr,
                    ap_ptr,
                    gamma_ptr,
                    emb_ptr,
                    tok_ptr,
                    done_ptr,
                    err_ptr,
                    ring,
                    xf,
                    scs,
                    ready,
                    empty,
                    sfull,
                    sfree,
                    n_items,
                    eps,
                    NH,
                    NKV,
                    HD,
                    CTX,
                    NSPL,
                    R,
                    RP,
                    D,
                    NQKV,
                    F,
                    BK,
                    SP,
                    SPIN,
                    KQMAX,
                    XSTREAM,
                    C0,
                    C1,
                    C2,
                    C3,
                    T0,
                    T1,
                    T2,
                    T3,
                    QKN,
                    NLAYERS,
                    TB8,
                ),
            ),
            (
                _loader,
                (
                    d16,
                    d8,
                    df,
                    ring,
                    ready,
                    empty,
                    n_items,
                    SP,
                    C0,
                    C1,
                    C2,
                    C3,
                    T0,
                    T1,
                    T2,
                    T3,
                    NLAYERS,
                    D,
                    NQKV,
                    F,
                ),
            ),
            (
                _storer,
                (
                    hs_ptr,
                    qkv_ptr,
                    m_ptr,
                    emb_ptr,
                    tok_ptr,
                    lg_ptr,
                    done_ptr,
                    scs,
                    sfull,
                    sfree,
                    n_items,
                    R,
                    RP,
                    D,
                    NQKV,
                    F,
                    C0,
                    C1,
                    C2,
                    C3,
                    T0,
                    T1,
                    T2,
                    T3,
                    NLAYERS,
                    VOCAB,
                ),
            ),
        ],
        [1, 1],
        [24, 80],
    )
    _reset_counts(done_ptr, err_ptr, SPIN, NLAYERS)


SMEM_LIMIT = 232448
"""Shared memory an sm_90 program may take (227 KiB)."""
SPLIT = 64
"""Cached positions a split at full capacity (:func:`_splits`)."""


@dataclass(frozen=True)
class StepShape:
    """A decoder's sizes as the step takes them."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    qk_norm: bool


def _splits(capacity: int) -> int:
    """Splits of the context a key/value head: ``SPLIT`` cached positions each at full capacity,
    and at least eight (one a row of the largest step), whatever the step's rows: a row's sums
    then run in the same order in a step of one row as in one of eight."""
    return max(-(-capacity // SPLIT), 8)


def step_blocker(shape: StepShape, rows: int, capacity: int) -> str | None:
    """Why the step cannot run ``rows`` rows of ``shape`` over a cache of ``capacity`` cached
    positions, or ``None``: the sizes its items, X chunks and attention duties are cut for."""
    d, f, hd = shape.hidden, shape.intermediate, shape.head_dim
    nspl = _splits(capacity)
    checks = (
        (1 <= rows <= 8, f"{rows} rows (1 to 8)"),
        (d % 2048 == 0 and d <= 4096, f"hidden size {d} (2048 or 4096)"),
        (f % 2048 == 0 and f // 4 // 512 <= 8, f"intermediate size {f} (a multiple of 2048, at most 16384)"),
        (hd in (64, 128), f"head width {hd} (64 or 128)"),
        (shape.heads * hd == d, f"{shape.heads} heads of {hd} for a hidden size of {d}"),
        ((shape.heads * hd // 512) % 4 == 0, "query heads in groups of four 512-column chunks"),
        (shape.kv_heads * nspl <= min(d // 16, 132),
         f"{shape.kv_heads} key/value heads x {nspl} splits of a {capacity}-position cache: more "
         f"attention duties than o items ({d // 16})"),
        (rows <= nspl and rows * nspl <= APN.value, f"{rows} rows over {nspl} splits"),
        (shape.vocab % 16 == 0, f"vocabulary {shape.vocab} (a multiple of 16)"),
        (shape.layers <= CHECKED_LAYERS,
         f"{shape.layers} layers yet (its output is checked on a GPU up to {CHECKED_LAYERS})"),
    )
    for ok, what in checks:
        if not ok:
            return f"the persistent step does not take {what}"
    return None


CHECKED_LAYERS = 32
"""The most decoder layers the step takes until a GPU run has checked deeper ones. Up to 32
layers its graphed and eager tokens agree (H100, ``scale-step-8b_nvidia-h100_2026-12-08T0044Z``);
with 36 (Qwen3-8B) they did not, because the launch reset only the first 128 of its 4L + 1
product counts. That reset is fixed; ``test_step_path``'s 33-layer GPU test, which lifts this
limit, has not run yet."""

WIDE_BLOCK_HIDDEN = 2048
"""The widest hidden size whose blocks of 2 to 8 tokens the step takes. Wider, its eight-row
products run slower than the separate launches (H100, Llama-3.1-8B shape: an 8-token forward
6.00 ms against 5.32 ms, one token 5.08 against 5.22; ``benchmarks/results/scale-step-8b_*``)."""


def step_rows(shape: StepShape) -> int:
    """The most tokens one forward of ``shape`` takes through the step: 8 up to a hidden size
    of :data:`WIDE_BLOCK_HIDDEN`, else 1 (its blocks take the separate launches)."""
    return 8 if shape.hidden <= WIDE_BLOCK_HIDDEN else 1


def step_capacity(shape: StepShape) -> int:
    """The most cached positions a step of ``shape`` takes at up to eight rows (0: none): its
    attention duties, a key/value head times the splits, must fit the ``o`` items."""
    splits = min(min(shape.hidden // 16, 132) // shape.kv_heads, APN.value // 8)
    return splits * SPLIT if splits >= 8 else 0


def step_sizes(shape: StepShape, rows: int, capacity: int) -> dict[str, int]:
    """:func:`step_kernel`'s compile-time sizes for ``rows`` rows (padded to 2 or 8) of ``shape``
    over a cache of ``capacity`` cached positions (each row of the cache holds ``capacity + 16``).
    Raises :class:`ValueError` with :func:`step_blocker`'s reason where the step cannot run."""
    why = step_blocker(shape, rows, capacity)
    if why is not None:
        raise ValueError(why)
    d, f, hd = shape.hidden, shape.intermediate, shape.head_dim
    nqkv = (shape.heads + 2 * shape.kv_heads) * hd
    rp = 2 if rows <= 2 else 8
    xstream = int(rp == 8)
    kqmax = triton.next_power_of_2(max(d, f) // 4)
    x_cols = 1024 if xstream else kqmax
    scratch = 64 * 4 * rp * 4 * (4 if rp <= 2 else 2)
    stages = (SMEM_LIMIT - 1024 - (2 * 4 * rp * x_cols + scratch) - 2048 - 4096) // (64 * 128 * 2)
    split = _splits(capacity)
    return dict(
        NH=shape.heads, NKV=shape.kv_heads, HD=hd, CTX=capacity, NSPL=split, R=rows, RP=rp, D=d, NQKV=nqkv,
        F=f, SP=stages, SPIN=4_000_000, KQMAX=x_cols, XSTREAM=xstream, C0=nqkv // 16, C1=d // 16,
        C2=f // 8, C3=d // 16, T0=d // 4 // 128, T1=d // 4 // 128, T2=d // 4 // 128, T3=f // 4 // 128,
        NLAYERS=shape.layers, VOCAB=shape.vocab, QKN=int(shape.qk_norm),
        TB8=max(16, triton.next_power_of_2(-(-capacity // split))),
    )


def step_items(shape: StepShape, head: bool = True) -> int:
    """Items of a step: every layer's four products in 16-row items, then the head's (or none)."""
    nqkv = (shape.heads + 2 * shape.kv_heads) * shape.head_dim
    per_layer = nqkv // 16 + shape.hidden // 16 + shape.intermediate // 8 + shape.hidden // 16
    return shape.layers * per_layer + (shape.vocab // 16 if head else 0)


@triton.jit
def _step_inputs_kernel(ids_ptr, pos_ptr, slot_ptr, inv_ptr, kbase_ptr, vbase_ptr, tok_ptr,
                        err_ptr, cs_ptr, kc_ptr, vc_ptr, slot_bytes, scale, R: tl.constexpr,
                        HH: tl.constexpr, L: tl.constexpr, BL: tl.constexpr):
    """One launch of the step's per-step inputs: the tokens as int32, the context length (the
    first row's position) into ``err[1]``, each row's cos / sin ``[16, 2, HD / 2]`` (fp32, times
    the RoPE's attention scaling) and each layer's address of the slot's cache row."""
    r = tl.arange(0, 16)
    live = r < R
    tl.store(tok_ptr + r, tl.load(ids_ptr + r, mask=live, other=0).to(tl.int32), mask=live)
    pos = tl.load(pos_ptr + r, mask=live, other=0)
    tl.store(err_ptr + 1 + r, pos.to(tl.int32), mask=r == 0)
    d = tl.arange(0, HH)
    angle = pos.to(tl.float32)[:, None] * tl.load(inv_ptr + d)[None, :]
    at = cs_ptr + r[:, None] * (2 * HH) + d[None, :]
    tl.store(at, tl.cos(angle) * scale, mask=live[:, None])
    tl.store(at + HH, tl.sin(angle) * scale, mask=live[:, None])
    layer = tl.arange(0, BL)
    lm = layer < L
    shift = tl.load(slot_ptr).to(tl.int64) * slot_bytes
    tl.store(kc_ptr + layer, tl.load(kbase_ptr + layer, mask=lm, other=0) + shift, mask=lm)
    tl.store(vc_ptr + layer, tl.load(vbase_ptr + layer, mask=lm, other=0) + shift, mask=lm)


def _box(rows: int) -> gl.NVMMASharedLayout:
    """A TMA box ``[rows, 64]`` of bf16: 128-byte rows, the swizzle of the ring's halves."""
    return gl.NVMMASharedLayout.get_default_for([rows, 64], gl.bfloat16)


class StepRunner:
    """:func:`step_kernel` for one decoder (the head left to the caller): the descriptors of its
    stacked weights, its scratch and counts, and the per-step inputs; :meth:`run` is two
    launches and can be captured in a CUDA graph.

    :param shape: the decoder's sizes.
    :param wd: ``[L (NQKV + D + 2F), D]`` bf16: each layer's ``[q | k | v]``, ``o``, gate and up
        rows (:func:`weight_rows`).
    :param wf: ``[L D, F]`` bf16: each layer's ``down``.
    :param gamma: ``[4L + 1, D]`` bf16 norm weights (the module docstring's order).
    :param embed: ``[V, D]`` bf16, the embedding table the first layer reads.
    :param eps: the norms' epsilon (one for all).
    :param inv_freq: fp32 ``[HD / 2]``, the RoPE's frequencies; ``rope_scale`` multiplies its
        cos and sin.
    """

    def __init__(self, shape: StepShape, wd: torch.Tensor, wf: torch.Tensor,
                 gamma: torch.Tensor, embed: torch.Tensor, eps: float, inv_freq: torch.Tensor,
                 rope_scale: float) -> None:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        dev = wd.device
        d, f, hd, lay = shape.hidden, shape.intermediate, shape.head_dim, shape.layers
        rows = weight_rows(shape)
        if wd.shape != (lay * rows, d) or wf.shape != (lay * d, f) or gamma.shape != (4 * lay + 1, d):
            raise ValueError(f"stacked weights {tuple(wd.shape)}, {tuple(wf.shape)} and norms "
                             f"{tuple(gamma.shape)} do not fit {shape}")
        self.shape, self.eps, self.rope_scale = shape, float(eps), float(rope_scale)
        self.capacity = step_capacity(shape)
        """The most cached positions a slot's cache may hold (its rows ``capacity + 16``)."""
        self.rows = step_rows(shape)
        """The most tokens a forward takes through the step (:func:`step_rows`)."""
        self.wd, self.wf, self.gamma, self.embed = wd, wf, gamma, embed
        self.inv_freq = inv_freq.float().contiguous()
        self.programs = torch.cuda.get_device_properties(dev).multi_processor_count
        self.descriptors = (TensorDescriptor.from_tensor(wd, [16, 64], _box(16)),
                            TensorDescriptor.from_tensor(wd, [8, 64], _box(8)),
                            TensorDescriptor.from_tensor(wf, [16, 64], _box(16)))
        nqkv = (shape.heads + 2 * shape.kv_heads) * hd
        bf = torch.bfloat16
        # sized for eight rows; a two-row step reads the same memory as [.., 2, ..]
        self.hs = torch.zeros((2 * lay + 1) * 8 * d, dtype=bf, device=dev)
        self.qkv = torch.zeros(lay * 8 * nqkv, dtype=bf, device=dev)
        self.mid = torch.zeros(lay * 8 * f, dtype=bf, device=dev)
        self.z = torch.zeros(lay * 8 * d, dtype=bf, device=dev)
        self.partials = torch.zeros(lay, shape.kv_heads, APN.value, (512 // hd) * (hd + 2),
                                    device=dev)
        self.done = torch.zeros(2 * CHUNKS.value + lay * ABN.value, dtype=torch.int32, device=dev)
        """Counts, zeroed once: each launch zeroes what it used (``_reset_counts``)."""
        self.err = torch.zeros(4, dtype=torch.int32, device=dev)
        """``[spin timeouts, the context length, arrivals, launches]``."""
        self.tokens = torch.zeros(16, dtype=torch.int32, device=dev)
        self.cos_sin = torch.zeros(16, hd, device=dev)
        self.k_rows = torch.zeros(lay, dtype=torch.int64, device=dev)
        self.v_rows = torch.zeros(lay, dtype=torch.int64, device=dev)
        self._k_base = torch.zeros(lay, dtype=torch.int64, device=dev)
        self._v_base = torch.zeros(lay, dtype=torch.int64, device=dev)
        self._bound: tuple[int, ...] = ()

    def _bind(self, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> None:
        """Each layer's slot-0 cache address, rewritten only when the cache's tensors change."""
        key = tuple(t.data_ptr() for t in (*keys, *values))
        if key != self._bound:
            self._k_base.copy_(torch.tensor([t.data_ptr() for t in keys], dtype=torch.int64))
            self._v_base.copy_(torch.tensor([t.data_ptr() for t in values], dtype=torch.int64))
            self._bound = key

    def run(self, ids: torch.Tensor, positions: torch.Tensor, slot: torch.Tensor,
            keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> torch.Tensor:
        """The step over one request's tokens ``ids: [R]`` (int64) at the consecutive
        ``positions: [R]`` of cache slot ``slot: [1]``; ``keys`` / ``values``: each layer's cache
        ``[S, NKV, T, HD]`` (``T - 16`` the capacity the kernel is compiled for).

        Returns ``hs [2L + 1, RP, D]``: ``hs[2l + 2, :R]`` the residual stream after layer l
        (``hs[2L]`` the last, before the final norm)."""
        shape, r = self.shape, int(ids.shape[0])
        capacity = int(keys[0].shape[2]) - 16
        sizes = step_sizes(shape, r, capacity)
        self._bind(keys, values)
        hd, lay = shape.head_dim, shape.layers
        slot_bytes = shape.kv_heads * (capacity + 16) * hd * keys[0].element_size()
        _step_inputs_kernel[(1,)](
            ids, positions, slot, self.inv_freq, self._k_base, self._v_base, self.tokens,
            self.err, self.cos_sin, self.k_rows, self.v_rows, slot_bytes, self.rope_scale,
            R=r, HH=hd // 2, L=lay, BL=triton.next_power_of_2(lay))
        rp = sizes["RP"]
        d16, d8, dfd = self.descriptors
        step_kernel[(self.programs,)](
            d16, d8, dfd, self.hs, self.qkv, self.mid, self.z, self.k_rows, self.v_rows,
            self.cos_sin, self.partials, self.gamma, self.embed, self.tokens, self.hs,
            self.done, self.err, step_items(shape, head=False), self.eps, num_warps=4, **sizes)
        # (lg_ptr: no head items, nothing is written there)
        return self.hs[: (2 * lay + 1) * rp * shape.hidden].view(2 * lay + 1, rp, shape.hidden)


def weight_rows(shape: StepShape) -> int:
    """Rows of one layer in the stacked ``wd``: ``[q | k | v]``, ``o``, gate, up."""
    nqkv = (shape.heads + 2 * shape.kv_heads) * shape.head_dim
    return nqkv + shape.hidden + 2 * shape.intermediate
