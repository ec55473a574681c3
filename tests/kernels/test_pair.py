"""The shared pair pieces of ``kernels/_pair.py``, each against torch on odd shapes (fp32, so they
run on the CPU interpreter): the order-T tile argmax and its merge, the per-lane scan, the lane
reduction (both forms), the chunk merge (one program per row gets the pair, the counter is reset),
the staging-row writer, the launch split, and the host-side argument checks.

Order T is ``torch.argmax``'s: the first NaN wins, else the first maximum (``-0.0 == +0.0``)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError
from draftsmith.kernels import _pair
from draftsmith.kernels import argmax_pair as ap
from draftsmith.kernels._pair import (  # the @triton.jit pieces, called by name in the kernels
    lane_argmax,
    lane_step,
    merge_argmax_t,
    reduce_lanes,
    tile_argmax_t,
    write_pair_row,
)

NAN = float("nan")
INF = float("inf")
EMPTY_INDEX = 2**62
"""The index ``tile_argmax_t`` and ``merge_argmax_t`` give a row without a valid column."""


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def odd_rows(width: int) -> torch.Tensor:
    """Nine ``[9, width]`` fp32 rows of the cases order T pins down, ties on odd borders."""
    x = torch.randn(9, width, generator=torch.Generator().manual_seed(width)) - 4
    x[0, width // 3] = INF
    x[0, width - 2] = NAN  # a late NaN beats an earlier +inf
    x[1] = -INF  # all -inf: column 0
    for j in (5, 13, width // 2, width - 1):
        x[2, j] = 7.0  # ties of the maximum across lane, tile and chunk borders: the first
    x[3] = -1.0
    x[3, 6] = -0.0
    x[3, 11] = 0.0  # -0.0 == +0.0: the first one, with its sign
    x[4] = 0.25  # all equal: column 0
    x[5, width - 1] = NAN
    x[5, 9] = NAN  # the first NaN
    x[6, width - 1] = INF
    x[6, 1] = INF
    x[7] = -INF
    x[7, width - 1] = -3.0e38  # the only finite value, last
    return x


def expected_pairs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(value, index)`` of each row's order-T maximum; a NaN value has the canonical bits."""
    idx = torch.argmax(x, dim=-1)
    val = x.gather(1, idx[:, None])[:, 0]
    return torch.where(torch.isnan(val), _pair.canonical_nan(), val), idx


# ---- order-T tile argmax and merge ----------------------------------------------------------


@triton.jit
def _scan_tiles_kernel(x_ptr, R, S, val_ptr, idx_ptr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """One program scans ``x: [R, S]`` tile by tile: tile_argmax_t, then merge_argmax_t. Rows
    ``R .. ROWS - 1`` have no valid column; columns past ``S`` load NaN, which must not win."""
    rows = tl.arange(0, ROWS)
    best_val = tl.full([ROWS], float("-inf"), tl.float32)
    best_idx = tl.full([ROWS], 2**62, tl.int64)
    for s0 in range(0, S, BLOCK):
        cols = s0 + tl.arange(0, BLOCK)
        valid = (rows < R)[:, None] & (cols < S)[None, :]
        x = tl.load(x_ptr + rows[:, None] * S + cols[None, :], mask=valid, other=float("nan"))
        val, idx = tile_argmax_t(x, cols[None, :], valid)
        best_val, best_idx = merge_argmax_t(best_val, best_idx, val, idx)
    tl.store(val_ptr + rows, best_val)
    tl.store(idx_ptr + rows, best_idx)


@pytest.mark.parametrize("width,block", [(77, 16), (77, 128), (33, 8)])
def test_tile_argmax_and_merge_are_order_t(width: int, block: int) -> None:
    x = odd_rows(width)
    rows = triton.next_power_of_2(x.shape[0] + 1)  # at least one row without a valid column
    val = torch.empty(rows)
    idx = torch.empty(rows, dtype=torch.int64)
    _scan_tiles_kernel[(1,)](x, x.shape[0], width, val, idx, ROWS=rows, BLOCK=block)
    want_val, want_idx = expected_pairs(x)
    real = slice(0, x.shape[0])
    assert torch.equal(idx[real], want_idx)
    assert torch.equal(torch.isnan(val[real]), torch.isnan(want_val))
    # the value is the tile's maximum, so only its magnitude is defined for a -0.0/+0.0 tie
    assert torch.equal(val[real].nan_to_num(), want_val.nan_to_num())
    assert torch.equal(val[x.shape[0]:], torch.full((rows - x.shape[0],), -INF))
    assert torch.equal(idx[x.shape[0]:], torch.full((rows - x.shape[0],), EMPTY_INDEX))


# ---- lane reduction -------------------------------------------------------------------------


@triton.jit
def _lane_argmax_kernel(vals_ptr, idxs_ptr, N, val_ptr, idx_ptr, BLOCK: tl.constexpr,
                        TREE: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    vals = tl.load(vals_ptr + lanes, mask=lanes < N, other=float("-inf"))
    idxs = tl.load(idxs_ptr + lanes, mask=lanes < N, other=2147483647)
    val, idx = lane_argmax(vals, idxs, TREE)
    tl.store(val_ptr, val)
    tl.store(idx_ptr, idx)


@pytest.mark.parametrize("tree", [False, True], ids=["four-reductions", "tree"])
def test_lane_argmax_orders_by_index_not_by_lane(tree: bool) -> None:
    """Lanes hold distinct, shuffled indices: ties go to the lowest index wherever its lane is;
    the winner keeps its own bits (a ``-0.0``), a NaN comes back canonical."""
    x = odd_rows(45)
    order = torch.randperm(45, generator=torch.Generator().manual_seed(3))
    want_val, want_idx = expected_pairs(x)
    for r in range(x.shape[0]):
        val = torch.empty(1)
        idx = torch.empty(1, dtype=torch.int32)
        lanes_idx = order.to(torch.int32)
        _lane_argmax_kernel[(1,)](x[r, order].contiguous(), lanes_idx, 45, val, idx, BLOCK=64,
                                  TREE=tree)
        assert int(idx) == int(want_idx[r]), r
        assert torch.equal(bits(val), bits(want_val[r:r + 1])), r


# ---- lane scan and chunk merge --------------------------------------------------------------


@triton.jit
def _scan_and_reduce_kernel(x_ptr, S, tiles, n_chunks, part_val_ptr, part_idx_ptr, count_ptr,
                            lane_val_ptr, lane_idx_ptr, val_ptr, idx_ptr, last_ptr,
                            BLOCK: tl.constexpr, BLOCK_C: tl.constexpr, TREE: tl.constexpr):
    """Program ``(row, chunk)`` scans its chunk's lanes with lane_step, stores each lane's best,
    then stores what reduce_lanes hands it."""
    program = tl.program_id(0) * n_chunks + tl.program_id(1)
    start = tl.program_id(1) * tiles * BLOCK + tl.arange(0, BLOCK)
    lane_val = tl.full([BLOCK], float("-inf"), tl.float32)
    lane_idx = start
    for t in range(tiles):
        cols = start + t * BLOCK
        x = tl.load(x_ptr + tl.program_id(0) * S + cols, mask=cols < S, other=float("-inf"))
        lane_val, lane_idx = lane_step(lane_val, lane_idx, x, cols)
    tl.store(lane_val_ptr + program * BLOCK + tl.arange(0, BLOCK), lane_val)
    tl.store(lane_idx_ptr + program * BLOCK + tl.arange(0, BLOCK), lane_idx)
    val, idx, last = reduce_lanes(lane_val, lane_idx, tl.program_id(0), tl.program_id(1),
                                  n_chunks, part_val_ptr, part_idx_ptr, count_ptr, BLOCK_C, TREE)
    tl.store(val_ptr + program, val)
    tl.store(idx_ptr + program, idx)
    tl.store(last_ptr + program, last.to(tl.int32))


@pytest.mark.parametrize("width,block,tiles", [(77, 8, 3), (77, 8, 1), (19, 32, 1)])
@pytest.mark.parametrize("tree", [False, True], ids=["four-reductions", "tree"])
def test_lane_scan_and_chunk_merge(width: int, block: int, tiles: int, tree: bool) -> None:
    """Each lane's best is order T over its own columns (its first column when it sees only
    -inf or nothing); the last program of a row to count holds the row's pair, alone, and resets
    the row's counter."""
    x = odd_rows(width)
    rows = x.shape[0]
    n_chunks = triton.cdiv(triton.cdiv(width, block), tiles)
    programs = rows * n_chunks
    counts = torch.zeros(rows, dtype=torch.int32)
    parts = (torch.empty(programs), torch.empty(programs, dtype=torch.int32))
    lane_val = torch.empty(programs, block)
    lane_idx = torch.empty(programs, block, dtype=torch.int32)
    val = torch.empty(programs)
    idx = torch.empty(programs, dtype=torch.int32)
    last = torch.empty(programs, dtype=torch.int32)
    _scan_and_reduce_kernel[(rows, n_chunks)](
        x, width, tiles, n_chunks, *parts, counts, lane_val, lane_idx, val, idx, last,
        BLOCK=block, BLOCK_C=16, TREE=tree,
    )

    # lane j of chunk c sees columns c * tiles * block + j + t * block, -inf past the row
    padded = torch.full((rows, n_chunks * tiles * block), -INF)
    padded[:, :width] = x
    seen = padded.view(rows, n_chunks, tiles, block).transpose(2, 3)
    pick = torch.argmax(seen, dim=-1)
    first = (torch.arange(n_chunks)[:, None] * tiles * block + torch.arange(block)).expand(
        rows, -1, -1)
    assert torch.equal(lane_idx.view(rows, n_chunks, block).long(), first + pick * block)
    assert torch.equal(bits(lane_val.view(rows, n_chunks, block)),
                       bits(seen.gather(-1, pick[..., None])[..., 0]))

    last = last.view(rows, n_chunks).bool()
    assert torch.equal(last.sum(1), torch.ones(rows, dtype=torch.int64))
    if n_chunks > 1:  # the interpreter runs programs in order: the last chunk counts last
        assert bool(last[:, -1].all())
    want_val, want_idx = expected_pairs(x)
    assert torch.equal(idx.view(rows, n_chunks)[last].long(), want_idx)
    assert torch.equal(bits(val.view(rows, n_chunks)[last]), bits(want_val))
    assert not counts.any()


# ---- staging row ----------------------------------------------------------------------------


@triton.jit
def _write_rows_kernel(out_ptr, out_row_stride, C, slot, idx_ptr, val_ptr,
                       BLOCK_OUT: tl.constexpr):
    row = tl.program_id(0)
    write_pair_row(out_ptr + row * out_row_stride, C, slot, tl.load(idx_ptr + row),
                   tl.load(val_ptr + row), BLOCK_OUT)


@pytest.mark.parametrize("columns,slot", [(6, 0), (6, 2), (2, 0), (10, 3)])
def test_write_pair_row_fills_exactly_c_columns(columns: int, slot: int) -> None:
    """``C`` columns of each row are written (the pair in its slot, +0.0 elsewhere, a -0.0 or
    NaN value bit for bit); the row's columns past ``C`` are left alone."""
    idx = torch.tensor([0, 77, _pair.MAX_EXACT_INDEX - 1], dtype=torch.int32)
    val = torch.stack([torch.tensor(-0.0), _pair.canonical_nan(), torch.tensor(-3.5)])
    out = torch.full((3, columns + 3), NAN)
    _write_rows_kernel[(3,)](out, out.stride(0), columns, slot, idx, val,
                             BLOCK_OUT=triton.next_power_of_2(columns))
    want = torch.zeros(3, columns)
    want[:, 2 * slot] = idx.float()
    want[:, 2 * slot + 1] = val
    assert torch.equal(bits(out[:, :columns]), bits(want))
    assert bool(torch.isnan(out[:, columns:]).all())


# ---- the launch split -----------------------------------------------------------------------


@pytest.mark.parametrize("programs_per_sm", [1, 24])
@pytest.mark.parametrize("tree", [False, True], ids=["four-reductions", "tree"])
def test_launch_pair_splits_long_rows_into_chunks(programs_per_sm: int, tree: bool) -> None:
    """One program per row when the row count fills the slots (the scratch stays unused), else
    several chunks a row through the scratch, whose counters end at zero; the same pairs either
    way."""
    x = odd_rows(300)
    scratch = _pair.PairScratch()
    out = torch.full((x.shape[0], 6), NAN)
    block, unroll = 16, 2
    _pair.launch_pair(ap._argmax_pair_kernel, scratch, (x, x.stride(0), x.shape[1]), out, 11, 1,
                      triton.cdiv(x.shape[1], block), unroll, 4, tree,
                      programs_per_sm=programs_per_sm, BLOCK=block, UNROLL=unroll)
    want_val, want_idx = expected_pairs(x)
    want = torch.zeros_like(out)
    want[:, 2] = (want_idx + 11).float()
    want[:, 3] = want_val
    assert torch.equal(bits(out), bits(want))
    used = scratch._by_device.get(torch.device("cpu"))
    assert (used is not None) == (programs_per_sm * _pair.sm_count(x.device) >= 2 * x.shape[0])
    assert used is None or not used[0].any()


# ---- host side ------------------------------------------------------------------------------


def test_canonical_nan_and_sm_count_off_cuda() -> None:
    assert int(bits(_pair.canonical_nan().reshape(1))) == _pair.CANONICAL_NAN_BITS
    assert torch.isnan(_pair.canonical_nan())
    assert _pair.sm_count(torch.device("cpu")) == 1


def test_check_pair_args_allocates_a_zero_row_up_to_the_slot() -> None:
    out = _pair.check_pair_args("op", torch.randn(5, 7), 3, None, 2)
    assert out.shape == (5, 6) and out.dtype == torch.float32 and not out.any()
    given = torch.empty(5, 8)
    assert _pair.check_pair_args("op", torch.randn(5, 7), 0, given, 3) is given


@pytest.mark.parametrize("logits,vocab_start,out,slot,match", [
    (torch.randn(3, 0), 0, None, 0, "at least one column"),
    (torch.randn(3, 7), 0, None, -1, "slot"),
    (torch.randn(3, 7), 0, None, True, "slot"),
    (torch.randn(3, 7), -2, None, 0, "vocab_start"),
    (torch.randn(3, 7), _pair.MAX_EXACT_INDEX - 6, None, 0, "2\\*\\*24"),
    (torch.randn(3, 7), 0, torch.zeros(3, 5), 0, "even count"),
    (torch.randn(3, 7), 0, torch.zeros(3, 6), 3, "2 \\* slot \\+ 2 = 8"),
    (torch.randn(3, 7), 0, torch.zeros(4, 6), 0, "rows"),
])
def test_check_pair_args_rejects(logits: torch.Tensor, vocab_start: int,
                                 out: torch.Tensor | None, slot: int, match: str) -> None:
    with pytest.raises(ShapeError, match=match):
        _pair.check_pair_args("op", logits, vocab_start, out, slot)
