"""Per-rank (value, global index) pair of a logits shard, packed for the vocab-parallel exchange.

Owns ``argmax_pair`` (one rank's pair, written into its slot of the staging row) and its eager
reference; the pair reduction it shares with ``gumbel_pair`` lives in
:mod:`draftsmith.kernels._pair`. Imports ``draftsmith.contract`` only.

Each program of the ``(row, chunk)`` launch loads ``UNROLL`` tiles before it reduces them (loads
in flight are what a memory-bound scan needs), keeping a running order-T best per lane.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.kernels._launch import block_size
from draftsmith.kernels._pair import (
    CANONICAL_NAN_BITS,
    EXCHANGE_COLUMNS,
    PairScratch,
    canonical_nan,
    check_pair_args,
    finish_lanes,
    lane_step,
    launch_pair,
)


def argmax_pair_reference(
    logits: torch.Tensor, vocab_start: int = 0, out: torch.Tensor | None = None, slot: int = 0
) -> torch.Tensor:
    """Order-T argmax of each row, written as an fp32 pair into a zero-padded staging row.

    ``logits: [rows, S]`` fp32, bf16 or fp16 (unit stride along ``S``; rows may be strided) is the
    shard covering global ids ``vocab_start .. vocab_start + S - 1``. ``out: [rows, C] float32``
    (``C`` even, ``2 * slot + 2 <= C``; allocated as ``[rows, 2 * slot + 2]`` when ``None``) is
    overwritten entirely and returned::

        loc              = argmax_T(logits[row])                  torch.argmax order (NaN wins)
        out[row, 2*slot]   = float(vocab_start + loc)               exact, V < 2**24
        out[row, 2*slot+1] = float(logits[row, loc])                widened bit-exactly
        out[row, other]    = +0.0

    A NaN value is written with the bits ``0x7FFF0000`` whatever its payload, which is what
    torch's bf16 ``max`` produces; the sign of a ``±0.0`` maximum is kept (it is the element's).
    """
    out = check_pair_args("argmax_pair", logits, vocab_start, out, slot)
    loc = torch.argmax(logits, dim=-1)
    val = logits.gather(1, loc[:, None])[:, 0].to(torch.float32)
    val = torch.where(torch.isnan(val), canonical_nan(val.device), val)
    out.zero_()
    out[:, 2 * slot] = (loc + vocab_start).to(torch.float32)
    out[:, 2 * slot + 1] = val
    return out


@triton.jit(do_not_specialize=["tiles", "n_chunks"])
def _argmax_pair_kernel(
    x_ptr, x_row_stride, S, out_ptr, out_row_stride, C, vocab_start, slot,
    part_val_ptr, part_idx_ptr, count_ptr, tiles, n_chunks,
    BLOCK_C: tl.constexpr, BLOCK_OUT: tl.constexpr, TREE: tl.constexpr,
    BLOCK: tl.constexpr, UNROLL: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    lanes = tl.arange(0, BLOCK)
    first = chunk * tiles * BLOCK
    # columns >= S load -inf: never taken, and they lose every tie on index
    best_val = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = first + lanes
    base = x_ptr + row.to(tl.int64) * x_row_stride
    for t in range(0, tiles, UNROLL):  # UNROLL divides tiles; all loads issue before updates
        c0 = first + t * BLOCK + lanes
        x0 = tl.load(base + c0, mask=c0 < S, other=float("-inf"))
        if UNROLL >= 2:
            c1 = c0 + BLOCK
            x1 = tl.load(base + c1, mask=c1 < S, other=float("-inf"))
        if UNROLL >= 4:
            c2 = c1 + BLOCK
            c3 = c2 + BLOCK
            x2 = tl.load(base + c2, mask=c2 < S, other=float("-inf"))
            x3 = tl.load(base + c3, mask=c3 < S, other=float("-inf"))
        if UNROLL >= 8:
            c4 = c3 + BLOCK
            c5 = c4 + BLOCK
            c6 = c5 + BLOCK
            c7 = c6 + BLOCK
            x4 = tl.load(base + c4, mask=c4 < S, other=float("-inf"))
            x5 = tl.load(base + c5, mask=c5 < S, other=float("-inf"))
            x6 = tl.load(base + c6, mask=c6 < S, other=float("-inf"))
            x7 = tl.load(base + c7, mask=c7 < S, other=float("-inf"))
        best_val, best_idx = lane_step(best_val, best_idx, x0.to(tl.float32), c0)
        if UNROLL >= 2:
            best_val, best_idx = lane_step(best_val, best_idx, x1.to(tl.float32), c1)
        if UNROLL >= 4:
            best_val, best_idx = lane_step(best_val, best_idx, x2.to(tl.float32), c2)
            best_val, best_idx = lane_step(best_val, best_idx, x3.to(tl.float32), c3)
        if UNROLL >= 8:
            best_val, best_idx = lane_step(best_val, best_idx, x4.to(tl.float32), c4)
            best_val, best_idx = lane_step(best_val, best_idx, x5.to(tl.float32), c5)
            best_val, best_idx = lane_step(best_val, best_idx, x6.to(tl.float32), c6)
            best_val, best_idx = lane_step(best_val, best_idx, x7.to(tl.float32), c7)
    finish_lanes(best_val, best_idx, row, chunk, n_chunks, out_ptr, out_row_stride, C,
                 vocab_start, slot, part_val_ptr, part_idx_ptr, count_ptr, BLOCK_C, BLOCK_OUT,
                 TREE)


def _launch_sizes(rows: int, shard_width: int, itemsize: int,
                  device: torch.device) -> tuple[int, int, int, bool]:
    """``(BLOCK, UNROLL, num_warps, TREE)`` of an ``argmax_pair`` launch.

    On a GPU (sizes picked with ``benchmarks/selection.py`` on an H200): 2 KiB tiles, 8 in
    flight per loop trip, the tree lane reduction; 1 KiB tiles for shards under 4 MiB (one to a
    few decode rows, bound by dependent round trips) and 8 warps from 24 MiB (bandwidth-bound).
    The interpreter gets 4 KiB tiles, two per trip and the four-reduction form (fast in numpy).
    """
    nbytes = rows * shard_width * itemsize
    if device.type != "cuda":
        block_bytes, unroll, num_warps, tree = 4096, 2, 4, False
    else:
        block_bytes, unroll, tree = (1024 if nbytes < 4 << 20 else 2048), 8, True
        num_warps = 8 if nbytes >= 24 << 20 else 4
    block = block_size(shard_width, lo=16, hi=max(16, block_bytes // itemsize))
    unroll = block_size(triton.cdiv(shard_width, block), hi=unroll)
    return block, unroll, num_warps, tree


_SCRATCH = PairScratch()


def argmax_pair(
    logits: torch.Tensor, vocab_start: int = 0, out: torch.Tensor | None = None, slot: int = 0
) -> torch.Tensor:
    """Triton form of :func:`argmax_pair_reference` (same arguments, identical bits)."""
    out = check_pair_args("argmax_pair", logits, vocab_start, out, slot)
    rows, shard_width = logits.shape
    if rows == 0:
        return out
    block, unroll, num_warps, tree = _launch_sizes(rows, shard_width, logits.element_size(),
                                                   logits.device)
    return launch_pair(_argmax_pair_kernel, _SCRATCH, (logits, logits.stride(0), shard_width),
                       out, vocab_start, slot, triton.cdiv(shard_width, block), unroll,
                       num_warps, tree, BLOCK=block, UNROLL=unroll)


__all__ = [
    "CANONICAL_NAN_BITS",
    "EXCHANGE_COLUMNS",
    "argmax_pair",
    "argmax_pair_reference",
    "canonical_nan",
]
