"""Per-rank Gumbel-max pair of a logits shard: temperature sampling without gathering (spec 5.5).

Owns ``gumbel_pair``, its eager reference, the Gumbel constants and ``gumbel_from_uniform``.
Uses the Philox helpers of :mod:`draftsmith.kernels.philox` and the pair reduction of
:mod:`draftsmith.kernels._pair`. Imports ``draftsmith.contract`` only.

The noise of element ``i`` depends only on ``(seed, offset, stream, global id i)``, so every
tensor-parallel split of the same row yields the same winner after the pair exchange.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.kernels._pair import PairScratch, check_pair_args, finish_lanes, launch_pair
from draftsmith.kernels.argmax_pair import argmax_pair_reference
from draftsmith.kernels.philox import (
    centred_uniform,
    philox_uniform_reference,
    philox_word0,
    split_u64,
)

G_MAX = float(torch.tensor(-math.log(-math.log1p(-(2.0**-24))), dtype=torch.float32))
"""Largest Gumbel draw, ``-ln(-ln(1 - 2**-24)) ~ 16.63553`` (fp32), at ``u = 1 - 2**-24``."""
G_MIN = float(torch.tensor(-math.log(24 * math.log(2.0)), dtype=torch.float32))
"""Smallest Gumbel draw, ``-ln(24 ln 2) ~ -2.81154`` (fp32), at ``u = 2**-24``."""
GUMBEL_SPAN = G_MAX - G_MIN
"""``D = G_MAX - G_MIN ~ 19.44707``: a score this far below the maximum can never win."""
SKIP_SLACK = 1e-3
"""Absolute slack added to ``D`` in the skip test, for fp32 rounding of ``s = z / T + g``."""
SKIP_REL = 2.0**-20
"""Relative slack (times ``|m|``) added to ``D`` in the skip test."""


def gumbel_from_uniform(u: torch.Tensor) -> torch.Tensor:
    """``clamp(-ln(-ln(u)), G_MIN, G_MAX)`` for ``u: fp32`` in ``(0, 1)``, returned in fp32.

    On CUDA both logarithms run in fp32: torch and Triton call the same libdevice ``logf``
    (0 differing draws in 17M on an H200). Elsewhere they run in fp64, rounded once: torch's CPU
    ``log`` and numpy's (the Triton interpreter's) differ by an ulp on about a third of fp32
    draws, which can flip an exact tie between two scores; in fp64 they agree after rounding.
    """
    if u.is_cuda:
        return (-torch.log(-torch.log(u))).clamp(G_MIN, G_MAX)
    return (-torch.log(-torch.log(u.double()))).float().clamp(G_MIN, G_MAX)


def skip_threshold(m: torch.Tensor) -> torch.Tensor:
    """Scores ``z / T`` strictly below ``m - (D + 1e-3 + 2**-20 * |m|)`` cannot win (spec 5.5)."""
    return m - (GUMBEL_SPAN + SKIP_SLACK + SKIP_REL * m.abs())


def gumbel_pair_reference(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor,
    offsets: torch.Tensor,
    stream: int,
    vocab_start: int = 0,
    out: torch.Tensor | None = None,
    slot: int = 0,
    skip_dominated: bool = True,
) -> torch.Tensor:
    """Gumbel-max pair of each row, written like :func:`argmax_pair_reference`.

    ``logits: [rows, S]`` fp32/bf16/fp16 over global ids ``vocab_start + 0 .. S-1``;
    ``temperatures: [rows] float32`` (``T <= 0`` rows are greedy: plain order-T argmax);
    ``seeds, offsets: [rows] int64`` the :class:`~draftsmith.contract.SamplingKey`; ``stream``
    0/1/2. ``out: [rows, C] float32`` as in :func:`argmax_pair_reference`::

        z_i = float(logits[row, i]) / T                       IEEE division
        u_i = philox_uniform(seed, offset, vocab_start + i, stream)
        s_i = z_i + clamp(-ln(-ln u_i), G_MIN, G_MAX)         (s_i = z_i for greedy rows)
        pair = (vocab_start + argmax_T(s), s[argmax_T(s)])

    With ``skip_dominated`` the elements with ``z_i < m - (D + 1e-3 + 2**-20 |m|)`` (``m`` the
    row's largest non-NaN ``z``) get ``s_i = -inf`` without drawing noise; they cannot win, so the
    pair is the same bits either way. NaNs are never skipped (they win under order T).
    """
    out = check_pair_args("gumbel_pair", logits, vocab_start, out, slot)
    _check_key(logits, temperatures, seeds, offsets, stream)
    greedy = (temperatures <= 0)[:, None]
    x = logits.to(torch.float32)
    z = torch.where(greedy, x, x / torch.where(greedy, 1.0, temperatures[:, None]))
    ids = torch.arange(vocab_start, vocab_start + logits.shape[1], device=logits.device)
    noise = gumbel_from_uniform(philox_uniform_reference(seeds, offsets, ids, stream))
    scores = torch.where(greedy, z, z + noise)
    if skip_dominated:
        top = torch.where(torch.isnan(z), float("-inf"), z).amax(dim=1, keepdim=True)
        scores = torch.where(z < skip_threshold(top), float("-inf"), scores)
    return argmax_pair_reference(scores, vocab_start, out, slot)


@triton.jit
def _lane_update(best_val, best_idx, x, cols, take_ok):
    """Merge a tile ``x`` at columns ``cols`` into per-lane bests that start empty
    (``idx == INT32_MAX``): a lane takes a candidate (``take_ok``) that is strictly larger, a NaN
    over a non-NaN, or anything while empty; ties keep the earlier (lower) column."""
    new_nan = x != x
    old_nan = best_val != best_val
    empty = best_idx == 2147483647
    take = take_ok & (empty | (new_nan & ~old_nan) | (x > best_val))
    return tl.where(take, x, best_val), tl.where(take, cols, best_idx)


@triton.jit(do_not_specialize=["tiles", "n_chunks"])
def _gumbel_pair_kernel(
    x_ptr, x_row_stride, S, temp_ptr, seeds_ptr, offsets_ptr,
    out_ptr, out_row_stride, C, vocab_start, slot, part_val_ptr, part_idx_ptr, count_ptr,
    tiles, n_chunks,
    BLOCK_C: tl.constexpr, BLOCK_OUT: tl.constexpr, TREE: tl.constexpr,
    BLOCK: tl.constexpr, STREAM: tl.constexpr, SKIP: tl.constexpr,
    G_LO: tl.constexpr, G_HI: tl.constexpr, SPAN: tl.constexpr,
    SLACK: tl.constexpr, REL: tl.constexpr, WIDE_LOG: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    lanes = tl.arange(0, BLOCK)
    temp = tl.load(temp_ptr + row)
    greedy = temp <= 0.0
    safe_temp = tl.where(greedy, 1.0, temp)
    k0, k1 = split_u64(tl.load(seeds_ptr + row))
    off_lo, off_hi = split_u64(tl.load(offsets_ptr + row))
    best_val = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK], 2147483647, tl.int32)
    running_max = tl.max(best_val, 0)
    base = x_ptr + row.to(tl.int64) * x_row_stride
    for t in range(tiles):
        cols = (chunk * tiles + t) * BLOCK + lanes
        valid = cols < S
        x = tl.load(base + cols, mask=valid, other=float("-inf")).to(tl.float32)
        z = tl.where(greedy, x, tl.math.div_rn(x, safe_temp))
        if SKIP:
            # measured against the running max of this chunk (<= the shard's max): still exact
            running_max = tl.maximum(running_max, tl.max(tl.where(z != z, float("-inf"), z), 0))
            threshold = running_max - (SPAN + SLACK + REL * tl.abs(running_max))
            keep = valid & ~(z < threshold)
        else:
            keep = valid
        scores = z
        if temp > 0.0:
            if tl.max(keep.to(tl.int32), 0) > 0:
                zero = tl.zeros([BLOCK], tl.uint32)
                word = philox_word0(k0, k1, (vocab_start + cols).to(tl.uint32), zero + off_lo,
                                    zero + off_hi, zero + STREAM)
                u = centred_uniform(word)
                if WIDE_LOG:  # off CUDA, as gumbel_from_uniform: fp64 logs rounded once
                    g = (-tl.log(-tl.log(u.to(tl.float64)))).to(tl.float32)
                else:  # CUDA: libdevice logf, as torch's
                    g = -tl.log(-tl.log(u))
                g = tl.minimum(tl.maximum(g, G_LO), G_HI)
                scores = z + g
        best_val, best_idx = _lane_update(best_val, best_idx, scores, cols, keep)
    finish_lanes(best_val, best_idx, row, chunk, n_chunks, out_ptr, out_row_stride, C,
                 vocab_start, slot, part_val_ptr, part_idx_ptr, count_ptr, BLOCK_C, BLOCK_OUT,
                 TREE)


def _launch_sizes(shard_width: int) -> tuple[int, int]:
    """``(BLOCK, num_warps)``: 2048 fp32 lanes (the block holds as many lanes whatever the
    logits dtype: the kernel is bound by Philox, not by loads)."""
    return min(2048, max(16, triton.next_power_of_2(shard_width))), 4


_SCRATCH = PairScratch()


def gumbel_pair(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor,
    offsets: torch.Tensor,
    stream: int,
    vocab_start: int = 0,
    out: torch.Tensor | None = None,
    slot: int = 0,
    skip_dominated: bool = True,
) -> torch.Tensor:
    """Triton form of :func:`gumbel_pair_reference` (same arguments).

    The winning index and score equal the reference's to the last bit (the noise is computed
    as in :func:`gumbel_from_uniform` on each device). The kernel skips Philox for a whole tile
    whose elements are all dominated by the running maximum of its chunk.
    """
    out = check_pair_args("gumbel_pair", logits, vocab_start, out, slot)
    _check_key(logits, temperatures, seeds, offsets, stream)
    for name, t in (("temperatures", temperatures), ("seeds", seeds), ("offsets", offsets)):
        if not t.is_contiguous():
            raise ShapeError(f"gumbel_pair: {name} must be contiguous; call .contiguous()")
    rows, shard_width = logits.shape
    if rows == 0:
        return out
    block, num_warps = _launch_sizes(shard_width)
    return launch_pair(
        _gumbel_pair_kernel, _SCRATCH,
        (logits, logits.stride(0), shard_width, temperatures, seeds, offsets), out, vocab_start,
        slot, triton.cdiv(shard_width, block), 1, num_warps, False, BLOCK=block, STREAM=stream,
        SKIP=bool(skip_dominated), G_LO=G_MIN, G_HI=G_MAX, SPAN=GUMBEL_SPAN, SLACK=SKIP_SLACK,
        REL=SKIP_REL, WIDE_LOG=not logits.is_cuda,
    )


def _check_key(logits: torch.Tensor, temperatures: torch.Tensor, seeds: torch.Tensor,
               offsets: torch.Tensor, stream: int) -> None:
    sizes = {"rows": int(logits.shape[0])}
    dev = logits.device
    check_tensor("gumbel_pair: temperatures", temperatures, ("rows",), torch.float32, sizes,
                 device=dev)
    check_tensor("gumbel_pair: seeds", seeds, ("rows",), torch.int64, sizes, device=dev)
    check_tensor("gumbel_pair: offsets", offsets, ("rows",), torch.int64, sizes, device=dev)
    if not isinstance(stream, int) or not 0 <= stream < 2**32:
        raise ShapeError(f"gumbel_pair: stream must be an int in [0, 2**32), got {stream!r}")


__all__ = [
    "GUMBEL_SPAN",
    "G_MAX",
    "G_MIN",
    "gumbel_from_uniform",
    "gumbel_pair",
    "gumbel_pair_reference",
    "skip_threshold",
]
