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

Split of ``K`` (``Blocks.split_k > 1``; by default only where few tiles of output would leave
SMs idle, :func:`decode_linear_blocks`): with 32 output columns a program, a 1B layer's
``down`` product is 64 programs on 132 SMs, each streaming the whole ``K``. Split, the
launch runs ``parts`` programs per tile of output (:func:`split_parts`: whole ``K`` tiles per
part, fixed by ``K``, ``block_k`` and ``split_k``), each writing its fp32 sums to a workspace
(:func:`split_workspace`, one per device, reused across calls and CUDA graph replays); the
last of a tile's programs to arrive (an ``acq_rel`` arrival count per tile, reset by that
program) adds the parts in the order ``0, 1, ..`` and applies the same epilogue as the
whole-``K`` kernel. The bits depend on neither the arrival order nor the row count, and repeat
on every call; they differ from the whole-``K`` launch's (another order of the sum). With
``split_k = 1`` the launch is the one-pass kernel, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from draftsmith.contract import DraftsmithError, ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels import interpreted, pdl_on
from draftsmith.kernels._launch import (
    block_size,
    or_dummy,
    pdl_kwargs,
    pdl_release,
    pdl_start,
    row_stride,
)
from draftsmith.kernels.swiglu import silu_mul_reference


def decode_linear_reference(x: torch.Tensor, weight: torch.Tensor,
                            bias: torch.Tensor | None = None, *, gated: bool = False,
                            residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
                            out_dtype: torch.dtype | None = None,
                            blocks: Blocks | None = None, pdl: bool = False,
                            prefetch: int = 0) -> torch.Tensor:
    """``x: [M, K]`` times ``weight: [N, K]`` (``bias: [N]``), with what surrounds it::

        y = x @ weight.T + bias                                  # [M, N]
        y = silu(y[:, :N/2]) * y[:, N/2:] if gated else y        # [M, N/2]
        y = residual + y if residual is not None else y

    Every intermediate rounds to ``x``'s dtype; the result is then cast to ``out_dtype`` (an
    LM head's fp32 logits). ``out`` (``[M, N]`` or ``[M, N/2]``, may be ``residual`` itself)
    receives the result when given. ``blocks``, ``pdl`` and ``prefetch`` (the kernel form's
    launch options) are accepted and ignored, so the two forms stay interchangeable.
    """
    y = torch.nn.functional.linear(x, weight, bias)
    if gated:
        y = silu_mul_reference(y)
    if residual is not None:
        y = residual + y
    y = y if out_dtype is None else y.to(out_dtype)
    return y if out is None else out.copy_(y)


@triton.jit
def _products(x_ptr, w_ptr, rm, rn, m_ok, n_ok, N, k_lo, k_hi, s_x, s_w,
              GATED: tl.constexpr, IEEE: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              STAGES: tl.constexpr):
    """fp32 ``[BLOCK_M, BLOCK_N]`` sums of rows ``rm`` of ``x`` times weight rows ``rn`` (and
    the up rows ``N + rn`` when ``GATED``, else zeros) over input columns ``k_lo .. k_hi``, in
    tiles of ``BLOCK_K`` from ``k_lo``: one fixed order per row, whatever the rows beside it.
    Both operands stream through the pipeline untouched: anything done to a tile of ``x``
    between its load and the product stalls the pipeline (measured: a norm applied there
    doubled the time of an 8B layer's ``[q | k | v]``)."""
    rk = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * s_x
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * s_w
    u_rows = w_rows + N.to(tl.int64) * s_w
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=STAGES):
        k_ok = (k0 + rk) < k_hi
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
    return acc, acc_up


_CUDA = tl.constexpr(not interpreted())  # the interpreter runs no PTX


@triton.jit
def _add_rn(a, b):
    """``a + b`` in fp32, rounded once: on CUDA an ``add.rn``, which the assembler never
    contracts with the product before it into an FMA (a plain ``add`` it may, depending on
    where the compiler happened to place the loads). The gate's product and the residual add
    of an fp32 epilogue round separately, as the reference does, in every kernel sharing it."""
    if _CUDA:
        return tl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=r,r,r", [a, b],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return a + b


@triton.jit
def _epilogue_inputs(b_ptr, r_ptr, rm, rn, m_ok, n_ok, s_r, HAS_BIAS: tl.constexpr,
                     RESIDUAL: tl.constexpr):
    """The epilogue's bias ``[BLOCK_N]`` and residual ``[BLOCK_M, BLOCK_N]`` tiles (``0.0``
    where absent), for the caller to load before the products: loaded after the products'
    loop, they waited for its last barrier, one more round trip to memory at the end of every
    product with a residual add."""
    bias = 0.0
    res = 0.0
    if HAS_BIAS:
        bias = tl.load(b_ptr + rn, mask=n_ok, other=0.0)
    if RESIDUAL:
        res = tl.load(r_ptr + rm.to(tl.int64)[:, None] * s_r + rn[None, :],
                      mask=m_ok[:, None] & n_ok[None, :], other=0.0)
    return bias, res


@triton.jit
def _epilogue(acc, acc_up, bias, res, rm, rn, m_ok, n_ok, x_ptr, out_ptr, s_out,
              HAS_BIAS: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr):
    """What follows the product, on its fp32 sums ``acc`` (``acc_up``: the up half when
    ``GATED``), both ``[BLOCK_M, BLOCK_N]``: the bias, rounding to ``x``'s dtype, the gate, the
    residual add, then the cast to ``out``'s dtype and the store of rows ``rm``, columns ``rn``.
    ``bias``, ``res``: :func:`_epilogue_inputs`'s tiles. One body for the whole-``K`` and the
    split-``K`` kernels, so they round alike."""
    odt = x_ptr.dtype.element_ty  # every step rounds to the input dtype
    if HAS_BIAS:
        acc += bias.to(tl.float32)[None, :]
    y = acc.to(odt).to(tl.float32)
    if GATED:
        act = (y / (1.0 + tl.exp(-y))).to(odt).to(tl.float32)
        y = (act * acc_up.to(odt).to(tl.float32)).to(odt).to(tl.float32)
    ok = m_ok[:, None] & n_ok[None, :]
    if RESIDUAL:
        y = _add_rn(res.to(tl.float32), y)
    y = y.to(odt).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rm.to(tl.int64)[:, None] * s_out + rn[None, :], y, mask=ok)


@triton.jit
def _prefetch_l2(w_ptr, rn, n_ok, N, k_lo, k_hi, s_w, GATED: tl.constexpr, TILES: tl.constexpr,
                 LINES: tl.constexpr, LINE: tl.constexpr, BLOCK_K: tl.constexpr):
    """Ask L2 for the first ``TILES`` weight tiles of the program (rows ``rn``, and ``N + rn``
    when ``GATED``; input columns from ``k_lo``, below ``k_hi``): one ``prefetch.global.L2`` a
    line of ``LINE`` elements, ``LINES`` lines a tile row. Reads nothing into registers and
    writes nothing: under PDL it runs before the wait, while the kernel before still runs."""
    cols = tl.arange(0, LINES) * LINE
    rows = w_ptr + rn.to(tl.int64)[:, None] * s_w
    for t in tl.static_range(TILES):
        k = k_lo + t * BLOCK_K + cols
        ok = n_ok[:, None] & (k < k_hi)[None, :]
        ptrs = tl.where(ok, rows + k[None, :], w_ptr)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs],
                                  dtype=tl.int32, is_pure=False, pack=1)
        if GATED:
            ptrs = tl.where(ok, rows + N.to(tl.int64) * s_w + k[None, :], w_ptr)
            tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l",
                                      [ptrs], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _decode_linear_kernel(
    x_ptr, w_ptr, b_ptr, r_ptr, out_ptr,
    M, N, K, s_x, s_w, s_r, s_out,
    HAS_BIAS: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
    PDL: tl.constexpr, PF_TILES: tl.constexpr, PF_LINES: tl.constexpr, PF_LINE: tl.constexpr,
):
    """Program ``(m, n)``: output columns ``n * BLOCK_N ..`` of rows ``m * BLOCK_M ..``, the
    products over the whole ``K`` in tiles of ``BLOCK_K`` (``N`` counts output columns: with
    ``GATED`` the weight holds ``N`` gate rows, then ``N`` up rows). The programs of one column
    tile are neighbours in launch order, so its weight tile is read from memory once for all
    rows. Under ``PDL`` the program prefetches its first ``PF_TILES`` weight tiles, waits for
    the kernel before, and lets the next one start once its products are done."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    if PDL and PF_TILES > 0:
        _prefetch_l2(w_ptr, rn, n_ok, N, 0, K, s_w, GATED, PF_TILES, PF_LINES, PF_LINE,
                     BLOCK_K)
    pdl_start(PDL, False)
    bias, res = _epilogue_inputs(b_ptr, r_ptr, rm, rn, m_ok, n_ok, s_r, HAS_BIAS, RESIDUAL)
    acc, acc_up = _products(x_ptr, w_ptr, rm, rn, m_ok, n_ok, N, 0, K, s_x, s_w,
                            GATED, IEEE, BLOCK_M, BLOCK_N, BLOCK_K, STAGES)
    pdl_release(PDL)
    _epilogue(acc, acc_up, bias, res, rm, rn, m_ok, n_ok, x_ptr, out_ptr, s_out,
              HAS_BIAS, GATED, RESIDUAL)


@triton.jit
def _decode_linear_split_kernel(
    x_ptr, w_ptr, b_ptr, r_ptr, out_ptr, part_ptr, count_ptr,
    M, N, K, K_PART, s_x, s_w, s_r, s_out,
    HAS_BIAS: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr, IEEE: tl.constexpr,
    PARTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr, PDL: tl.constexpr, PF_TILES: tl.constexpr, PF_LINES: tl.constexpr,
    PF_LINE: tl.constexpr,
):
    """Program ``(m, n, s)``: the fp32 sums of tile ``(m, n)`` over input columns
    ``s * K_PART .. (s + 1) * K_PART`` (``K_PART`` a multiple of ``BLOCK_K``), written to its
    slot of the workspace ``part_ptr``: ``[tiles, PARTS, 1 or 2 (GATED), BLOCK_M, BLOCK_N]``
    fp32, tile ``t = m * tiles_n + n``. Then it counts itself in ``count_ptr[t]`` (int32, zero
    before the launch); the program that arrives last, whichever part it holds, adds the
    ``PARTS`` slots in the order ``s = 0, 1, ..`` (so the bits never depend on arrival),
    applies the epilogue and sets the count back to zero for the next launch or graph
    replay. ``PDL`` and the prefetch: as the whole-``K`` kernel's, over the part's columns."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    part = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    k_lo = part * K_PART
    k_hi = tl.minimum(k_lo + K_PART, K)
    tile = pid_m * tl.num_programs(1) + pid_n
    if PDL and PF_TILES > 0:
        _prefetch_l2(w_ptr, rn, n_ok, N, k_lo, k_hi, s_w, GATED, PF_TILES, PF_LINES, PF_LINE,
                     BLOCK_K)
    pdl_start(PDL, False)
    _split_part(x_ptr, w_ptr, b_ptr, r_ptr, out_ptr, part_ptr, count_ptr, tile, part, rm, rn,
                m_ok, n_ok, N, k_lo, k_hi, s_x, s_w, s_r, s_out,
                HAS_BIAS, GATED, RESIDUAL, IEEE, PARTS, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, PDL)


@triton.jit
def _split_part(x_ptr, w_ptr, b_ptr, r_ptr, out_ptr, part_ptr, count_ptr, tile, part, rm, rn,
                m_ok, n_ok, N, k_lo, k_hi, s_x, s_w, s_r, s_out,
                HAS_BIAS: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
                IEEE: tl.constexpr, PARTS: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                PDL: tl.constexpr):
    """Part ``part`` of output tile ``tile`` (rows ``rm``, columns ``rn``): its fp32 sums over
    input columns ``k_lo .. k_hi`` to its workspace slot, its arrival counted, and the
    epilogue of the whole tile by the last of the tile's ``PARTS`` programs (the parts added
    in the order ``0, 1, ..``). Shared by the split-``K`` launch and the persistent layer tail
    (:mod:`draftsmith.kernels.layer_tail`), so the two round alike. ``PDL``: let the next
    kernel start once the products are done. Every part loads the tile's bias and residual
    before its products (only the last uses them), so the epilogue waits for no load."""
    bias, res = _epilogue_inputs(b_ptr, r_ptr, rm, rn, m_ok, n_ok, s_r, HAS_BIAS, RESIDUAL)
    acc, acc_up = _products(x_ptr, w_ptr, rm, rn, m_ok, n_ok, N, k_lo, k_hi, s_x, s_w,
                            GATED, IEEE, BLOCK_M, BLOCK_N, BLOCK_K, STAGES)
    pdl_release(PDL)
    SLOT: tl.constexpr = BLOCK_M * BLOCK_N
    WIDTH: tl.constexpr = 2 if GATED else 1
    in_slot = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    slots = part_ptr + tile.to(tl.int64) * (PARTS * WIDTH * SLOT) + in_slot
    tl.store(slots + part * (WIDTH * SLOT), acc)
    if GATED:
        tl.store(slots + part * (WIDTH * SLOT) + SLOT, acc_up)
    # every thread's stores precede the count (the barrier), and the count's release publishes
    # them to the program that reads them after its acquire
    tl.debug_barrier()
    arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
    if arrived == PARTS - 1:
        tl.debug_barrier()
        # ".cg": read the other programs' slots from L2, never a stale L1 line
        acc = tl.load(slots, cache_modifier=".cg")
        for s in tl.static_range(1, PARTS):
            acc += tl.load(slots + s * (WIDTH * SLOT), cache_modifier=".cg")
        if GATED:
            acc_up = tl.load(slots + SLOT, cache_modifier=".cg")
            for s in tl.static_range(1, PARTS):
                acc_up += tl.load(slots + s * (WIDTH * SLOT) + SLOT, cache_modifier=".cg")
        tl.store(count_ptr + tile, 0)
        _epilogue(acc, acc_up, bias, res, rm, rn, m_ok, n_ok, x_ptr, out_ptr, s_out,
                  HAS_BIAS, GATED, RESIDUAL)


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
    split_k: int = 1
    """Parts ``K`` is cut into, each a program of its own (1: one program streams the whole
    ``K``); see :func:`split_parts` for the parts a launch runs."""

    def __post_init__(self) -> None:
        if self.split_k < 1:
            raise ShapeError(f"Blocks.split_k counts parts of K, at least 1, not {self.split_k}")


def split_parts(k: int, block_k: int, split_k: int) -> tuple[int, int]:
    """``(parts, k_part)``: the ``K`` tiles of ``block_k`` dealt to at most ``split_k`` parts
    of ``k_part`` input columns each (a whole number of tiles, the last part shorter), no part
    empty: fixed by ``k``, ``block_k`` and ``split_k`` alone, never by the row count."""
    tiles = triton.cdiv(k, block_k)
    per_part = triton.cdiv(tiles, max(1, min(split_k, tiles)))
    return triton.cdiv(tiles, per_part), per_part * block_k


@dataclass
class _Workspace:
    """One device's split-``K`` scratch: fp32 partial sums and int32 arrival counts (zero
    between launches: the last program of a tile resets its own)."""

    partials: torch.Tensor
    counts: torch.Tensor
    retired: list[torch.Tensor]
    """Outgrown buffers, kept alive: a CUDA graph captured with them still writes there."""


_WORKSPACES: dict[torch.device, _Workspace] = {}


def _grown(old: torch.Tensor | None, need: int, dtype: torch.dtype, device: torch.device,
           retired: list[torch.Tensor]) -> torch.Tensor:
    """``old`` when it holds ``need`` elements, else a zeroed buffer of the next power of two
    of ``need`` (``old`` then appended to ``retired``)."""
    if old is not None and old.numel() >= need:
        return old
    if old is not None:
        retired.append(old)
    return torch.zeros(triton.next_power_of_2(max(need, 1)), dtype=dtype, device=device)


def split_workspace(device: torch.device, floats: int, tiles: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(partials: [>= floats] float32, counts: [>= tiles] int32)`` on ``device``, shared by
    every split-``K`` launch there and reused across calls and graph replays.

    A buffer grows to the next power of two of what a launch needs, zeroed when allocated; the
    outgrown ones stay allocated (a graph captured earlier still uses them), so the memory held
    is under twice the largest need, in bytes
    ``4 * tiles_m * tiles_n * parts * (2 if gated else 1) * BLOCK_M * block_n`` for partials
    (Llama-3.1-8B's ``[q | k | v]`` at 16 rows in 8 parts of ``block_n = 32``: 3 MiB; a 128k
    LM head at 16 rows in 8 parts: 66 MB) plus ``4 * tiles``. Launches on one stream share it
    safely (one runs after the other); split launches that may overlap on two streams must not
    run on one device. Growing during a CUDA graph capture is refused: the first call must be
    eager (a warm-up), as it is for the kernel's compilation anyway.
    """
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    ws = _WORKSPACES.get(device)
    if ws is not None and ws.partials.numel() >= floats and ws.counts.numel() >= tiles:
        return ws.partials, ws.counts
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise DraftsmithError(
            f"decode_linear's split-K workspace on {device} must grow ({floats} floats, "
            f"{tiles} counts) inside a CUDA graph capture: run the product once eagerly first")
    retired = [] if ws is None else list(ws.retired)
    partials = _grown(None if ws is None else ws.partials, floats, torch.float32, device, retired)
    counts = _grown(None if ws is None else ws.counts, tiles, torch.int32, device, retired)
    _WORKSPACES[device] = _Workspace(partials, counts, retired)
    return partials, counts


SMS = 132
"""Streaming multiprocessors of an H100 / H200, where the launch sizes were measured: a product
of more programs than fit at once runs in waves."""

LAYER_SIZE = 1 << 22
"""Weights of at least this many elements (8 MB in bf16), with ``K >= 2048``, take the launch
sizes measured on 1-8B layers; smaller ones (a 135M model's) keep the earlier rule."""


def decode_linear_blocks(n: int, k: int, dtype: torch.dtype, gated: bool = False) -> Blocks:
    """Launch sizes for a weight of ``n`` output columns (``n`` gate and ``n`` up rows when
    ``gated``) and ``k`` input columns: fixed by the weight's shape and dtype, never by the row
    count (they fix the order of each row's sum).

    From sweeps on an H200 (``benchmarks/scale.py --gemms --sweep``, Llama-3.2-1B and
    Llama-3.1-8B layers, bf16, 1 and 8 rows, each weight streamed from HBM):

    * a bf16 / fp16 layer weight (:data:`LAYER_SIZE`) takes 32 columns a program. When those
      tiles fill under half of :data:`SMS` (a 1B model's ``o`` and ``down``, 64 tiles), ``K``
      is split into parts of at least 2048 columns, up to two programs per SM (1B ``down``:
      14.0 -> 12.1 us). ``K`` tiles are 256 wide where the programs outnumber the SMs (two fit
      on one SM, so they run in one wave: 8B ``[q | k | v]``, 192 tiles, 18.5 -> 15.4 us), else
      512;
    * gated: 32 columns (two weight tiles a pass) up to ``n = 8192`` (1B: 21.9 -> 19.9 us), 64
      above (8B: 56.2 us against 60.6), ``K`` tiles of 256;
    * fp32 and small weights: 16 to 64 columns by ``n``, ``K`` tiles of 512 (256 in fp32).

    Four stages in flight where they fit (:func:`stages_for`)."""
    split = 1
    if gated:
        block_n, block_k = (64 if n > 8192 else 32), 256
    elif dtype != torch.float32 and n * k >= LAYER_SIZE and k >= 2048:
        block_n = 32
        tiles = triton.cdiv(n, block_n)
        if 2 * tiles <= SMS:
            split = max(1, min(k // 2048, 2 * SMS // tiles))
        block_k = 256 if tiles * split > SMS else 512
    else:
        block_n = 16 if n < 4096 else 32 if n < 16384 else 64
        block_k = 256 if dtype == torch.float32 else 512
    block_k = block_size(k, lo=16, hi=block_k)
    return Blocks(block_n=block_n, block_k=block_k, num_warps=4,
                  num_stages=stages_for(block_n, block_k, dtype, gated), split_k=split)


def stages_for(block_n: int, block_k: int, dtype: torch.dtype, gated: bool = False) -> int:
    """Pipeline stages in flight for tiles of ``block_n`` weight rows (twice that when
    ``gated``) and ``BLOCK_M`` rows of ``x`` by ``block_k`` columns: as many as fit in
    :data:`SHARED_BYTES`, one to four."""
    stage = (BLOCK_M + block_n * (2 if gated else 1)) * block_k * dtype.itemsize
    return max(1, min(4, SHARED_BYTES // stage))


def decode_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                  gated: bool = False, residual: torch.Tensor | None = None,
                  out: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                  blocks: Blocks | None = None, pdl: bool = False,
                  prefetch: int = 0) -> torch.Tensor:
    """Kernel form of :func:`decode_linear_reference` (same arguments and result), one launch.

    ``x: [M, K]`` and ``weight: [N, K]`` share a dtype and have contiguous rows; ``residual``
    and ``out``: ``[M, N]`` (``[M, N/2]`` when ``gated``), ``out`` may be
    ``residual``; ``out_dtype`` (default ``x``'s) may be wider than ``x``'s dtype. Launch
    sizes come from :func:`decode_linear_blocks` unless ``blocks`` forces them (a benchmark's
    sweep); with ``blocks.split_k > 1`` the launch uses the device's :func:`split_workspace`.

    ``pdl``: launch with programmatic dependent launch where the device has it
    (:func:`~draftsmith.kernels.pdl_on`): each program first asks L2 for its first
    ``prefetch`` weight tiles (the weight depends on no earlier kernel), then waits for the
    kernel before; the next kernel may start once every program's products are done. The bits
    are the same either way.
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
    b = decode_linear_blocks(n, k, x.dtype, gated) if blocks is None else blocks
    parts, k_part = split_parts(k, b.block_k, b.split_k)
    on = pdl_on(pdl, x)
    line = max(1, 128 // x.element_size())  # elements of a 128-byte line
    pf = dict(PDL=on, PF_TILES=max(0, int(prefetch)) if on else 0,
              PF_LINES=max(1, b.block_k // line), PF_LINE=line, **pdl_kwargs(on))
    if parts > 1:
        _launch_split(x, weight, bias, residual, out, gated, b, parts, k_part, pf)
        return out
    _decode_linear_kernel[(triton.cdiv(m, BLOCK_M), triton.cdiv(n, b.block_n))](
        x, weight, or_dummy(bias, weight), or_dummy(residual, out), out,
        m, n, k, x.stride(0), weight.stride(0), row_stride(residual), out.stride(0),
        HAS_BIAS=bias is not None, GATED=gated, RESIDUAL=residual is not None,
        IEEE=x.dtype == torch.float32,
        BLOCK_M=BLOCK_M, BLOCK_N=b.block_n, BLOCK_K=b.block_k, STAGES=b.num_stages,
        num_warps=b.num_warps, num_stages=b.num_stages, **pf)
    return out


def _launch_split(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  residual: torch.Tensor | None, out: torch.Tensor, gated: bool, b: Blocks,
                  parts: int, k_part: int, pf: dict[str, Any]) -> None:
    """:func:`decode_linear`'s split-``K`` launch (arguments checked there): ``parts``
    programs per ``[BLOCK_M, block_n]`` tile of ``out: [M, N]``, each over ``k_part`` input
    columns, on the device's shared :func:`split_workspace`; ``pf``: the PDL and prefetch
    launch options."""
    m, n, k = int(x.shape[0]), int(out.shape[1]), int(x.shape[1])
    tiles_m, tiles_n = triton.cdiv(m, BLOCK_M), triton.cdiv(n, b.block_n)
    floats = tiles_m * tiles_n * parts * (2 if gated else 1) * BLOCK_M * b.block_n
    partials, counts = split_workspace(x.device, floats, tiles_m * tiles_n)
    _decode_linear_split_kernel[(tiles_m, tiles_n, parts)](
        x, weight, or_dummy(bias, weight), or_dummy(residual, out), out, partials, counts,
        m, n, k, k_part, x.stride(0), weight.stride(0), row_stride(residual), out.stride(0),
        HAS_BIAS=bias is not None, GATED=gated, RESIDUAL=residual is not None,
        IEEE=x.dtype == torch.float32, PARTS=parts,
        BLOCK_M=BLOCK_M, BLOCK_N=b.block_n, BLOCK_K=b.block_k, STAGES=b.num_stages,
        num_warps=b.num_warps, num_stages=b.num_stages, **pf)


__all__ = ["BLOCK_M", "Blocks", "decode_linear", "decode_linear_blocks",
           "decode_linear_reference", "split_parts", "split_workspace", "stages_for"]
