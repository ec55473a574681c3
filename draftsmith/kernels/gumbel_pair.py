"""Per-rank Gumbel-max pair of a logits shard: temperature sampling without gathering.

Owns ``gumbel_pair``, its eager reference, the Gumbel constants and ``gumbel_from_uniform``. Uses
the Philox helpers of :mod:`draftsmith.kernels.philox` and the pair reduction of
:mod:`draftsmith.kernels._pair`. Imports ``draftsmith.contract`` only.

The noise of global id ``i`` depends only on ``(seed, offset, stream, i)``, so every
tensor-parallel split of the same row yields the same winner after the pair exchange.

The kernel is bound by arithmetic, not by memory: per token it needs a quarter of a Philox call
(ids ``4q .. 4q+3`` share call ``q``, so a tile is ``[GROUPS, 4]`` tokens with the four words of
a call in one thread), two logarithms and an order-T lane update. On CUDA the inner logarithm is
libdevice's ``logf`` without its special cases (its argument is a normal number in ``(0, 1)``,
so the bits are the same) and the outer one the hardware ``lg2.approx`` (absolute error below
``2**-22`` in ``log2``, about ``1e-7`` in the noise). A tile whose scores all sit more than the
Gumbel span below the chunk's running maximum draws no noise at all.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.kernels._pair import (
    PairScratch,
    check_pair_args,
    finish_lanes,
    lane_step,
    launch_pair,
)
from draftsmith.kernels.argmax_pair import argmax_pair_reference
from draftsmith.kernels.philox import (
    centred_uniform,
    philox4x32_10,
    philox_uniform_reference,
    split_u64,
)

G_MAX = float(torch.tensor(-math.log(-math.log1p(-(2.0**-24))), dtype=torch.float32))
"""Largest Gumbel draw, ``-ln(-ln(1 - 2**-24)) ~ 16.63553`` (fp32), at ``u = 1 - 2**-24``."""
G_MIN = float(torch.tensor(-math.log(24 * math.log(2.0)), dtype=torch.float32))
"""Smallest Gumbel draw, ``-ln(24 ln 2) ~ -2.81154`` (fp32), at ``u = 2**-24``."""
GUMBEL_SPAN = G_MAX - G_MIN
"""``D = G_MAX - G_MIN ~ 19.44707``: a score this far below the maximum can never win."""
SKIP_SLACK = 1e-3
"""Absolute slack added to ``D`` in the skip test, for fp32 rounding of ``s = z + g``."""
SKIP_REL = 2.0**-20
"""Relative slack (times ``|m|``) added to ``D`` in the skip test."""


def gumbel_from_uniform(u: torch.Tensor) -> torch.Tensor:
    """``clamp(-ln(-ln(u)), G_MIN, G_MAX)`` for ``u: fp32`` in ``(0, 1)``, returned in fp32.

    On CUDA both logarithms run in fp32 (libdevice ``logf``; the kernel's outer logarithm is the
    hardware approximation, within about ``1e-7`` of it). Elsewhere they run in fp64, rounded
    once: torch's CPU ``log`` and numpy's (the Triton interpreter's) differ by an ulp on about a
    third of fp32 draws, which can flip an exact tie between two scores; in fp64 they agree
    after rounding, so the interpreted kernel equals this function bit for bit.
    """
    if u.is_cuda:
        return (-torch.log(-torch.log(u))).clamp(G_MIN, G_MAX)
    return (-torch.log(-torch.log(u.double()))).float().clamp(G_MIN, G_MAX)


def skip_threshold(m: torch.Tensor) -> torch.Tensor:
    """Scores ``z`` strictly below ``m - (D + 1e-3 + 2**-20 * |m|)`` cannot win
    (``D = GUMBEL_SPAN``, plus slack for fp32 rounding)."""
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

        z_i = float(logits[row, i]) * r               r = 1 / T, rounded to fp32 once per row
        u_i = philox_uniform(seed, offset, vocab_start + i, stream)
        s_i = z_i + clamp(-ln(-ln u_i), G_MIN, G_MAX)   (s_i = z_i for greedy rows)
        pair = (vocab_start + argmax_T(s), s[argmax_T(s)])

    With ``skip_dominated`` the elements with ``z_i < m - (D + 1e-3 + 2**-20 |m|)`` (``m`` the
    row's largest non-NaN ``z``) get ``s_i = -inf`` without drawing noise; they cannot win, so the
    pair is the same bits either way. NaNs are never skipped (they win under order T).
    """
    out = check_pair_args("gumbel_pair", logits, vocab_start, out, slot)
    _check_key(logits, temperatures, seeds, offsets, stream)
    greedy = (temperatures <= 0)[:, None]
    x = logits.to(torch.float32)
    z = torch.where(greedy, x, x * (1.0 / torch.where(greedy, 1.0, temperatures[:, None])))
    ids = torch.arange(vocab_start, vocab_start + logits.shape[1], device=logits.device)
    noise = gumbel_from_uniform(philox_uniform_reference(seeds, offsets, ids, stream))
    scores = torch.where(greedy, z, z + noise)
    if skip_dominated:
        top = torch.where(torch.isnan(z), float("-inf"), z).amax(dim=1, keepdim=True)
        scores = torch.where(z < skip_threshold(top), float("-inf"), scores)
    return argmax_pair_reference(scores, vocab_start, out, slot)


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _ln_unit(x):
    """libdevice's ``logf`` for a normal ``x`` in ``(0, 1)`` (no subnormal, zero, inf or NaN
    cases, so the same bits for 9 fewer instructions)."""
    i = x.to(tl.int32, bitcast=True)
    e = (i - 0x3F2AAAAB) & -8388608
    f = (i - e).to(tl.float32, bitcast=True) - 1.0
    p = tl.fma(-0.13018856942653656, f, 0.1408461034297943)
    p = tl.fma(p, f, -0.12148627638816833)
    p = tl.fma(p, f, 0.1398061066865921)
    p = tl.fma(p, f, -0.16684235632419586)
    p = tl.fma(p, f, 0.20012299716472626)
    p = tl.fma(p, f, -0.24999669194221497)
    p = tl.fma(p, f, 0.333331823348999)
    p = tl.fma(p, f, -0.5)
    p = tl.fma(f * p, f, f)
    # libdevice scales the exponent by 2**-23 and then by ln 2: one product, the same bits
    return tl.fma(e.to(tl.float32), 0.6931471824645996 * 2.0**-23, p)


@triton.jit
def _noisy_score(z, u, G_LO: tl.constexpr, G_HI: tl.constexpr, CUDA: tl.constexpr):
    """``z + clamp(-ln(-ln u), G_LO, G_HI)``. Off CUDA in fp64 rounded once, as
    :func:`gumbel_from_uniform`. On CUDA as in the module docstring, fused into one multiply-add
    and unclamped: the noise then lies within about ``1e-6`` of ``[G_LO, G_HI]``, well inside
    the skip test's slack."""
    if CUDA:
        lg2 = tl.inline_asm_elementwise(
            "{ .reg .f32 t; neg.f32 t, $1; lg2.approx.ftz.f32 $0, t; }", "=r,r", [_ln_unit(u)],
            dtype=tl.float32, is_pure=True, pack=1)
        s = tl.fma(lg2, -0.6931471805599453, z)
    else:
        g = (-tl.log(-tl.log(u.to(tl.float64)))).to(tl.float32)
        s = z + tl.minimum(tl.maximum(g, G_LO), G_HI)
    return s


@triton.jit(do_not_specialize=["tiles", "n_chunks"])
def _gumbel_pair_kernel(
    x_ptr, x_row_stride, S, temp_ptr, seeds_ptr, offsets_ptr,
    out_ptr, out_row_stride, C, vocab_start, slot, part_val_ptr, part_idx_ptr, count_ptr,
    tiles, n_chunks,
    BLOCK_C: tl.constexpr, BLOCK_OUT: tl.constexpr, TREE: tl.constexpr,
    GROUPS: tl.constexpr, PHASE: tl.constexpr, STREAM: tl.constexpr, SKIP: tl.constexpr,
    CUDA: tl.constexpr, G_LO: tl.constexpr, G_HI: tl.constexpr, MARGIN: tl.constexpr,
    REL: tl.constexpr,
):
    """Program ``(row, chunk)`` scans ``tiles`` tiles of ``[GROUPS, 4]`` tokens: row ``q`` of
    tile ``t`` holds the four ids of Philox call ``vocab_start // 4 + g``, ``g = first + t *
    GROUPS + q``, at the local columns ``4g + j - PHASE`` (``PHASE = vocab_start % 4``)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    temp = tl.load(temp_ptr + row)
    greedy = temp <= 0.0
    inv_temp = tl.math.div_rn(1.0, tl.where(greedy, 1.0, temp))
    k0, k1 = split_u64(tl.load(seeds_ptr + row))
    off_lo, off_hi = split_u64(tl.load(offsets_ptr + row))
    g1 = tl.arange(0, GROUPS)
    q = g1[:, None]
    j = tl.arange(0, 4)[None, :]
    first = chunk * tiles * GROUPS
    # a lane records the tile of its best (a scalar per tile: no per-token index arithmetic);
    # lanes start as "-inf at the first tile", as lane_step expects
    best_val = tl.full([GROUPS, 4], float("-inf"), tl.float32)
    best_tile = tl.zeros([GROUPS, 4], tl.int32)
    running = tl.max(tl.max(best_val, 1), 0)
    base = x_ptr + row.to(tl.int64) * x_row_stride
    for t in range(tiles):
        group = first + t * GROUPS + q
        cols = group * 4 + j - PHASE
        x = tl.load(base + cols, mask=(cols >= 0) & (cols < S), other=float("-inf"))
        z = tl.where(greedy, x.to(tl.float32), x.to(tl.float32) * inv_temp)
        live = True
        if SKIP:
            # against the running max of this chunk (<= the shard's): still exact. A NaN makes
            # the tile live (it wins under order T).
            if CUDA:
                top = tl.reduce(tl.reduce(z, 1, _max_nan), 0, _max_nan)
            else:
                top = tl.max(tl.max(tl.where(z != z, float("inf"), z), 1), 0)
            live = ~(top < running - (MARGIN + REL * tl.abs(running)))
            running = tl.maximum(running, top)
        if live:
            s = z
            if temp > 0.0:
                # one Philox call per group, its four words joined into the group's row: the
                # words stay in the thread that computed them (a [GROUPS, 4] counter would be
                # laid out across threads, each computing the whole call again)
                w0, w1, w2, w3 = philox4x32_10(
                    k0, k1, (vocab_start // 4 + first + t * GROUPS + g1).to(tl.uint32), off_lo,
                    off_hi, STREAM, CUDA)
                # join puts its new axis last: [g, i, k] = (w0, w2 | w1, w3)[k][i], so that
                # column 2i + k of the reshape is word 2i + k
                word = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), [GROUPS, 4])
                s = _noisy_score(z, centred_uniform(word), G_LO, G_HI, CUDA)
            best_val, best_tile = lane_step(best_val, best_tile, s, t)
    best_col = (first + best_tile * GROUPS + q) * 4 + j - PHASE
    best_col = tl.where(best_col < 0, 2147483647, best_col)  # before the shard: never a winner
    finish_lanes(tl.reshape(best_val, [GROUPS * 4]), tl.reshape(best_col, [GROUPS * 4]), row,
                 chunk, n_chunks, out_ptr, out_row_stride, C, vocab_start, slot, part_val_ptr,
                 part_idx_ptr, count_ptr, BLOCK_C, BLOCK_OUT, TREE)


def _launch_sizes(device: torch.device) -> tuple[int, int]:
    """``(GROUPS, num_warps)``: tiles of ``4 * GROUPS`` tokens. On a GPU 16 tokens per thread
    (four Philox calls; enough to amortize the tile's skip reduction, few enough registers); the
    interpreter takes larger tiles (numpy per tile)."""
    return (512, 4) if device.type == "cuda" else (1024, 4)


PROGRAMS_PER_SM = 6
"""Row chunks in flight per SM: the kernel is bound by arithmetic, and its 79 registers per
thread leave room for six 128-thread programs on an H200 SM (four, the memory-bound pair
kernels' figure, left a tenth of the throughput at ``B >= 128``)."""


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

    Off CUDA (the interpreter) the pair equals the reference's bit for bit. On CUDA the index is
    the reference's unless two scores lie within about ``2e-7`` of each other (the outer
    logarithm, see the module docstring); the value agrees to that tolerance.
    """
    out = check_pair_args("gumbel_pair", logits, vocab_start, out, slot)
    _check_key(logits, temperatures, seeds, offsets, stream, contiguous=True)
    rows, shard_width = logits.shape
    if rows == 0:
        return out
    groups, num_warps = _launch_sizes(logits.device)
    phase = vocab_start % 4
    cuda = logits.is_cuda
    return launch_pair(
        _gumbel_pair_kernel, _SCRATCH,
        (logits, logits.stride(0), shard_width, temperatures, seeds, offsets), out, vocab_start,
        slot, triton.cdiv(shard_width + phase, 4 * groups), 1, num_warps, False,
        programs_per_sm=PROGRAMS_PER_SM, GROUPS=groups, PHASE=phase, STREAM=stream,
        SKIP=bool(skip_dominated), CUDA=cuda,
        G_LO=G_MIN, G_HI=G_MAX, MARGIN=GUMBEL_SPAN + SKIP_SLACK, REL=SKIP_REL,
    )


def _check_key(logits: torch.Tensor, temperatures: torch.Tensor, seeds: torch.Tensor,
               offsets: torch.Tensor, stream: int, contiguous: bool = False) -> None:
    for name, tensor, dtype in (("temperatures", temperatures, torch.float32),
                                ("seeds", seeds, torch.int64), ("offsets", offsets, torch.int64)):
        check_tensor(f"gumbel_pair: {name}", tensor, (logits.shape[0],), dtype,
                     device=logits.device, contiguous=contiguous)
    if type(stream) is not int or not 0 <= stream < 2**32:
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
