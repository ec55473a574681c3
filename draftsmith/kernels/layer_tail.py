"""The second half of a decoder layer and the next layer's first product as one persistent
launch: ``o`` with the residual add, the post-attention norm, ``[gate | up]`` with SiLU, ``down``
with the residual add, the next layer's input norm and its ``[q | k | v]``.

At 1-2B a few-row step is bound by launches, not by the weights it reads: each product pays
about 4 us of launch, ramp and tail whatever its size, which at 1B is as much as reading its
weight (``docs/benchmarks.md``). Here one grid of one program per SM runs the four products in
turn, each phase's tiles dealt round-robin to the programs, with a grid-wide barrier between
phases instead of a kernel boundary. Each program normalises the rows itself into its own
scratch before a normed product (``M`` rows of ``H``, a few KB), so no phase is a norm alone.
On an H200 it gives the separate launches' bits but is slower than they are (a barrier costs
what a kernel boundary does, and the norms sit in series with the products;
``docs/benchmarks.md``), so the few-row path runs it only when asked
(``target.few_rows = persistent``).

Owns ``layer_tail`` beside its reference. Imports ``draftsmith.contract`` and the kernels it
shares its arithmetic with (``decode_linear``'s product, epilogue and split of ``K``;
``rms_norm``'s store step).

Numerics: every product and norm runs the code of :func:`~draftsmith.kernels.decode_linear.
decode_linear` and :func:`~draftsmith.kernels.rms_norm.rms_norm` with the launch sizes
:func:`~draftsmith.kernels.decode_linear.decode_linear_blocks` gives each weight, so a row's
result depends on that row alone and the bits equal those of the few-row path's separate launches
(the GPU tests compare them; they passed on an H200, ``docs/benchmarks.md``).

The barrier: each program counts its arrival in one int32 of the device's workspace and waits
until every program of the grid has arrived; the last program to leave sets the count back to
zero, so each launch and graph replay starts from zero. It needs every program resident at
once: the grid is the device's SM count, a program takes at most one SM's shared memory, and
the launch is cooperative, so the driver refuses a grid that would not fit. A barrier that still
never fills traps after :data:`SPIN_LIMIT` reads (a CUDA error, not a hang).
Under Triton's interpreter, whose programs run one after another, the phases run as separate
launches of the same kernel (``one_launch = False``), without the barrier.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels._launch import block_size, or_dummy
from draftsmith.kernels.decode_linear import (
    BLOCK_M,
    Blocks,
    _epilogue,
    _epilogue_inputs,
    _products,
    _split_part,
    decode_linear_blocks,
    decode_linear_reference,
    split_parts,
    split_workspace,
)
from draftsmith.kernels.rms_norm import rms_norm_reference, store_norm


def layer_tail_reference(attn: torch.Tensor, h: torch.Tensor, o_weight: torch.Tensor,
                         o_bias: torch.Tensor | None, post_norm: torch.Tensor, post_eps: float,
                         gate_up_weight: torch.Tensor, down_weight: torch.Tensor,
                         down_bias: torch.Tensor | None, next_norm: torch.Tensor | None = None,
                         next_eps: float = 0.0, qkv_weight: torch.Tensor | None = None,
                         qkv_bias: torch.Tensor | None = None, *,
                         one_launch: bool | None = None, grid: int | None = None,
                         blocks: Sequence[Blocks] | None = None, prefetch: int = 0,
                         cooperative: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(h_out [M, H_t], qkv [M, N_qkv] or None)`` of the attention output ``attn: [M, n_q *
    hd]`` and the residual stream ``h: [M, H_t]``::

        h1 = h + attn @ o_weight.T + o_bias
        act = silu(g) * u, [g | u] = rms_norm(h1, post_norm) @ gate_up_weight.T
        h_out = h1 + act @ down_weight.T + down_bias
        qkv = rms_norm(h_out, next_norm) @ qkv_weight.T + qkv_bias   # when next_norm is given

    Each step rounds as :func:`~draftsmith.kernels.decode_linear.decode_linear_reference` and
    :func:`~draftsmith.kernels.rms_norm.rms_norm_reference` do. The kernel form's launch
    arguments (``one_launch``, ``grid``, ``blocks``, ``prefetch``, ``cooperative``) are accepted
    and ignored, so the two forms stay interchangeable."""
    h1 = decode_linear_reference(attn, o_weight, o_bias, residual=h)
    act = decode_linear_reference(rms_norm_reference(h1, post_norm, post_eps), gate_up_weight,
                                  gated=True)
    h_out = decode_linear_reference(act, down_weight, down_bias, residual=h1)
    if next_norm is None:
        return h_out, None
    assert qkv_weight is not None
    return h_out, decode_linear_reference(rms_norm_reference(h_out, next_norm, next_eps),
                                          qkv_weight, qkv_bias)


SPIN_LIMIT = tl.constexpr(1 << 22)
"""Reads of the arrival count after which a waiting program traps (seconds on an H200, where a
barrier takes microseconds): a barrier that can never fill aborts the launch with a CUDA error
instead of hanging the process."""


@triton.jit
def _grid_barrier(bar_ptr, target):
    """Wait until the grid's arrival count at ``bar_ptr`` reaches ``target`` after adding this
    program's arrival: every thread's writes before it are seen by every program after it.
    Traps after :data:`SPIN_LIMIT` reads short of ``target``."""
    tl.debug_barrier()
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < target) & (spins < SPIN_LIMIT):
        seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    if seen < target:
        tl.inline_asm_elementwise("trap; mov.u32 $0, $1;", "=r,r", [seen], dtype=tl.int32,
                                  is_pure=False, pack=1)
    tl.debug_barrier()


@triton.jit
def _prefetch(w_ptr, pid, N, K, K_PART, GATED: tl.constexpr, PARTS: tl.constexpr,
              BLOCK_N: tl.constexpr, COLUMNS: tl.constexpr):
    """Ask L2 for the first ``COLUMNS`` input columns of the weight rows of the first item
    ``pid`` takes in a product phase (its up rows too when ``GATED``), one 128-byte line a
    request, so that its loads after the barrier start on lines already on their way."""
    STEP: tl.constexpr = 128 // w_ptr.dtype.element_ty.primitive_bitwidth * 8
    tile = pid // PARTS
    rn = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, COLUMNS // STEP) * STEP
    k0 = (pid % PARTS) * K_PART
    ok = (rn < N)[:, None] & ((k0 + cols) < K)[None, :]
    rows = w_ptr + rn.to(tl.int64)[:, None] * K + (k0 + cols)[None, :]
    rows = tl.where(ok, rows, w_ptr)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [rows],
                              dtype=tl.int32, is_pure=False, pack=1)
    if GATED:
        ups = tl.where(ok, rows + N.to(tl.int64) * K, w_ptr)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ups],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _next_phase(bar_ptr, target, w_ptr, pid, N, K, K_PART, GATED: tl.constexpr,
                PARTS: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr):
    """Between two phases of one launch: :func:`_prefetch` of the next phase's weight ``w``
    (when ``PREFETCH``), then :func:`_grid_barrier` up to ``target`` arrivals."""
    if PREFETCH > 0:
        _prefetch(w_ptr, pid, N, K, K_PART, GATED, PARTS, BLOCK_N, PREFETCH)
    _grid_barrier(bar_ptr, target)


@triton.jit
def _norm_rows(h_ptr, w_ptr, xn_ptr, M, H, eps, BLOCK_H: tl.constexpr):
    """RMSNorm of rows ``0 .. M - 1`` of ``h: [M, H]`` into the program's scratch ``xn: [M,
    H]``, then a barrier of the program's threads (the product reads what others wrote)."""
    d = tl.arange(0, BLOCK_H)
    ok = d < H
    w = tl.load(w_ptr + d, mask=ok, other=0.0)
    for m in range(M):
        x = tl.load(h_ptr + m * H + d, mask=ok, other=0.0)
        store_norm(x, w, xn_ptr + m * H, d, ok, H, eps)
    tl.debug_barrier()


@triton.jit
def _product_phase(x_ptr, w_ptr, b_ptr, r_ptr, out_ptr, part_ptr, count_ptr, M, N, K, K_PART,
                   pid, grid, HAS_BIAS: tl.constexpr, GATED: tl.constexpr,
                   RESIDUAL: tl.constexpr, IEEE: tl.constexpr, PARTS: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   STAGES: tl.constexpr):
    """One product over ``x: [M, K]`` (contiguous rows), ``out: [M, N]``: its ``tiles x PARTS``
    items dealt round-robin from ``pid`` over ``grid`` programs, the parts of one tile
    neighbours; whole-``K`` tiles run ``decode_linear``'s product and epilogue, parts its
    split."""
    rm = tl.arange(0, BLOCK_M)
    m_ok = rm < M
    tiles = tl.cdiv(N, BLOCK_N)
    for item in range(pid, tiles * PARTS, grid):
        tile = item // PARTS
        rn = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < N
        if PARTS == 1:
            bias, res = _epilogue_inputs(b_ptr, r_ptr, rm, rn, m_ok, n_ok, N, HAS_BIAS, RESIDUAL)
            acc, acc_up = _products(x_ptr, w_ptr, rm, rn, m_ok, n_ok, N, 0, K, K, K,
                                    GATED, IEEE, BLOCK_M, BLOCK_N, BLOCK_K, STAGES)
            _epilogue(acc, acc_up, bias, res, rm, rn, m_ok, n_ok, x_ptr, out_ptr, N,
                      HAS_BIAS, GATED, RESIDUAL)
        else:
            part = item % PARTS
            k_lo = part * K_PART
            k_hi = tl.minimum(k_lo + K_PART, K)
            _split_part(x_ptr, w_ptr, b_ptr, r_ptr, out_ptr, part_ptr, count_ptr, tile, part,
                        rm, rn, m_ok, n_ok, N, k_lo, k_hi, K, K, N, N,
                        HAS_BIAS, GATED, RESIDUAL, IEEE, PARTS, BLOCK_M, BLOCK_N, BLOCK_K,
                        STAGES, False)


@triton.jit
def _layer_tail_kernel(
    attn_ptr, h_ptr, h1_ptr, act_ptr, out_ptr, qkv_ptr, xn_ptr,
    wo_ptr, bo_ptr, post_ptr, wgu_ptr, wd_ptr, bd_ptr, next_ptr, wqkv_ptr, bqkv_ptr,
    part_ptr, count_ptr, bar_ptr,
    M, H, INTER, N_QKV, K_ATTN, post_eps, next_eps, KP_O, KP_GU, KP_D, KP_QKV,
    FIRST: tl.constexpr, LAST: tl.constexpr, ONE_LAUNCH: tl.constexpr,
    HAS_BO: tl.constexpr, HAS_BD: tl.constexpr, HAS_BQKV: tl.constexpr, IEEE: tl.constexpr,
    BN_O: tl.constexpr, BK_O: tl.constexpr, P_O: tl.constexpr, ST_O: tl.constexpr,
    BN_GU: tl.constexpr, BK_GU: tl.constexpr, P_GU: tl.constexpr, ST_GU: tl.constexpr,
    BN_D: tl.constexpr, BK_D: tl.constexpr, P_D: tl.constexpr, ST_D: tl.constexpr,
    BN_QKV: tl.constexpr, BK_QKV: tl.constexpr, P_QKV: tl.constexpr, ST_QKV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, PREFETCH: tl.constexpr,
):
    """Phases ``FIRST .. LAST`` of the tail (0: ``o`` + add into ``h1``; 1: norm, ``[gate |
    up]`` + SiLU into ``act``; 2: ``down`` + add into ``out``; 3: norm, ``[q | k | v]`` into
    ``qkv``), with :func:`_grid_barrier` between them when ``ONE_LAUNCH``. ``xn_ptr``: the
    scratch ``[grid, M, H]``, one slot a program. Every activation is contiguous."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    xn = xn_ptr + pid.to(tl.int64) * (M * H)
    if FIRST <= 0:
        _product_phase(attn_ptr, wo_ptr, bo_ptr, h_ptr, h1_ptr, part_ptr, count_ptr,
                       M, H, K_ATTN, KP_O, pid, grid, HAS_BO, False, True, IEEE, P_O,
                       BLOCK_M, BN_O, BK_O, ST_O)
        if ONE_LAUNCH and LAST > 0:
            _next_phase(bar_ptr, (1 - FIRST) * grid, wgu_ptr, pid, INTER, H, KP_GU, True, P_GU,
                        BN_GU, PREFETCH)
    if FIRST <= 1 and LAST >= 1:
        _norm_rows(h1_ptr, post_ptr, xn, M, H, post_eps, BLOCK_H)
        _product_phase(xn, wgu_ptr, wgu_ptr, h1_ptr, act_ptr, part_ptr, count_ptr,
                       M, INTER, H, KP_GU, pid, grid, False, True, False, IEEE, P_GU,
                       BLOCK_M, BN_GU, BK_GU, ST_GU)
        if ONE_LAUNCH and LAST > 1:
            _next_phase(bar_ptr, (2 - FIRST) * grid, wd_ptr, pid, H, INTER, KP_D, False, P_D,
                        BN_D, PREFETCH)
    if FIRST <= 2 and LAST >= 2:
        _product_phase(act_ptr, wd_ptr, bd_ptr, h1_ptr, out_ptr, part_ptr, count_ptr,
                       M, H, INTER, KP_D, pid, grid, HAS_BD, False, True, IEEE, P_D,
                       BLOCK_M, BN_D, BK_D, ST_D)
        if ONE_LAUNCH and LAST > 2:
            _next_phase(bar_ptr, (3 - FIRST) * grid, wqkv_ptr, pid, N_QKV, H, KP_QKV, False,
                        P_QKV, BN_QKV, PREFETCH)
    if LAST >= 3:
        _norm_rows(out_ptr, next_ptr, xn, M, H, next_eps, BLOCK_H)
        _product_phase(xn, wqkv_ptr, bqkv_ptr, out_ptr, qkv_ptr, part_ptr, count_ptr,
                       M, N_QKV, H, KP_QKV, pid, grid, HAS_BQKV, False, False, IEEE, P_QKV,
                       BLOCK_M, BN_QKV, BK_QKV, ST_QKV)
    if ONE_LAUNCH and LAST > FIRST:
        # the last program to leave sets the count back to zero: every program has passed
        # the last barrier by then, so none still reads it
        left = tl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu")
        if left == (LAST - FIRST + 1) * grid - 1:
            tl.atomic_xchg(bar_ptr, 0, sem="relaxed", scope="gpu")


_BARRIERS: dict[torch.device, torch.Tensor] = {}


def _barrier_count(device: torch.device) -> torch.Tensor:
    """The device's int32 arrival count of :func:`_grid_barrier` (zero between launches)."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _BARRIERS:
        _BARRIERS[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return _BARRIERS[device]


def tail_grid(device: torch.device) -> int:
    """Programs of one persistent launch on ``device``: its SM count (4 on the CPU, where the
    interpreter runs them one after another)."""
    if device.type != "cuda":
        return 4
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def layer_tail(attn: torch.Tensor, h: torch.Tensor, o_weight: torch.Tensor,
               o_bias: torch.Tensor | None, post_norm: torch.Tensor, post_eps: float,
               gate_up_weight: torch.Tensor, down_weight: torch.Tensor,
               down_bias: torch.Tensor | None, next_norm: torch.Tensor | None = None,
               next_eps: float = 0.0, qkv_weight: torch.Tensor | None = None,
               qkv_bias: torch.Tensor | None = None, *, one_launch: bool | None = None,
               grid: int | None = None, blocks: Sequence[Blocks] | None = None,
               prefetch: int = 0,
               cooperative: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Kernel form of :func:`layer_tail_reference` (same arguments and result): one
    persistent launch of ``grid`` programs (default :func:`tail_grid`) on a GPU, or its four
    phases as separate launches (``one_launch = False``; the default off a GPU).

    ``attn: [M, K_a]`` and ``h: [M, H_t]`` with ``M <= BLOCK_M`` (16) contiguous, every weight
    of their dtype with contiguous rows (``[H_t, K_a]``, ``[2 I, H_t]``, ``[H_t, I]``, ``[N_qkv,
    H_t]``), the norms' weights ``[H_t]`` of that dtype too. ``blocks`` forces the launch
    sizes of the products in the order ``o``, ``[gate | up]``, ``down``, ``[q | k | v]`` (a
    test's split of ``K``; one ``num_warps`` for all), else each weight's
    :func:`~draftsmith.kernels.decode_linear.decode_linear_blocks`. ``prefetch`` (a power of
    two, at least 64; 0: none) input columns of each weight row of a program's first item in
    the next phase are requested into L2 before each barrier (one launch only).
    ``cooperative``: one launch goes to the driver as a cooperative launch, which refuses a
    grid whose programs cannot all be resident at once (an error, where the barrier would
    wait forever)."""
    check_tensor("h", h, ("M", "H"), FLOAT_DTYPES, contiguous=True)
    dtype, device = h.dtype, h.device
    m, hidden = int(h.shape[0]), int(h.shape[1])
    if m > BLOCK_M:
        raise ShapeError(f"layer_tail takes at most {BLOCK_M} rows, got {m}")
    sizes = {"M": m, "H": hidden}
    check_tensor("attn", attn, ("M", None), (dtype,), sizes, device, contiguous=True)
    check_tensor("o_weight", o_weight, ("H", int(attn.shape[1])), (dtype,), sizes, device,
                 contiguous=True)
    check_tensor("post_norm", post_norm, ("H",), (dtype,), sizes, device)
    check_tensor("gate_up_weight", gate_up_weight, (None, "H"), (dtype,), sizes, device,
                 contiguous=True)
    inter = int(gate_up_weight.shape[0]) // 2
    check_tensor("down_weight", down_weight, ("H", inter), (dtype,), sizes, device,
                 contiguous=True)
    for name, b in (("o_bias", o_bias), ("down_bias", down_bias)):
        if b is not None:
            check_tensor(name, b, ("H",), (dtype,), sizes, device)
    has_next = next_norm is not None
    n_qkv = 0
    if has_next:
        if qkv_weight is None:
            raise ShapeError("layer_tail needs qkv_weight with next_norm")
        check_tensor("next_norm", next_norm, ("H",), (dtype,), sizes, device)
        check_tensor("qkv_weight", qkv_weight, (None, "H"), (dtype,), sizes, device,
                     contiguous=True)
        n_qkv = int(qkv_weight.shape[0])
        if qkv_bias is not None:
            check_tensor("qkv_bias", qkv_bias, (n_qkv,), (dtype,), device=device)
    k_attn = int(attn.shape[1])
    h1 = torch.empty_like(h)
    act = torch.empty(m, inter, dtype=dtype, device=device)
    out = torch.empty_like(h)
    qkv = torch.empty(m, n_qkv, dtype=dtype, device=device) if has_next else None
    if m == 0:
        return out, qkv
    one_launch = device.type == "cuda" if one_launch is None else one_launch
    grid = tail_grid(device) if grid is None else grid
    plans = [(hidden, k_attn, False), (inter, hidden, True), (hidden, inter, False)]
    if has_next:
        plans.append((n_qkv, hidden, False))
    blocks = (list(blocks)[: len(plans)] if blocks is not None else
              [decode_linear_blocks(n, k, dtype, gated) for n, k, gated in plans])
    if len(blocks) != len(plans) or len({b.num_warps for b in blocks}) != 1:
        raise ShapeError(f"layer_tail needs launch sizes for its {len(plans)} products with "
                         f"one num_warps, got {blocks}")
    parts = [split_parts(k, b.block_k, b.split_k)
             for (_, k, _), b in zip(plans, blocks, strict=True)]
    floats = max(triton.cdiv(n, b.block_n) * p * (2 if g else 1) * BLOCK_M * b.block_n
                 for (n, _, g), b, (p, _) in zip(plans, blocks, parts, strict=True))
    tiles = max(triton.cdiv(n, b.block_n) for (n, _, _), b in zip(plans, blocks, strict=True))
    partials, counts = split_workspace(device, floats, tiles)
    xn = torch.empty(grid, m, hidden, dtype=dtype, device=device)
    if not has_next:  # the [q | k | v] phase's sizes, never run
        blocks.append(Blocks(16, 16, blocks[0].num_warps, 1))
        parts.append((1, 16))
    last = 3 if has_next else 2
    spans = [(0, last)] if one_launch else [(p, p) for p in range(last + 1)]
    for first, final in spans:
        _layer_tail_kernel[(grid,)](
            attn, h, h1, act, out, or_dummy(qkv, out), xn,
            o_weight, or_dummy(o_bias, o_weight), post_norm, gate_up_weight, down_weight,
            or_dummy(down_bias, down_weight), or_dummy(next_norm, post_norm),
            or_dummy(qkv_weight, o_weight), or_dummy(qkv_bias, o_weight),
            partials, counts, _barrier_count(device),
            m, hidden, inter, n_qkv, k_attn, float(post_eps), float(next_eps),
            parts[0][1], parts[1][1], parts[2][1], parts[3][1],
            FIRST=first, LAST=final, ONE_LAUNCH=one_launch,
            HAS_BO=o_bias is not None, HAS_BD=down_bias is not None,
            HAS_BQKV=qkv_bias is not None, IEEE=dtype == torch.float32,
            BN_O=blocks[0].block_n, BK_O=blocks[0].block_k, P_O=parts[0][0],
            ST_O=blocks[0].num_stages,
            BN_GU=blocks[1].block_n, BK_GU=blocks[1].block_k, P_GU=parts[1][0],
            ST_GU=blocks[1].num_stages,
            BN_D=blocks[2].block_n, BK_D=blocks[2].block_k, P_D=parts[2][0],
            ST_D=blocks[2].num_stages,
            BN_QKV=blocks[3].block_n, BK_QKV=blocks[3].block_k, P_QKV=parts[3][0],
            ST_QKV=blocks[3].num_stages,
            BLOCK_M=BLOCK_M, BLOCK_H=block_size(hidden),
            PREFETCH=prefetch if one_launch else 0, num_warps=blocks[0].num_warps,
            num_stages=max(b.num_stages for b in blocks),
            launch_cooperative_grid=one_launch and cooperative)
    return out, qkv


__all__ = ["layer_tail", "layer_tail_reference", "tail_grid"]
