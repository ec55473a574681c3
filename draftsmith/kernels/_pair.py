"""Order-T argmax pieces shared by the kernels, and the pair reduction of ``argmax_pair`` and
``gumbel_pair``: each rank's best (value, global id) pair, written into its columns of a
zero-padded staging row that one SUM all-reduce exchanges.

Order T is the total order of ``torch.argmax``: a NaN beats every non-NaN value (lowest index
among NaNs), otherwise the larger value wins with ``-0.0 == +0.0``, and ties go to the lowest
index.

Owns the tile reduction and merge of ``strict_accept`` and ``markov_step``, the staging-row
constants, the checks of the common pair arguments, the ``@triton.jit`` pieces of a pair kernel
(lane step, lane reduction, chunk merge, staging-row writer; ``reduce_lanes`` hands the row's
pair to a kernel that finishes it itself, as ``gumbel_pair`` draws inside its winning group),
the split of a launch over ``(row, chunk)`` and the per-device scratch of the chunk merge.
Imports ``draftsmith.contract`` only.

A pair kernel is ONE launch over ``(row, chunk)``. Each program scans its chunk tile by tile,
keeping a running order-T best per lane, and reduces its lanes at the end. When a row has several
chunks, each program stores its partial pair and bumps the row's counter; the program that counts
last merges the row's pairs in chunk order, writes the staging row and resets the counter to 0
for the next launch or graph replay. So a handful of rows still spreads over the whole GPU,
without a second launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels._launch import block_size

EXCHANGE_COLUMNS = 128
"""Width of the zero-padded fp32 staging row of the SUM exchange; ``2 * TP <= 128``."""

CANONICAL_NAN_BITS = 0x7FFF0000
"""fp32 bit pattern of a NaN pair value: torch's bf16 ``max`` NaN (``0x7FFF``) widened."""

MAX_EXACT_INDEX = 2**24
"""Global ids travel as fp32 values, exact only below ``2**24``: the largest vocabulary that
vocab-parallel selection takes."""

PROGRAMS_PER_SM = 4
"""Programs in flight per SM that a row split aims at: ``rows * n_chunks <= SMs * 4``."""


def canonical_nan(device: torch.device | str = "cpu") -> torch.Tensor:
    """The fp32 scalar NaN with bits :data:`CANONICAL_NAN_BITS`."""
    return torch.tensor(CANONICAL_NAN_BITS, dtype=torch.int32, device=device).view(torch.float32)


def check_pair_args(op: str, logits: torch.Tensor, vocab_start: int, out: torch.Tensor | None,
                    slot: int) -> torch.Tensor:
    """Validate the arguments every pair op shares; return ``out`` (allocated when ``None``)."""
    sizes: dict[str, int] = {}
    check_tensor(f"{op}: logits", logits, ("rows", "S"), FLOAT_DTYPES, sizes, unit_stride=True)
    if logits.shape[1] == 0:
        raise ShapeError(f"{op}: logits must have at least one column")
    if type(slot) is not int or slot < 0:
        raise ShapeError(f"{op}: slot must be an int >= 0 (the rank), got {slot!r}")
    if type(vocab_start) is not int or vocab_start < 0:
        raise ShapeError(f"{op}: vocab_start must be an int >= 0, got {vocab_start!r}")
    if vocab_start + logits.shape[1] > MAX_EXACT_INDEX:
        raise ShapeError(
            f"{op}: global ids up to {vocab_start + logits.shape[1]} are not exact in fp32; "
            f"vocab-parallel pairs need V < 2**24, gather the logits instead"
        )
    if out is None:
        return torch.zeros(logits.shape[0], 2 * slot + 2, dtype=torch.float32,
                           device=logits.device)
    check_tensor(f"{op}: out", out, ("rows", "C"), torch.float32, sizes, device=logits.device,
                 unit_stride=True, distinct_rows=True)
    if out.shape[1] % 2 or 2 * slot + 2 > out.shape[1]:
        raise ShapeError(
            f"{op}: out has {out.shape[1]} columns; it needs an even count >= 2 * slot + 2 = "
            f"{2 * slot + 2} (use EXCHANGE_COLUMNS = {EXCHANGE_COLUMNS} for TP <= 64)"
        )
    return out


@triton.jit
def tile_argmax_t(x, cols, valid):
    """Order-T (value, index) of each row of ``x: [R, C] fp32`` along axis 1.

    ``cols: [C]`` (or ``[R, C]``) are the global column indices of the tile and ``valid`` masks the
    columns that exist; invalid entries never win. A row without a valid column returns
    ``(-inf, 2**62)`` so that any real candidate replaces it.
    """
    is_nan = (x != x) & valid
    any_nan = tl.max(is_nan.to(tl.int32), axis=1) > 0
    finite_or_inf = tl.where(valid & (x == x), x, float("-inf"))
    best = tl.max(finite_or_inf, axis=1)
    hit = tl.where(any_nan[:, None], is_nan, valid & (finite_or_inf == best[:, None]))
    # column ids fit int32 (V < 2**24: ids travel as exact fp32 values); reduce in int32 to halve
    # register pressure
    big = tl.full(hit.shape, 2**31 - 1, tl.int32)
    idx32 = tl.min(tl.where(hit, cols.to(tl.int32), big), axis=1)
    idx = tl.where(idx32 == 2**31 - 1, 2**62, idx32.to(tl.int64))
    val = tl.where(any_nan, float("nan"), best)
    return val, idx


@triton.jit
def merge_argmax_t(best_val, best_idx, new_val, new_idx):
    """Merge a running order-T best with the best of a tile of strictly higher indices.

    The later candidate replaces the running one only when it is strictly larger, or when it is
    a NaN and the running one is not (or when the running one is the empty sentinel); the
    first-seen candidate keeps every tie.
    """
    best_nan = best_val != best_val
    new_nan = new_val != new_val
    empty = best_idx == 2**62
    take = empty | (new_nan & ~best_nan) | (~best_nan & ~new_nan & (new_val > best_val))
    return tl.where(take, new_val, best_val), tl.where(take, new_idx, best_idx)


@triton.jit
def lane_step(best_val, best_idx, x, cols):
    """Merge a tile ``x`` (fp32) at columns ``cols`` into the per-lane running best.

    Lanes start as ``(-inf, their first column)`` and see their columns in increasing order, so
    a lane takes ``x`` only when it is strictly larger, or a NaN over a non-NaN (``~(x <= b)`` is
    one compare); ties keep the earlier column. A lane that only sees ``-inf`` keeps its first
    column, which is the order-T answer for it.
    """
    take = ~(x <= best_val) & (best_val == best_val)
    return tl.where(take, x, best_val), tl.where(take, cols, best_idx)


@triton.jit
def _pick_t(v1, i1, v2, i2):
    """Order-T combine of two ``(value, index)`` candidates (associative and commutative): a NaN
    beats a non-NaN, else the larger value, ties (NaN/NaN, ``-0.0 == +0.0``) to the lower index;
    the winner keeps its own bits."""
    n1 = v1 != v1
    n2 = v2 != v2
    tie = (v2 == v1) | (n1 & n2)
    second = (n2 & ~n1) | (v2 > v1) | (tie & (i2 < i1))
    return tl.where(second, v2, v1), tl.where(second, i2, i1)


@triton.jit
def lane_argmax(vals, idxs, TREE: tl.constexpr):
    """Order-T winner ``(value, index)`` over lanes ``vals: [N] fp32`` with distinct
    ``idxs: [N] int32``; a winning NaN comes back as the canonical ``0x7FFF0000``, a ``±0.0`` with
    its sign.

    ``TREE``: one ``tl.reduce`` of pairs with :func:`_pick_t` (half the block barriers on a GPU);
    otherwise four plain reductions (the same bits; fast on the CPU interpreter).
    """
    if TREE:
        val, idx = tl.reduce((vals, idxs), 0, _pick_t)
        is_nan = val != val
    else:
        nans = vals != vals
        is_nan = tl.max(nans.to(tl.int32), 0) > 0
        clean = tl.where(nans, float("-inf"), vals)
        top = tl.max(clean, 0)
        idx = tl.min(tl.where(tl.where(is_nan, nans, clean == top), idxs, 2147483647), 0)
        val = tl.max(tl.where(idxs == idx, clean, float("-inf")), 0)
    nan = tl.full([], 2147418112, tl.int32).to(tl.float32, bitcast=True)  # 0x7FFF0000
    return tl.where(is_nan, nan, val), idx


@triton.jit
def write_pair_row(row_ptr, C, slot, idx, val, BLOCK_OUT: tl.constexpr):
    """Write a whole staging row: ``idx`` (fp32) at ``2*slot``, ``val`` at ``2*slot+1``, +0.0
    elsewhere."""
    cols = tl.arange(0, BLOCK_OUT)
    row = tl.where(cols == 2 * slot, idx.to(tl.float32), tl.where(cols == 2 * slot + 1, val, 0.0))
    tl.store(row_ptr + cols, row, mask=cols < C)


@triton.jit
def reduce_lanes(best_val, best_idx, row, chunk, n_chunks, part_val_ptr, part_idx_ptr, count_ptr,
                 BLOCK_C: tl.constexpr, TREE: tl.constexpr):
    """Reduce the lanes ``best_val: [N] fp32``, ``best_idx: [N] int32`` of program
    ``(row, chunk)`` to the row's order-T pair; returns ``(val, idx, last)``.

    One chunk: the program's own lane winner, ``last`` true. Several: store the partial pair and
    count the chunk on the row's counter (acq_rel); the program that counts last merges the
    ``n_chunks`` pairs in order T, resets the counter and gets ``last`` true. ``(val, idx)`` is
    the row's pair only where ``last`` holds; exactly one program per row sees it.
    """
    val, idx = lane_argmax(best_val, best_idx, TREE)
    last = n_chunks == 1
    if n_chunks > 1:
        part = row.to(tl.int64) * n_chunks
        tl.store(part_val_ptr + part + chunk, val)
        tl.store(part_idx_ptr + part + chunk, idx)
        tl.debug_barrier()  # every thread's partial store precedes the release below
        done = tl.atomic_add(count_ptr + row, 1, sem="acq_rel")
        last = done == n_chunks - 1
        if last:
            c = tl.arange(0, BLOCK_C)
            m = c < n_chunks
            # .cg: read at L2, never a stale L1 line of another row's merge on this SM
            vals = tl.load(part_val_ptr + part + c, mask=m, other=float("-inf"),
                           cache_modifier=".cg")
            idxs = tl.load(part_idx_ptr + part + c, mask=m, other=2147483647,
                           cache_modifier=".cg")
            val, idx = lane_argmax(vals, idxs, TREE)
            tl.store(count_ptr + row, 0)
    return val, idx, last


@triton.jit
def finish_lanes(best_val, best_idx, row, chunk, n_chunks, out_ptr, out_row_stride, C,
                 vocab_start, slot, part_val_ptr, part_idx_ptr, count_ptr,
                 BLOCK_C: tl.constexpr, BLOCK_OUT: tl.constexpr, TREE: tl.constexpr):
    """:func:`reduce_lanes` over shard columns, then the program holding the row's pair writes
    its staging row (global id ``idx + vocab_start``)."""
    val, idx, last = reduce_lanes(best_val, best_idx, row, chunk, n_chunks, part_val_ptr,
                                  part_idx_ptr, count_ptr, BLOCK_C, TREE)
    if last:
        write_pair_row(out_ptr + row.to(tl.int64) * out_row_stride, C, slot, idx + vocab_start,
                       val, BLOCK_OUT)


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (1 off CUDA: the interpreter runs one program at a
    time, so a split there only exercises the merge)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


class PairScratch:
    """Per-device scratch of one op's chunk merge: ``counts: [rows] int32`` (all zero between
    launches: the merging program resets its row), ``part_val: [parts] float32`` and
    ``part_idx: [parts] int32``.

    Buffers are only ever replaced by larger ones, and the old ones are kept alive, because a
    captured CUDA graph holds their addresses. Launches of one op on two streams of one device
    must not overlap (they would share the counters).
    """

    def __init__(self) -> None:
        self._by_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._retired: list[torch.Tensor] = []

    def get(self, device: torch.device, rows: int,
            parts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``(counts, part_val, part_idx)`` with room for ``rows`` and ``parts``, or ``None`` when
        they would have to grow inside CUDA-graph capture (no zero fill may run then)."""
        have = self._by_device.get(device)
        if have is not None and have[0].numel() >= rows and have[1].numel() >= parts:
            return have
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        if have is not None:
            self._retired += have
        rows_cap = max(1024, triton.next_power_of_2(rows), 2 * (have[0].numel() if have else 0))
        parts_cap = max(1 << 14, triton.next_power_of_2(parts),
                        2 * (have[1].numel() if have else 0))
        have = self._by_device[device] = (
            torch.zeros(rows_cap, dtype=torch.int32, device=device),
            torch.empty(parts_cap, dtype=torch.float32, device=device),
            torch.empty(parts_cap, dtype=torch.int32, device=device),
        )
        return have


def launch_pair(kernel, scratch: PairScratch, lead_args: tuple, out: torch.Tensor,
                vocab_start: int, slot: int, total_tiles: int, unroll: int, num_warps: int,
                tree: bool, programs_per_sm: int = PROGRAMS_PER_SM, **meta) -> torch.Tensor:
    """Launch a pair kernel once over ``(rows, n_chunks)`` and return ``out``.

    The kernel's signature is ``*lead_args, out_ptr, out_row_stride, C, vocab_start, slot,
    part_val, part_idx, counts, tiles, n_chunks, BLOCK_C, BLOCK_OUT, TREE, *meta`` where
    ``tiles`` (a multiple of ``unroll``) is the tile count of one chunk. Long rows are split so
    that ``rows * n_chunks`` fills about ``programs_per_sm`` programs per SM; many rows get one
    chunk each (no partials, no counter).
    """
    rows, columns = out.shape
    slots = sm_count(out.device) * programs_per_sm
    n_chunks = max(1, min(slots // rows, triton.cdiv(total_tiles, unroll)))
    bufs = None
    if n_chunks > 1:
        bufs = scratch.get(out.device, rows, rows * n_chunks)
    if bufs is None:  # one chunk per row (also inside a capture that would need a larger scratch)
        n_chunks = 1
        bufs = (out.view(torch.int32), out, out.view(torch.int32))  # never read by one chunk
    tiles = triton.cdiv(triton.cdiv(total_tiles, n_chunks), unroll) * unroll
    n_chunks = triton.cdiv(total_tiles, tiles)
    counts, part_val, part_idx = bufs
    kernel[(rows, n_chunks)](
        *lead_args, out, out.stride(0), columns, vocab_start, slot, part_val, part_idx, counts,
        tiles, n_chunks, BLOCK_C=block_size(n_chunks, lo=128),
        BLOCK_OUT=block_size(columns), TREE=tree, num_warps=num_warps, **meta,
    )
    return out


__all__ = [
    "CANONICAL_NAN_BITS",
    "EXCHANGE_COLUMNS",
    "MAX_EXACT_INDEX",
    "PairScratch",
    "canonical_nan",
    "check_pair_args",
    "finish_lanes",
    "lane_argmax",
    "lane_step",
    "launch_pair",
    "merge_argmax_t",
    "reduce_lanes",
    "tile_argmax_t",
    "write_pair_row",
]
