"""Per-rank Gumbel-max pair of a logits shard: temperature sampling without gathering.

Owns ``gumbel_pair``, its eager reference, the Gumbel constants, ``gumbel_from_uniform`` and the
group construction below. Uses the Philox helpers of :mod:`draftsmith.kernels.philox` and the
pair reduction of :mod:`draftsmith.kernels._pair`. Imports ``draftsmith.contract`` only.

Two-level (hierarchical) Gumbel-max, exact in distribution. Global ids are split into aligned
groups of :data:`GROUP_SIZE` consecutive ids (group ``g = id // GROUP_SIZE``). A rank scores each
group of its shard with the group's log-sum-exp plus one keyed Gumbel draw, keeps the best group
(order T), and draws its token inside that group with the per-token keyed noise::

    z_i     = float(x_i) * r                          r = 1 / T, rounded to fp32 once per row
    score_g = LSE_{i in g}(z_i) + G(seed, offset, stream | GROUP_STREAM_BIT, g)
    g*      = argmax_T over the shard's groups of score_g
    token   = argmax_T over i in g* of (z_i + G(seed, offset, stream, i))
    pair    = (token, score_{g*})

``G(seed, offset, s, k) = clamp(-ln(-ln u), G_MIN, G_MAX)`` with ``u`` the keyed Philox uniform
of id ``k`` in stream word ``s`` (:func:`~draftsmith.kernels.philox.philox_uniform_reference`):
group draws use the stream word with :data:`GROUP_STREAM_BIT` set, so they never share a counter
with a token draw (streams are below ``2**29``).

Why it is exact: ``max_g (LSE_g + Gumbel)`` picks group ``g`` with probability ``Z_g / Z``, and
the independent Gumbel-max inside ``g`` picks ``i`` with probability ``exp(z_i) / Z_g``. The max
of the ranks' pair values is again a Gumbel-max over all groups, so the exchanged token is
distributed as ``softmax(z)``. The draws depend only on ``(seed, offset, stream)`` and global
ids, so when every shard starts at a multiple of ``GROUP_SIZE`` each TP split yields the same
token. A shard starting inside a group scores its partial first group with a draw keyed on the
shard's first id under :data:`PIECE_STREAM_BIT` (independent of the draw of the group's other
piece on the previous rank): still exact in distribution, but no longer the same token as other
splits, so vocab-parallel selection gathers the rows of such a split instead
(``draftsmith.selection.eligibility.gumbel_pairs_split_invariant``). A partial last group
(``S`` not a multiple of ``GROUP_SIZE``) is an ordinary group that starts aligned.

Greedy rows (``T <= 0``) are the plain order-T argmax pair (``argmax_pair``'s bits): the group
score is the group's maximum, the token the group's first maximum, the value the token's logit.
A NaN makes its group's score NaN, which wins under order T, and the first NaN of that group is
the token: the row's first NaN. An all ``-inf`` row gives the first id.

The kernel's per-token work is the group's log-sum-exp: a NaN-propagating maximum, one
multiply-add, one exponential and one add (plus the bf16 widening). The noise is per group (one
Philox call per thread and tile, two logarithms per group) and so is the running best. Only the
winning group's 16 tokens draw per-token noise, once per row, in the program that finishes the
row's pair. On sm_90 the compiled scan loop takes about 13.7 instructions per bf16 token (7.7 of
them the log-sum-exp; a greedy row runs only those) and 17.4 per fp32 token, against about 41
per token for a Philox draw and two logarithms per token. On CUDA the exponentials and
logarithms are the hardware ``ex2.approx`` / ``lg2.approx`` (and libdevice's ``logf`` core for
the inner Gumbel logarithm), so a score is within about ``1e-6`` of the reference's and the
token is the reference's unless two group scores (or two scores in the winning group) are that
close. Off CUDA (the interpreter) the log-sum-exp runs in fp64 with a fixed pairwise sum,
rounded once, and the Gumbel logarithms too, so the kernel equals
:func:`gumbel_pair_reference` bit for bit.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.kernels._launch import block_size
from draftsmith.kernels._pair import (
    PairScratch,
    canonical_nan,
    check_pair_args,
    lane_argmax,
    lane_step,
    launch_pair,
    reduce_lanes,
    write_pair_row,
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
GROUP_SIZE = 16
"""Consecutive global ids per group (``g = id // GROUP_SIZE``). 16 spreads the per-group work
(its share of a Philox call, two logarithms, a lane update) over 16 tokens, makes a group two
16-byte loads of bf16 (its reductions stay in registers, at most a shuffle apart), and leaves
the winning group's per-token noise at 16 draws per row."""
GROUP_STREAM_BIT = 1 << 30
"""Set in the Philox stream word of the group draws: they never share a counter with a token
draw (token draws use the bare stream, below ``2**29``)."""
PIECE_STREAM_BIT = 1 << 29
"""Also set for the draw of a partial group that starts inside a group (a shard whose
``vocab_start`` is not a multiple of ``GROUP_SIZE``), keyed on the shard's first id instead of
the group id: it is then independent of the draw of the group's piece on the previous rank."""
MAX_STREAM = 1 << 29
"""Streams are ints in ``[0, MAX_STREAM)`` (the bits above are the group draws')."""


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


def group_logsumexp(z: torch.Tensor) -> torch.Tensor:
    """``LSE`` over the last axis of ``z: [..., GROUP_SIZE] float32`` (``-inf`` = absent), fp32.

    ``m`` = the largest non-NaN value; ``m + ln(sum exp(z - m))`` in fp64 with the pairwise sum
    ``(0+1), (2+3), ..`` repeated, rounded once (every step is exactly rounded or, for ``exp`` and
    ``ln``, an fp64 library call whose last-ulp differences vanish in the rounding, so the
    interpreted kernel gets the same bits). A NaN anywhere gives NaN; ``m = ±inf`` gives ``m``.
    """
    nan = torch.isnan(z).any(dim=-1)
    m = torch.where(torch.isnan(z), float("-inf"), z).amax(dim=-1)
    finite = m.abs() < float("inf")
    m0 = torch.where(finite, m, 0.0).double()
    e = torch.exp(z.double() - m0[..., None])
    while e.shape[-1] > 1:
        e = e[..., 0::2] + e[..., 1::2]
    lse = torch.where(finite, (m0 + torch.log(e[..., 0])).float(), m)
    return torch.where(nan, float("nan"), lse)


def _argmax_t_where(s: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Order-T argmax along dim 1 of ``s`` among the ``valid`` positions (at least one a row)."""
    nan = torch.isnan(s) & valid
    clean = torch.where(valid & ~nan, s, float("-inf"))
    top = clean.amax(dim=1, keepdim=True)
    hit = torch.where(nan.any(dim=1, keepdim=True), nan, valid & (clean == top))
    return torch.argmax(hit.to(torch.int32), dim=1)


def gumbel_pair_reference(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor,
    offsets: torch.Tensor,
    stream: int,
    vocab_start: int = 0,
    out: torch.Tensor | None = None,
    slot: int = 0,
) -> torch.Tensor:
    """Gumbel-max pair of each row by the two-level construction of the module docstring,
    written like :func:`argmax_pair_reference`.

    ``logits: [rows, S]`` fp32/bf16/fp16 over global ids ``vocab_start + 0 .. S-1``;
    ``temperatures: [rows] float32`` (``T <= 0`` rows are greedy: plain order-T argmax);
    ``seeds, offsets: [rows] int64`` the :class:`~draftsmith.contract.SamplingKey`; ``stream``
    in ``[0, 2**29)`` (0 target, 1 draft). ``out: [rows, C] float32`` as in
    :func:`argmax_pair_reference`: ``(float(token), score_{g*})`` at ``2*slot, 2*slot + 1``, a
    NaN score as ``0x7FFF0000``.
    """
    out = check_pair_args("gumbel_pair", logits, vocab_start, out, slot)
    _check_key(logits, temperatures, seeds, offsets, stream)
    rows, width = logits.shape
    dev = logits.device
    greedy = temperatures <= 0
    x = logits.to(torch.float32)
    z = x * (1.0 / torch.where(greedy, 1.0, temperatures))[:, None]
    first = vocab_start // GROUP_SIZE
    lead = vocab_start - first * GROUP_SIZE  # ids of the first group before the shard
    n_groups = (lead + width + GROUP_SIZE - 1) // GROUP_SIZE
    padded = torch.full((rows, n_groups * GROUP_SIZE), float("-inf"), device=dev)
    padded[:, lead:lead + width] = z
    groups = torch.arange(first, first + n_groups, device=dev)
    u = philox_uniform_reference(seeds, offsets, groups, stream | GROUP_STREAM_BIT)
    if lead:
        piece = torch.tensor([vocab_start], device=dev)
        u[:, :1] = philox_uniform_reference(seeds, offsets, piece,
                                            stream | GROUP_STREAM_BIT | PIECE_STREAM_BIT)
    scores = group_logsumexp(padded.view(rows, n_groups, GROUP_SIZE)) + gumbel_from_uniform(u)
    win = torch.argmax(scores, dim=1, keepdim=True)
    value = scores.gather(1, win)[:, 0]
    ids = (first + win) * GROUP_SIZE + torch.arange(GROUP_SIZE, device=dev)
    cols = ids - vocab_start
    valid = (cols >= 0) & (cols < width)
    member = z.gather(1, cols.clamp(0, width - 1))
    noise = gumbel_from_uniform(philox_uniform_reference(seeds, offsets, ids, stream))
    pick = _argmax_t_where(member + noise, valid)
    token = ids.gather(1, pick[:, None])[:, 0]
    value = torch.where(torch.isnan(value), canonical_nan(dev), value)
    out.zero_()
    out[:, 2 * slot] = token.to(torch.float32)
    out[:, 2 * slot + 1] = value
    if greedy.any():
        plain = argmax_pair_reference(logits, vocab_start, None, slot)
        out[greedy, 2 * slot:2 * slot + 2] = plain[greedy, 2 * slot:2 * slot + 2]
    return out


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
def _lg2_approx(x):
    """Hardware ``log2`` (``lg2.approx.ftz``: absolute error below ``2**-22``)."""
    return tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=r,r", [x],
                                     dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _ex2_approx(x):
    """Hardware ``2**x`` (``ex2.approx.ftz``: 2 ulp; ``-inf`` gives 0)."""
    return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x],
                                     dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _noisy_score(z, u, G_LO: tl.constexpr, G_HI: tl.constexpr, CUDA: tl.constexpr):
    """``z + clamp(-ln(-ln u), G_LO, G_HI)``. Off CUDA in fp64 rounded once, as
    :func:`gumbel_from_uniform`. On CUDA the inner logarithm is :func:`_ln_unit`, the outer one
    ``lg2.approx`` fused into one multiply-add, unclamped (the noise then lies within about
    ``1e-6`` of ``[G_LO, G_HI]``)."""
    if CUDA:
        s = tl.fma(_lg2_approx(-_ln_unit(u)), -0.6931471805599453, z)
    else:
        g = (-tl.log(-tl.log(u.to(tl.float64)))).to(tl.float32)
        s = z + tl.minimum(tl.maximum(g, G_LO), G_HI)
    return s


@triton.jit
def _pairwise_sum16(e):
    """Sum along axis 1 of ``e: [N, 16]`` as ``(0+1), (2+3), ..`` repeated (the order of
    :func:`group_logsumexp`)."""
    n: tl.constexpr = e.shape[0]
    a, b = tl.split(tl.reshape(e, [n, 8, 2]))
    a, b = tl.split(tl.reshape(a + b, [n, 4, 2]))
    a, b = tl.split(tl.reshape(a + b, [n, 2, 2]))
    a, b = tl.split(a + b)
    return a + b


@triton.jit
def _group_max_lse(x, r, CUDA: tl.constexpr):
    """``(max, LSE)`` along axis 1 of ``z = x * r`` for ``x: [N, GROUP_SIZE] fp32``, each NaN
    where a NaN is.

    Off CUDA :func:`group_logsumexp`'s fp64 formulation (the same bits). On CUDA per token one
    NaN-propagating max, one multiply-add, one ``ex2.approx`` and one add, with ``r`` folded into
    the exponent's scale (``max(x * r) == max(x) * r`` exactly for ``r > 0``: rounding is
    monotone); ``lg2.approx`` per group.
    """
    if CUDA:
        m = tl.reduce(x, 1, _max_nan) * r
        finite = tl.abs(m) < float("inf")  # false for ±inf and NaN
        m0 = tl.where(finite, m, 0.0)
        e = _ex2_approx(tl.fma(x, r * 1.4426950408889634, -(m0 * 1.4426950408889634)[:, None]))
        lse = tl.where(tl.abs(m) == float("inf"), m,
                       tl.fma(_lg2_approx(tl.sum(e, 1)), 0.6931471805599453, m0))
        lse = tl.where(m != m, m, lse)
    else:
        z = x * r
        nans = z != z
        has_nan = tl.max(nans.to(tl.int32), 1) > 0
        m = tl.max(tl.where(nans, float("-inf"), z), 1)
        finite = tl.abs(m) < float("inf")
        m0 = tl.where(finite, m, 0.0).to(tl.float64)
        e = tl.exp(tl.where(nans, 0.0, z).to(tl.float64) - m0[:, None])
        total = tl.where(finite, _pairwise_sum16(e), 1.0)  # an empty group takes no log of 0
        lse = tl.where(finite, (m0 + tl.log(total)).to(tl.float32), m)
        lse = tl.where(has_nan, float("nan"), lse)
        m = tl.where(has_nan, float("nan"), m)
    return m, lse


@triton.jit
def _token_scores(z, ids, k0, k1, off_lo, off_hi, STREAM: tl.constexpr, G_LO: tl.constexpr,
                  G_HI: tl.constexpr, CUDA: tl.constexpr):
    """``z_i + G(seed, offset, stream, id_i)`` for ``ids: [N] int32`` (one Philox call per id:
    this runs for one group per row)."""
    w0, w1, w2, w3 = philox4x32_10(k0, k1, (ids >> 2).to(tl.uint32), off_lo, off_hi, STREAM,
                                   CUDA)
    lane = ids & 3
    word = tl.where(lane == 0, w0, tl.where(lane == 1, w1, tl.where(lane == 2, w2, w3)))
    return _noisy_score(z, centred_uniform(word), G_LO, G_HI, CUDA)


@triton.jit(do_not_specialize=["tiles", "n_chunks"])
def _gumbel_pair_kernel(
    x_ptr, x_row_stride, S, temp_ptr, seeds_ptr, offsets_ptr,
    out_ptr, out_row_stride, C, vocab_start, slot, part_val_ptr, part_idx_ptr, count_ptr,
    tiles, n_chunks,
    BLOCK_C: tl.constexpr, BLOCK_OUT: tl.constexpr, TREE: tl.constexpr,
    GROUPS: tl.constexpr, GS: tl.constexpr, PHASE: tl.constexpr, STREAM: tl.constexpr,
    GROUP_STREAM: tl.constexpr, PIECE_STREAM: tl.constexpr, CUDA: tl.constexpr,
    G_LO: tl.constexpr, G_HI: tl.constexpr,
):
    """Program ``(row, chunk)`` scans ``tiles`` tiles of ``[GROUPS, GS]`` tokens. Local group
    ``h`` is global group ``(vocab_start - PHASE) // GS + h`` at the shard columns
    ``h * GS + j - PHASE`` (``PHASE = vocab_start % (4 * GS)``: local group 0 is the first of a
    Philox call, the groups ``4q .. 4q+3`` taking its four words); lanes keep the best group
    score per tile row. The program holding the row's winning group then draws its token."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    temp = tl.load(temp_ptr + row)
    sampled = temp > 0.0
    # x * 1.0 == x: greedy rows scale by one
    inv_temp = tl.math.div_rn(1.0, tl.where(sampled, temp, 1.0))
    k0, k1 = split_u64(tl.load(seeds_ptr + row))
    off_lo, off_hi = split_u64(tl.load(offsets_ptr + row))
    lanes = tl.arange(0, GROUPS)
    j = tl.arange(0, GS)
    first = chunk * tiles * GROUPS
    call0 = (vocab_start - PHASE) // (4 * GS)
    FIRST_IN: tl.constexpr = PHASE // GS  # the local group holding the shard's first id
    if PHASE % GS != 0:
        # the shard starts inside a group: that piece's draw is keyed on its first id
        p0, p1, p2, p3 = philox4x32_10(k0, k1, (vocab_start >> 2).to(tl.uint32), off_lo, off_hi,
                                       STREAM + GROUP_STREAM + PIECE_STREAM, CUDA)
        piece = vocab_start & 3
        u_piece = centred_uniform(tl.where(piece == 0, p0, tl.where(
            piece == 1, p1, tl.where(piece == 2, p2, p3))))
    # lanes start as "-inf at the first tile", as lane_step expects
    best_val = tl.full([GROUPS], float("-inf"), tl.float32)
    best_tile = tl.zeros([GROUPS], tl.int32)
    base = x_ptr + row.to(tl.int64) * x_row_stride
    for t in range(tiles):
        h = first + t * GROUPS + lanes
        cols = h[:, None] * GS + j[None, :] - PHASE
        x = tl.load(base + cols, mask=(cols >= 0) & (cols < S), other=float("-inf"))
        m, lse = _group_max_lse(x.to(tl.float32), inv_temp, CUDA)
        s = m
        if sampled:
            # one Philox call per four groups, its words joined in group order:
            # join puts its new axis last, [q, i, k] = (w0, w2 | w1, w3)[k][i] = word 2i + k
            w0, w1, w2, w3 = philox4x32_10(
                k0, k1, (call0 + (first + t * GROUPS) // 4 + tl.arange(0, GROUPS // 4)).to(
                    tl.uint32), off_lo, off_hi, STREAM + GROUP_STREAM, CUDA)
            u = centred_uniform(tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), [GROUPS]))
            if PHASE % GS != 0:
                u = tl.where(h == FIRST_IN, u_piece, u)
            s = _noisy_score(lse, u, G_LO, G_HI, CUDA)
        best_val, best_tile = lane_step(best_val, best_tile, s, t)
    best_group = first + best_tile * GROUPS + lanes
    best_group = tl.where(best_group < FIRST_IN, 2147483647, best_group)  # before the shard
    score, group, last = reduce_lanes(best_val, best_group, row, chunk, n_chunks, part_val_ptr,
                                      part_idx_ptr, count_ptr, BLOCK_C, TREE)
    if last:
        cols = group * GS + j - PHASE
        valid = (cols >= 0) & (cols < S)
        z = tl.load(base + cols, mask=valid, other=float("-inf")).to(tl.float32) * inv_temp
        s = z
        if sampled:
            s = _token_scores(z, vocab_start + cols, k0, k1, off_lo, off_hi, STREAM, G_LO, G_HI,
                              CUDA)
        # columns outside the shard never win: -inf and an index above every real one
        pick_val, pick = lane_argmax(tl.where(valid, s, float("-inf")),
                                     tl.where(valid, j, 2147483647 - j), TREE)
        value = tl.where(sampled, score, pick_val)  # greedy: the token's own logit bits
        write_pair_row(out_ptr + row.to(tl.int64) * out_row_stride, C, slot,
                       vocab_start + group * GS + pick - PHASE, value, BLOCK_OUT)


def _launch_sizes(shard_groups: int, device: torch.device) -> tuple[int, int]:
    """``(GROUPS, num_warps)``: tiles of ``GROUPS * GROUP_SIZE`` tokens (``GROUPS >= 4``: the
    four groups of a Philox call share a tile). On a GPU 128 threads take 32 tokens each, bf16
    or fp32 (four or eight 16-byte loads a trip; the per-thread Philox call covers two groups).
    The H200 launch sweep (``benchmarks/selection.py --gumbel-sweep``, 2026-12-02) found 256
    groups and 4 warps the fastest of 64-256 groups and 4-8 warps at B = 32, 128 and 256 in both
    dtypes (fp32: 9.4 / 30.4 / 53.3 us against 10.1 / 35.3 / 64.3 with 128 groups). The
    interpreter takes up to 4096 tokens (numpy per tile), fewer for a narrow shard."""
    if device.type == "cuda":
        return 256, 4
    return block_size(shard_groups, lo=4, hi=256), 4


PROGRAMS_PER_SM = 8
"""Row chunks in flight per SM: more than the memory-bound pair kernels' 4, since a loop trip
issues only two to four 16-byte loads per thread; the scan's 48 to 56 registers per thread
(sm_90) leave room for 8 programs of 128 threads."""


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
) -> torch.Tensor:
    """Triton form of :func:`gumbel_pair_reference` (same arguments), one launch.

    Off CUDA (the interpreter) the pair equals the reference's bit for bit. On CUDA the value is
    within about ``1e-6`` of the reference's and the token is the reference's unless two group
    scores, or two token scores of the winning group, lie that close (module docstring); greedy
    rows are bit for bit.
    """
    out = check_pair_args("gumbel_pair", logits, vocab_start, out, slot)
    _check_key(logits, temperatures, seeds, offsets, stream, contiguous=True)
    rows, shard_width = logits.shape
    if rows == 0:
        return out
    phase = vocab_start % (4 * GROUP_SIZE)
    groups, num_warps = _launch_sizes(triton.cdiv(shard_width + phase, GROUP_SIZE),
                                      logits.device)
    cuda = logits.is_cuda
    return launch_pair(
        _gumbel_pair_kernel, _SCRATCH,
        (logits, logits.stride(0), shard_width, temperatures, seeds, offsets), out, vocab_start,
        slot, triton.cdiv(shard_width + phase, GROUP_SIZE * groups), 1, num_warps, cuda,
        programs_per_sm=PROGRAMS_PER_SM, GROUPS=groups, GS=GROUP_SIZE, PHASE=phase,
        STREAM=stream, GROUP_STREAM=GROUP_STREAM_BIT, PIECE_STREAM=PIECE_STREAM_BIT, CUDA=cuda,
        G_LO=G_MIN, G_HI=G_MAX,
    )


def _check_key(logits: torch.Tensor, temperatures: torch.Tensor, seeds: torch.Tensor,
               offsets: torch.Tensor, stream: int, contiguous: bool = False) -> None:
    for name, tensor, dtype in (("temperatures", temperatures, torch.float32),
                                ("seeds", seeds, torch.int64), ("offsets", offsets, torch.int64)):
        check_tensor(f"gumbel_pair: {name}", tensor, (logits.shape[0],), dtype,
                     device=logits.device, contiguous=contiguous)
    if type(stream) is not int or not 0 <= stream < MAX_STREAM:
        raise ShapeError(f"gumbel_pair: stream must be an int in [0, 2**29) (higher bits key the "
                         f"group draws), got {stream!r}")


__all__ = [
    "GROUP_SIZE",
    "GROUP_STREAM_BIT",
    "G_MAX",
    "G_MIN",
    "MAX_STREAM",
    "PIECE_STREAM_BIT",
    "group_logsumexp",
    "gumbel_from_uniform",
    "gumbel_pair",
    "gumbel_pair_reference",
]
