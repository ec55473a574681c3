"""Per-rank (value, global index) pair of a logits shard, packed for the vocab-parallel exchange.

Owns ``argmax_pair`` (spec 5.2 and the staging row of 5.3), its eager reference, and the
``@triton.jit`` order-T helpers that ``gumbel_pair`` reuses (lane update, lane reduction, the
chunk-combine kernel and the staging-row writer). Imports ``draftsmith.contract`` only.

Layout: ONE launch over ``(row, chunk)``. Each program scans its chunk tile by tile (``UNROLL``
tiles loaded before they are reduced), keeping a running order-T best per lane. When a row has
several chunks, each program stores its partial pair and bumps the row's counter; the program
that counts last merges the row's pairs in chunk order and resets the counter (the scratch lives
in a per-device workspace). So a handful of rows still spreads over the whole GPU, without a
second launch. Launch sizes come from :func:`pick_pair_launch` / :func:`pair_launch_sizes`.

The merge has three interchangeable forms (``PairTuning.merge``, identical bits; the sweep picks):
``MERGE_PAIRS`` (partial (value, index) pairs, order-T lane reduction), ``MERGE_KEYS`` (each
pair packed into one order-T int64 key, :func:`pair_key`: the lane reductions become one
``tl.max`` and the merge loads one int64 per chunk) and ``MERGE_ATOMIC`` (each chunk folds its
key into the row's slot with one 64-bit ``atomic_max``; the last program takes the slot with
``atomic_xchg``, which also resets it for the next launch or graph replay: no partials, no
merge reduction). A fourth form, in which the row's last chunk polled the other chunks' slots
instead of taking the counter, was removed after it failed the adversarial parity test on an
H200 (2026-11-30).
"""

from __future__ import annotations

import functools
import itertools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from draftsmith.contract import ConfigError, ShapeError, check_tensor
from draftsmith.kernels._launch import FastLaunch, hooks_installed, raw_stream

EXCHANGE_COLUMNS = 128
"""Width of the zero-padded fp32 staging row of the SUM exchange (spec 5.3); ``2 * TP <= 128``."""

CANONICAL_NAN_BITS = 0x7FFF0000
"""fp32 bit pattern of a NaN pair value: torch's bf16 ``max`` NaN (``0x7FFF``) widened."""

MAX_EXACT_INDEX = 2**24
"""Global ids travel as fp32 values, exact only below ``2**24`` (spec 5.1)."""

_LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INT32_MAX = 2**31 - 1


def canonical_nan(device: torch.device | str = "cpu") -> torch.Tensor:
    """The fp32 scalar NaN with bits :data:`CANONICAL_NAN_BITS`."""
    return torch.tensor(CANONICAL_NAN_BITS, dtype=torch.int32, device=device).view(torch.float32)


def argmax_pair_reference(
    logits: torch.Tensor, vocab_start: int = 0, out: torch.Tensor | None = None, slot: int = 0
) -> torch.Tensor:
    """Order-T argmax of each row, written as an fp32 pair into a zero-padded staging row.

    ``logits: [rows, S]`` fp32, bf16 or fp16 (unit stride along ``S``; rows may be strided) is the
    shard covering global ids ``vocab_start .. vocab_start + S - 1``. ``out: [rows, C] float32``
    (``C`` even, ``2 * slot + 2 <= C``; allocated as ``[rows, 2 * slot + 2]`` when ``None``) is
    overwritten entirely and returned::

        loc              = argmax_T(logits[row])                  torch.argmax order (spec 0.3)
        out[row, 2*slot]   = float(vocab_start + loc)               exact, V < 2**24
        out[row, 2*slot+1] = float(logits[row, loc])                widened bit-exactly
        out[row, other]    = +0.0

    A NaN value is written with the bits ``0x7FFF0000`` whatever its payload, which is what
    torch's bf16 ``max`` produces; the sign of a ``±0.0`` maximum is kept (it is the element's).
    """
    out = _check_args("argmax_pair", logits, vocab_start, out, slot)
    loc = torch.argmax(logits, dim=-1)
    val = logits.gather(1, loc[:, None])[:, 0].to(torch.float32)
    val = torch.where(torch.isnan(val), canonical_nan(val.device), val)
    out.zero_()
    out[:, 2 * slot] = (loc + vocab_start).to(torch.float32)
    out[:, 2 * slot + 1] = val
    return out


# ---- order-T building blocks shared with gumbel_pair ----------------------------------------


@triton.jit
def lane_update(best_val, best_idx, x, cols, take_ok):
    """Merge a tile ``x: [BLOCK] fp32`` at columns ``cols`` into the per-lane running best.

    Tiles arrive in increasing column order, so a lane replaces its best only with a strictly
    larger value, a NaN over a non-NaN, or anything over the empty sentinel (``idx == INT32_MAX``);
    ties keep the earlier (lower) index. ``take_ok`` masks the columns that may be candidates.
    """
    new_nan = x != x
    old_nan = best_val != best_val
    empty = best_idx == 2147483647
    take = take_ok & (empty | (new_nan & ~old_nan) | (x > best_val))
    return tl.where(take, x, best_val), tl.where(take, cols, best_idx)


@triton.jit
def _pick_t(v1, i1, v2, i2):
    """Order-T combine of two ``(value, index)`` candidates (associative and commutative):
    a NaN beats a non-NaN, else the larger value, ties (NaN/NaN, ``-0.0 == +0.0``) to the
    lower index; the winner keeps its own bits."""
    n1 = v1 != v1
    n2 = v2 != v2
    tie = (v2 == v1) | (n1 & n2)
    second = (n2 & ~n1) | (v2 > v1) | (tie & (i2 < i1))
    return tl.where(second, v2, v1), tl.where(second, i2, i1)


@triton.jit
def lane_argmax_t(vals, idxs):
    """Order-T winner over lanes ``vals: [N] fp32`` with distinct ``idxs: [N] int32``.

    Returns ``(value, index)``; the value is the winning lane's own bits (``±0.0`` kept), or
    the canonical NaN ``0x7FFF0000`` when a NaN wins. Four plain reductions (fast on the CPU
    interpreter); :func:`lane_argmax_t_tree` is the same function in one pair reduction.
    """
    is_nan = vals != vals
    any_nan = tl.max(is_nan.to(tl.int32), 0) > 0
    clean = tl.where(is_nan, float("-inf"), vals)
    top = tl.max(clean, 0)
    hit = tl.where(any_nan, is_nan, clean == top)
    best_idx = tl.min(tl.where(hit, idxs, 2147483647), 0)
    best_val = tl.max(tl.where(idxs == best_idx, clean, float("-inf")), 0)
    nan = tl.full([], 2147418112, tl.int32).to(tl.float32, bitcast=True)  # 0x7FFF0000
    return tl.where(any_nan, nan, best_val), best_idx


@triton.jit
def lane_argmax_t_tree(vals, idxs):
    """:func:`lane_argmax_t` as one ``tl.reduce`` of ``(value, index)`` pairs with
    :func:`_pick_t` (half the block barriers on a GPU; slow on the interpreter)."""
    best_val, best_idx = tl.reduce((vals, idxs), 0, _pick_t)
    nan = tl.full([], 2147418112, tl.int32).to(tl.float32, bitcast=True)  # 0x7FFF0000
    return tl.where(best_val != best_val, nan, best_val), best_idx


@triton.jit
def lane_argmax(vals, idxs, TREE: tl.constexpr):
    """:func:`lane_argmax_t_tree` when ``TREE`` else :func:`lane_argmax_t` (identical bits)."""
    if TREE:
        val, idx = lane_argmax_t_tree(vals, idxs)
    else:
        val, idx = lane_argmax_t(vals, idxs)
    return val, idx


MERGE_PAIRS = 0
"""Merge form: partial pairs stored, the last program reduces them in order T."""
MERGE_KEYS = 1
"""Merge form: partial int64 keys (:func:`pair_key`) stored, the last program takes their max."""
MERGE_ATOMIC = 2
"""Merge form: one 64-bit ``atomic_max`` per chunk into the row's key slot, taken (and reset to
:data:`KEY_EMPTY`) by the last program with ``atomic_xchg``."""
KEY_EMPTY = -(2**63)
"""The int64 key below every real key: a lane or slot that holds no candidate."""


@triton.jit
def _key_empty():
    return tl.full([], 1, tl.int64) << 63  # -2**63 (no int64 literal overflow in the frontend)


@triton.jit
def pair_key(val, idx):
    """Order-T int64 key of ``(val: fp32, idx: int32 in [0, 2**24))`` (any shape): a larger key
    is the order-T winner, so ``tl.max`` over keys is :func:`lane_argmax_t` over pairs.

    Bits 63..32: the value as a signed-monotone int32 (``b`` if ``b >= 0`` else
    ``b ^ 0x7FFFFFFF``), ``-0.0`` folded onto ``+0.0`` (they tie), every NaN ``0x7FFFFFFF`` (above
    ``+inf``; NaNs tie). Bits 31..8: ``0xFFFFFF - idx`` (ties go to the lower index). Bit 0: the
    value was ``-0.0`` (never decides: the bits above are unique per index; :func:`key_pair`
    restores the sign). ``idx == INT32_MAX`` (an empty lane) maps to :data:`KEY_EMPTY`.
    """
    b = val.to(tl.int32, bitcast=True)
    neg_zero = b == (tl.full([], 1, tl.int32) << 31)
    mono = tl.where(b < 0, b ^ 0x7FFFFFFF, b)
    mono = tl.where(neg_zero, 0, mono)
    mono = tl.where(val != val, 0x7FFFFFFF, mono)
    low = ((0xFFFFFF - idx).to(tl.int64) << 8) | neg_zero.to(tl.int64)
    key = (mono.to(tl.int64) << 32) | low
    return tl.where(idx == 2147483647, _key_empty(), key)


@triton.jit
def key_pair(key):
    """Inverse of :func:`pair_key`: ``(value fp32, index int32)``; a NaN value comes back as the
    canonical ``0x7FFF0000``, ``-0.0`` with its sign."""
    hi = (key >> 32).to(tl.int32)
    idx = 0xFFFFFF - ((key >> 8) & 0xFFFFFF).to(tl.int32)
    b = tl.where(hi < 0, hi ^ 0x7FFFFFFF, hi)
    b = tl.where((key & 1) != 0, tl.full([], 1, tl.int32) << 31, b)
    b = tl.where(hi == 0x7FFFFFFF, 2147418112, b)  # 0x7FFF0000
    return b.to(tl.float32, bitcast=True), idx


@triton.jit
def write_pair_row(row_ptr, C, slot, idx, val, BLOCK_OUT: tl.constexpr):
    """Write a whole staging row: ``idx`` (fp32) at ``2*slot``, ``val`` at ``2*slot+1``, +0.0
    elsewhere."""
    cols = tl.arange(0, BLOCK_OUT)
    idx_f = idx.to(tl.float32)
    row = tl.where(cols == 2 * slot, idx_f, tl.where(cols == 2 * slot + 1, val, 0.0))
    tl.store(row_ptr + cols, row, mask=cols < C)


@triton.jit
def finish_pair(val, idx, row, chunk, n_chunks, out_ptr, out_row_stride, C, vocab_start, slot,
                part_val_ptr, part_idx_ptr, count_ptr,
                BLOCK_C: tl.constexpr, BLOCK_OUT: tl.constexpr, TREE: tl.constexpr):
    """Publish the chunk pair ``(val, idx)`` (``idx`` a shard column) of program ``(row, chunk)``.

    One chunk: write the staging row. Several: store the partial pair, count the chunk on the
    row's counter (acq_rel atomic); the program that counts last merges the ``n_chunks`` pairs in
    order T, writes the staging row and resets the counter to 0 for the next launch or replay.
    """
    out_row = out_ptr + row.to(tl.int64) * out_row_stride
    if n_chunks == 1:
        write_pair_row(out_row, C, slot, idx + vocab_start, val, BLOCK_OUT)
    else:
        part = row.to(tl.int64) * n_chunks
        tl.store(part_val_ptr + part + chunk, val)
        tl.store(part_idx_ptr + part + chunk, idx)
        tl.debug_barrier()  # every thread's partial store precedes the release below
        done = tl.atomic_add(count_ptr + row, 1, sem="acq_rel")
        if done == n_chunks - 1:
            c = tl.arange(0, BLOCK_C)
            m = c < n_chunks
            # .cg: read at L2, never a stale L1 line of another row's merge on this SM
            vals = tl.load(part_val_ptr + part + c, mask=m, other=float("-inf"),
                           cache_modifier=".cg")
            idxs = tl.load(part_idx_ptr + part + c, mask=m, other=2147483647,
                           cache_modifier=".cg")
            best_val, best_idx = lane_argmax(vals, idxs, TREE)
            write_pair_row(out_row, C, slot, best_idx + vocab_start, best_val, BLOCK_OUT)
            tl.store(count_ptr + row, 0)


@triton.jit
def finish_key(key, row, chunk, n_chunks, out_ptr, out_row_stride, C, vocab_start, slot,
               key_ptr, count_ptr, BLOCK_C: tl.constexpr, BLOCK_OUT: tl.constexpr,
               MERGE: tl.constexpr):
    """:func:`finish_pair` for a chunk's :func:`pair_key` ``key`` (``MERGE_KEYS``: ``key_ptr``
    holds the partial keys ``[rows * n_chunks]``; ``MERGE_ATOMIC``: the row slots ``[rows]``,
    all :data:`KEY_EMPTY` between launches)."""
    out_row = out_ptr + row.to(tl.int64) * out_row_stride
    part = row.to(tl.int64) * n_chunks
    if n_chunks == 1:
        val, idx = key_pair(key)
        write_pair_row(out_row, C, slot, idx + vocab_start, val, BLOCK_OUT)
    else:
        if MERGE == 1:
            tl.store(key_ptr + part + chunk, key)
        else:
            tl.atomic_max(key_ptr + row, key, sem="relaxed")
        tl.debug_barrier()
        done = tl.atomic_add(count_ptr + row, 1, sem="acq_rel")
        if done == n_chunks - 1:
            if MERGE == 1:
                c = tl.arange(0, BLOCK_C)
                keys = tl.load(key_ptr + part + c, mask=c < n_chunks, other=_key_empty(),
                               cache_modifier=".cg")
                best = tl.max(keys, 0)
            else:
                best = tl.atomic_xchg(key_ptr + row, _key_empty(), sem="relaxed")
            val, idx = key_pair(best)
            write_pair_row(out_row, C, slot, idx + vocab_start, val, BLOCK_OUT)
            tl.store(count_ptr + row, 0)


@triton.jit
def finish_lanes(best_val, best_idx, row, chunk, n_chunks, out_ptr, out_row_stride, C,
                 vocab_start, slot, part_val_ptr, part_idx_ptr, count_ptr, key_ptr,
                 BLOCK_C: tl.constexpr, BLOCK_OUT: tl.constexpr, TREE: tl.constexpr,
                 MERGE: tl.constexpr):
    """Reduce the per-lane bests ``best_val: [BLOCK] fp32``, ``best_idx: [BLOCK] int32`` (shard
    columns, ``INT32_MAX`` = empty lane) of program ``(row, chunk)`` and publish the chunk's
    winner with merge form ``MERGE`` (``MERGE_PAIRS``, ``MERGE_KEYS`` or ``MERGE_ATOMIC``)."""
    if MERGE == 0:
        val, idx = lane_argmax(best_val, best_idx, TREE)
        finish_pair(val, idx, row, chunk, n_chunks, out_ptr, out_row_stride, C, vocab_start,
                    slot, part_val_ptr, part_idx_ptr, count_ptr, BLOCK_C, BLOCK_OUT, TREE)
    else:
        key = tl.max(pair_key(best_val, best_idx), 0)
        finish_key(key, row, chunk, n_chunks, out_ptr, out_row_stride, C, vocab_start, slot,
                   key_ptr, count_ptr, BLOCK_C, BLOCK_OUT, MERGE)


@triton.jit
def _lane_step(best_val, best_idx, x, cols):
    """:func:`lane_update` for lanes seeded with ``(-inf, first column)``: ``take`` is
    ``x > best`` or ``x`` NaN, unless ``best`` is already NaN (``~(x <= b)`` is one compare)."""
    take = ~(x <= best_val) & (best_val == best_val)
    return tl.where(take, x, best_val), tl.where(take, cols, best_idx)


@triton.jit(do_not_specialize=["tiles", "n_chunks"])
def _argmax_pair_kernel(
    x_ptr, x_row_stride, S, out_ptr, out_row_stride, C, vocab_start, slot,
    part_val_ptr, part_idx_ptr, count_ptr, key_ptr, tiles, n_chunks,
    BLOCK: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_OUT: tl.constexpr, TREE: tl.constexpr,
    MERGE: tl.constexpr, UNROLL: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    lanes = tl.arange(0, BLOCK)
    first = chunk * tiles * BLOCK
    # each lane starts as "-inf seen at its first column": the same order-T result as the
    # empty sentinel of lane_update (a lane that only sees -inf keeps its first column; columns
    # >= S load -inf and are never taken, and lose every tie on index)
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
        if UNROLL >= 8:  # sweep variant: 8 tiles in flight per trip
            c4 = c3 + BLOCK
            c5 = c4 + BLOCK
            c6 = c5 + BLOCK
            c7 = c6 + BLOCK
            x4 = tl.load(base + c4, mask=c4 < S, other=float("-inf"))
            x5 = tl.load(base + c5, mask=c5 < S, other=float("-inf"))
            x6 = tl.load(base + c6, mask=c6 < S, other=float("-inf"))
            x7 = tl.load(base + c7, mask=c7 < S, other=float("-inf"))
        best_val, best_idx = _lane_step(best_val, best_idx, x0.to(tl.float32), c0)
        if UNROLL >= 2:
            best_val, best_idx = _lane_step(best_val, best_idx, x1.to(tl.float32), c1)
        if UNROLL >= 4:
            best_val, best_idx = _lane_step(best_val, best_idx, x2.to(tl.float32), c2)
            best_val, best_idx = _lane_step(best_val, best_idx, x3.to(tl.float32), c3)
        if UNROLL >= 8:
            best_val, best_idx = _lane_step(best_val, best_idx, x4.to(tl.float32), c4)
            best_val, best_idx = _lane_step(best_val, best_idx, x5.to(tl.float32), c5)
            best_val, best_idx = _lane_step(best_val, best_idx, x6.to(tl.float32), c6)
            best_val, best_idx = _lane_step(best_val, best_idx, x7.to(tl.float32), c7)
    finish_lanes(best_val, best_idx, row, chunk, n_chunks, out_ptr, out_row_stride, C,
                 vocab_start, slot, part_val_ptr, part_idx_ptr, count_ptr, key_ptr, BLOCK_C,
                 BLOCK_OUT, TREE, MERGE)


# ---- launch -------------------------------------------------------------------------------


class PairTuning(NamedTuple):
    """Knobs of :func:`pair_launch_sizes` for one regime (the ``--sweep`` of
    ``benchmarks/selection.py`` measures them)."""

    programs_per_sm: int
    """Programs in flight per SM that a row split aims at (one wave: ``rows * n_chunks`` at
    most ``SMs * programs_per_sm``)."""
    block_bytes: int
    """Bytes of one tile of one program (``BLOCK = block_bytes / itemsize`` elements)."""
    unroll: int
    """Tiles loaded before they are reduced (1, 2, 4 or 8)."""
    num_warps: int
    num_stages: int
    tree_reduce: bool = True
    """Lane reductions as one pair ``tl.reduce`` (:func:`lane_argmax_t_tree`; ``MERGE_PAIRS``
    only: the key forms reduce with one int64 ``tl.max``)."""
    merge: int = MERGE_PAIRS
    """How the chunks of a row meet: ``MERGE_PAIRS``, ``MERGE_KEYS`` or ``MERGE_ATOMIC``."""


class PairLaunch(NamedTuple):
    """One launch of a pair kernel over the grid ``(rows, n_chunks)``."""

    block: int
    tiles: int
    """Tiles per chunk (a multiple of ``unroll``); a chunk covers ``tiles * block`` columns."""
    n_chunks: int
    unroll: int
    block_c: int
    num_warps: int
    num_stages: int
    tree_reduce: bool
    merge: int = MERGE_PAIRS


# Chosen by `benchmarks/selection.py --sweep` on one H200 (torch 2.11, triton 3.6), 2026-11-30:
# benchmarks/results/selection-sweep_nvidia-h200_2026-11-30T0829Z.log (best in both regimes;
# "tiny" did not exist then: it keeps the latency pick until a sweep with the merge forms).
# From `benchmarks/selection.py --sweep` on one H200 (torch 2.11, triton 3.6), 2026-11-30,
# benchmarks/results/selection-sweep2_nvidia-h200_2026-11-30T0857Z.log. Only the pairs merge
# (merge=0) is used. (The spin merge of that sweep failed the adversarial GPU parity test,
# test_every_tuning_gpu, and has been removed.)
ARGMAX_TUNING = {
    "tiny": PairTuning(programs_per_sm=4, block_bytes=1024, unroll=8, num_warps=4, num_stages=1,
                       tree_reduce=True, merge=0),
    "latency": PairTuning(programs_per_sm=4, block_bytes=2048, unroll=8, num_warps=4,
                          num_stages=1, tree_reduce=True, merge=0),
    "bandwidth": PairTuning(programs_per_sm=4, block_bytes=2048, unroll=8, num_warps=8,
                            num_stages=1, tree_reduce=True, merge=0),
}
"""Per-regime defaults of ``argmax_pair`` on a GPU (``tiny``: shards of fewer than
:data:`TINY_BYTES` bytes, ``latency``: fewer than :data:`LATENCY_BYTES`; see
:func:`pair_regime`). ``benchmarks/selection.py --sweep`` measures the candidates (pair, key
and atomic merges, small one-warp programs) and prints the best per regime to paste here."""

LATENCY_BYTES = 24 << 20
"""Shards smaller than this are latency-bound (a few microseconds of DRAM traffic). 24 MiB puts
the benchmark's B <= 32 cases (fp32 B = 32 at V = 163840: 21 MB) below and B >= 128 above, as
the two targets split them (no effect while ``latency`` and ``bandwidth`` are the same)."""
TINY_BYTES = 4 << 20
"""Shards smaller than this (one to a few decode rows) are bound by the dependent round trips
(DRAM load, counter atomic, merge), not by bandwidth."""


def pair_regime(nbytes: int, defaults: dict[str, PairTuning]) -> str:
    """The ``defaults`` key for a shard of ``nbytes`` bytes: ``tiny`` (when present) below
    :data:`TINY_BYTES`, ``latency`` below :data:`LATENCY_BYTES`, else ``bandwidth``."""
    if nbytes < TINY_BYTES and "tiny" in defaults:
        return "tiny"
    return "latency" if nbytes < LATENCY_BYTES else "bandwidth"

_INTERPRETER_TUNING = PairTuning(programs_per_sm=4, block_bytes=4096, unroll=2, num_warps=4,
                                 num_stages=1, tree_reduce=False)
_tuning_override: dict[str, PairTuning] = {}


def set_pair_tuning(tuning: PairTuning | None, op: str = "argmax") -> None:
    """Benchmark/test hook: use ``tuning`` for every regime of ``op`` (``"argmax"`` or
    ``"gumbel"``) on every device; ``None`` restores the defaults (the measured best)."""
    if tuning is not None and (tuning.unroll not in (1, 2, 4, 8) or tuning.merge not in range(3)):
        raise ConfigError(f"set_pair_tuning: unroll must be 1, 2, 4 or 8 and merge one of "
                          f"MERGE_PAIRS/MERGE_KEYS/MERGE_ATOMIC (0..2), got {tuning}")
    if tuning is None:
        _tuning_override.pop(op, None)
    else:
        _tuning_override[op] = tuning
    clear_pair_plans()


@functools.lru_cache(maxsize=1024)
def pair_launch_sizes(rows: int, shard_width: int, itemsize: int, sm_count: int,
                      tuning: PairTuning) -> PairLaunch:
    """The launch of a ``(rows, n_chunks)`` pair reduction (cached; pure in its arguments).

    ``BLOCK = tuning.block_bytes / itemsize`` (16-byte vector loads need ``BLOCK`` to cover
    ``num_warps * 32 * 16 / itemsize``), at most the padded shard width. Long rows are split so
    that ``rows * n_chunks`` fills ``sm_count * programs_per_sm`` slots without a second wave;
    many rows get one chunk each (no partials, no counter).
    """
    block = max(16, tuning.block_bytes // itemsize)
    block = min(block, max(16, triton.next_power_of_2(shard_width)))
    total_tiles = triton.cdiv(shard_width, block)
    unroll = max(1, min(tuning.unroll, triton.next_power_of_2(total_tiles)))
    slots = max(1, sm_count * tuning.programs_per_sm)
    chunks = max(1, min(slots // max(rows, 1), triton.cdiv(total_tiles, unroll)))
    tiles = triton.cdiv(total_tiles, chunks)
    tiles = triton.cdiv(tiles, unroll) * unroll
    n_chunks = triton.cdiv(total_tiles, tiles)
    block_c = max(128, triton.next_power_of_2(n_chunks))  # one compiled variant for most
    if tuning.merge == MERGE_ATOMIC:
        block_c = 128  # no partials are loaded: one compiled variant for every split
    return PairLaunch(block, tiles, n_chunks, unroll, block_c, tuning.num_warps,
                      tuning.num_stages, tuning.tree_reduce, tuning.merge)


_SM_COUNT: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    count = _SM_COUNT.get(index)
    if count is None:
        count = _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return count


def pick_pair_launch(op: str, defaults: dict[str, PairTuning], rows: int, shard_width: int,
                     itemsize: int, device: torch.device) -> PairLaunch:
    """Regime -> :class:`PairTuning` -> :func:`pair_launch_sizes` for ``op`` on ``device``."""
    tuning = _tuning_override.get(op)
    if tuning is None and device.type != "cuda":
        tuning = _INTERPRETER_TUNING
    elif tuning is None:
        tuning = defaults[pair_regime(rows * shard_width * itemsize, defaults)]
    return pair_launch_sizes(rows, shard_width, itemsize, _sm_count(device), tuning)


class _Workspace:
    """Per-device scratch of the one-launch merge: ``counts: [rows_cap] int32`` (all zero
    between launches: the merging program resets its row), the partial pairs
    ``part_val: [parts_cap] float32``, ``part_idx: [parts_cap] int32``, the partial keys
    ``part_key: [parts_cap] int64`` (``MERGE_KEYS``) and the row slots
    ``row_key: [rows_cap] int64`` (``MERGE_ATOMIC``; all :data:`KEY_EMPTY` between launches: the
    merging program takes its row's slot with ``atomic_xchg``).

    Buffers are only ever replaced by larger ones, and the old ones are kept alive, because a
    captured CUDA graph holds their addresses. Launches of pair kernels on two streams of one
    device must not overlap (they would share the counters).
    """

    def __init__(self) -> None:
        self.counts: torch.Tensor | None = None
        self.part_val: torch.Tensor | None = None
        self.part_idx: torch.Tensor | None = None
        self.part_key: torch.Tensor | None = None
        self.row_key: torch.Tensor | None = None
        self.retired: list[torch.Tensor] = []


_WORKSPACES: dict[torch.device, _Workspace] = {}
_MIN_ROWS_CAP = 1024
_MIN_PARTS_CAP = 1 << 14


def _workspace(device: torch.device, rows: int, parts: int) -> _Workspace | None:
    """The device's workspace with room for ``rows`` counters and ``parts`` partial pairs, or
    ``None`` when it would have to grow inside CUDA-graph capture (no zero fill runs then)."""
    ws = _WORKSPACES.get(device)
    if ws is not None and ws.counts.numel() >= rows and ws.part_val.numel() >= parts:
        return ws
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    clear_pair_plans()  # recorded launches hold the old buffers' addresses
    if ws is None:
        ws = _WORKSPACES[device] = _Workspace()
    else:
        ws.retired += [t for t in (ws.counts, ws.part_val, ws.part_idx, ws.part_key, ws.row_key)
                       if t is not None]
    rows_cap = max(_MIN_ROWS_CAP, triton.next_power_of_2(rows),
                   2 * (ws.counts.numel() if ws.counts is not None else 0))
    parts_cap = max(_MIN_PARTS_CAP, triton.next_power_of_2(parts),
                    2 * (ws.part_val.numel() if ws.part_val is not None else 0))
    ws.counts = torch.zeros(rows_cap, dtype=torch.int32, device=device)
    ws.part_val = torch.empty(parts_cap, dtype=torch.float32, device=device)
    ws.part_idx = torch.empty(parts_cap, dtype=torch.int32, device=device)
    ws.part_key = torch.empty(parts_cap, dtype=torch.int64, device=device)
    ws.row_key = torch.full((rows_cap,), KEY_EMPTY, dtype=torch.int64, device=device)
    return ws


_PAIR_PLANS: dict[tuple, tuple] = {}
"""Direct-launch plans of the pair ops (``argmax_pair``, ``gumbel_pair``). The key fixes every
fact the checks and the launch sizes depend on: op, geometry, dtype, device and 16-byte pointer
alignment of each caller tensor, and the values of the int arguments. The value is
``(grid rows, grid chunks, run, function, packed, device, *segments)``: the compiled kernel and
the fixed arguments between the caller's tensors (workspace tensors as raw pointers). Cleared
when a workspace grows or a tuning is set, the two things that change a launch for a key."""
_MAX_PAIR_PLANS = 4096


def clear_pair_plans() -> None:
    """Forget every recorded pair launch (the next call of each layout takes the checked path)."""
    _PAIR_PLANS.clear()


def _record_pair_plan(key: tuple, launcher: FastLaunch, grid: tuple[int, int], args: tuple,
                      num_warps: int, num_stages: int | None, varying: tuple[int, ...]) -> None:
    """Record the launch just made under ``key``: ``varying`` are the positions of the caller's
    per-call tensors in ``args`` (the first is 0), passed by pointer on each direct launch."""
    first = args[0]
    if not first.is_cuda or torch.cuda.is_current_stream_capturing():
        return
    dev = first.get_device()
    hit = launcher.handle(dev, args, num_warps, num_stages)
    if hit is None:
        return
    fixed = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
    bounds = (*varying, len(args))
    segments = tuple(tuple(fixed[lo + 1:hi]) for lo, hi in itertools.pairwise(bounds))
    if len(_PAIR_PLANS) >= _MAX_PAIR_PLANS:
        _PAIR_PLANS.clear()
    _PAIR_PLANS[key] = (grid[0], grid[1], *hit, dev, *segments)


def run_pair_reduction(launcher: FastLaunch, launch: PairLaunch, out: torch.Tensor, rows: int,
                       shard_width: int, vocab_start: int, slot: int, args: tuple,
                       constexprs: tuple, plan_key: tuple | None = None,
                       varying: tuple[int, ...] = ()) -> torch.Tensor:
    """Launch a pair kernel once over ``(rows, n_chunks)`` through ``launcher``.

    The kernel's signature is ``*args, out_ptr, out_row_stride, C, vocab_start, slot, part_val,
    part_idx, counts, keys, tiles, n_chunks, BLOCK, BLOCK_C, BLOCK_OUT, TREE, MERGE, *constexprs``
    (``keys``: the workspace's ``part_key`` or ``row_key`` as ``launch.merge`` needs; all passed
    positionally: :class:`~draftsmith.kernels._launch.FastLaunch` skips Triton's binder after
    the first launch of a specialization). With ``plan_key`` the launch is recorded in
    ``_PAIR_PLANS`` (``varying``: positions of the caller's tensors in ``args``; ``out`` is
    added)."""
    C = out.shape[1]
    # a one-chunk launch never touches the scratch, but it still gets the workspace's (kept)
    # tensors, so a recorded launch never holds the address of a caller's freed tensor
    split = launch.n_chunks > 1
    ws = _workspace(out.device, rows if split else 1, rows * launch.n_chunks if split else 1)
    if ws is None and split:  # capture with a too-small workspace: one program per row instead
        tiles = triton.cdiv(triton.cdiv(shard_width, launch.block), launch.unroll)
        launch = launch._replace(tiles=tiles * launch.unroll, n_chunks=1)
    if ws is None:
        ws = _WORKSPACES.get(out.device)
    # passing the workspace's own (typed, aligned) tensors keeps a one-chunk launch the same
    # compiled kernel, so it can launch inside a capture
    if ws is not None:
        part_val, part_idx, counts = ws.part_val, ws.part_idx, ws.counts
        keys = ws.row_key if launch.merge == MERGE_ATOMIC else ws.part_key
        if keys is None:  # a hand-built workspace without key buffers (tests)
            keys = _dummy_keys(out.device)
    else:  # inside a capture before any workspace exists (nothing is recorded then)
        part_val, part_idx = out, out.view(torch.int32)
        counts = part_idx
        keys = _dummy_keys(out.device)
    grid = (rows, launch.n_chunks)
    full = (*args, out, out.stride(0), C, vocab_start, slot, part_val, part_idx, counts, keys,
            launch.tiles, launch.n_chunks, launch.block, launch.block_c, _block_out(C),
            launch.tree_reduce, launch.merge, *constexprs)
    launcher(grid, full, num_warps=launch.num_warps, num_stages=launch.num_stages)
    if plan_key is not None:
        _record_pair_plan(plan_key, launcher, grid, full, launch.num_warps, launch.num_stages,
                          (*varying, len(args)))
    return out


_DUMMY_KEYS: dict[torch.device, torch.Tensor] = {}


def _dummy_keys(device: torch.device) -> torch.Tensor:
    """An int64 stand-in for ``keys`` when the device has no workspace (one-chunk launches never
    read it); kept, so that a captured graph may hold its address."""
    t = _DUMMY_KEYS.get(device)
    if t is None:
        t = _DUMMY_KEYS[device] = torch.full((1,), KEY_EMPTY, dtype=torch.int64, device=device)
    return t


@functools.lru_cache(maxsize=64)
def _block_out(columns: int) -> int:
    return triton.next_power_of_2(columns)


_ARGMAX_LAUNCH = FastLaunch(_argmax_pair_kernel)
_T = torch.Tensor


def argmax_pair(
    logits: torch.Tensor, vocab_start: int = 0, out: torch.Tensor | None = None, slot: int = 0
) -> torch.Tensor:
    """Triton form of :func:`argmax_pair_reference` (same arguments, identical bits)."""
    # a decode loop calls this with one layout over and over: a recorded plan skips the checks,
    # the launch-size choice and Triton's argument specialization (host time of ~2 launches)
    key = None
    if (type(logits) is _T and type(out) is _T and type(vocab_start) is int
            and type(slot) is int):
        lp, op = logits.data_ptr(), out.data_ptr()
        key = ("argmax", logits.shape, logits.stride(), logits.dtype, logits.get_device(),
               lp & 15, out.shape, out.stride(), out.dtype, out.get_device(), op & 15,
               vocab_start, slot)
        plan = _PAIR_PLANS.get(key)
        if plan is not None and not hooks_installed():
            g0, g1, run, function, packed, dev, mid, tail = plan
            run(g0, g1, 1, raw_stream(dev), function, packed, None, None, None,
                lp, *mid, op, *tail)
            return out
    out = _check_args("argmax_pair", logits, vocab_start, out, slot)
    rows, shard_width = logits.shape
    if rows == 0:
        return out
    launch = pick_pair_launch("argmax", ARGMAX_TUNING, rows, shard_width,
                              logits.element_size(), logits.device)
    return run_pair_reduction(
        _ARGMAX_LAUNCH, launch, out, rows, shard_width, vocab_start, slot,
        (logits, logits.stride(0), shard_width), (launch.unroll,), key, (0,),
    )


_VALIDATED: set[tuple] = set()
"""Argument layouts already accepted by :func:`_check_args` (the launch hot path skips them)."""


def _check_args(op: str, logits: torch.Tensor, vocab_start: int, out: torch.Tensor | None,
                slot: int) -> torch.Tensor:
    """Validate the common pair arguments; return ``out`` (allocated when ``None``).

    A layout seen before (dtypes, shapes, strides, devices, ``vocab_start``, ``slot``) is
    accepted from a set lookup, so a decode loop pays the full checks once.
    """
    key = None
    if type(logits) is torch.Tensor and type(out) is torch.Tensor:
        key = (op, logits.dtype, logits.shape, logits.stride(), logits.device, out.dtype,
               out.shape, out.stride(), out.device, type(vocab_start), vocab_start, type(slot),
               slot)
        if key in _VALIDATED:
            return out
    out = _check_args_full(op, logits, vocab_start, out, slot)
    if key is not None:
        if len(_VALIDATED) > 4096:
            _VALIDATED.clear()
        _VALIDATED.add(key)
    return out


def _check_args_full(op: str, logits: torch.Tensor, vocab_start: int, out: torch.Tensor | None,
                     slot: int) -> torch.Tensor:
    sizes: dict[str, int] = {}
    check_tensor(f"{op}: logits", logits, ("rows", "S"), _LOGIT_DTYPES, sizes)
    if logits.shape[1] > 1 and logits.stride(1) != 1:
        raise ShapeError(f"{op}: logits must have unit stride along S; call .contiguous()")
    if logits.shape[1] == 0:
        raise ShapeError(f"{op}: logits must have at least one column")
    if not isinstance(slot, int) or slot < 0:
        raise ShapeError(f"{op}: slot must be an int >= 0 (the rank), got {slot!r}")
    if not isinstance(vocab_start, int) or vocab_start < 0:
        raise ShapeError(f"{op}: vocab_start must be an int >= 0, got {vocab_start!r}")
    if vocab_start + logits.shape[1] > MAX_EXACT_INDEX:
        raise ShapeError(
            f"{op}: global ids up to {vocab_start + logits.shape[1]} are not exact in fp32; "
            f"vocab-parallel pairs need V < 2**24, gather the logits instead"
        )
    if out is None:
        return torch.zeros(logits.shape[0], 2 * slot + 2, dtype=torch.float32,
                           device=logits.device)
    check_tensor(f"{op}: out", out, ("rows", "C"), torch.float32, sizes, device=logits.device)
    if out.stride(1) != 1:
        raise ShapeError(f"{op}: out must have unit stride along its columns")
    if out.shape[0] > 1 and out.stride(0) < out.shape[1]:
        raise ShapeError(f"{op}: out rows overlap in memory (row stride {out.stride(0)} < "
                         f"{out.shape[1]} columns); pass a tensor with distinct rows")
    if out.shape[1] % 2 or 2 * slot + 2 > out.shape[1]:
        raise ShapeError(
            f"{op}: out has {out.shape[1]} columns; it needs an even count >= 2 * slot + 2 = "
            f"{2 * slot + 2} (use EXCHANGE_COLUMNS = {EXCHANGE_COLUMNS} for TP <= 64)"
        )
    return out


__all__ = [
    "CANONICAL_NAN_BITS",
    "EXCHANGE_COLUMNS",
    "MAX_EXACT_INDEX",
    "argmax_pair",
    "argmax_pair_reference",
    "canonical_nan",
    "clear_pair_plans",
    "lane_argmax",
    "lane_argmax_t",
    "lane_argmax_t_tree",
    "lane_update",
    "ARGMAX_TUNING",
    "KEY_EMPTY",
    "LATENCY_BYTES",
    "MERGE_ATOMIC",
    "MERGE_KEYS",
    "MERGE_PAIRS",
    "TINY_BYTES",
    "finish_key",
    "finish_lanes",
    "key_pair",
    "pair_key",
    "pair_regime",
    "PairLaunch",
    "PairTuning",
    "finish_pair",
    "pair_launch_sizes",
    "pick_pair_launch",
    "set_pair_tuning",
    "run_pair_reduction",
    "write_pair_row",
]
