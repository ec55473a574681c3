"""The DSpark vanilla Markov chain: each draft token biases the next position's logits.

Owns ``markov_bias_reference`` (the low-rank bias ``w1[prev] @ w2^T``), ``markov_step`` (one block
position on one vocabulary shard: bias, fp32 sum with the base logits, and the order-T argmax
pair; the sharded chain exchanges these pairs between positions) and ``markov_chain`` (the greedy
full-vocabulary chain over ``K`` positions in one launch, the tokens written straight into the
drafts), each beside its reference. Imports ``draftsmith.contract`` only.

Precision (TensorRT-LLM form): base logits fp32 (bf16 is widened exactly), the bias rounded to
the weight dtype then widened, the sum in fp32. The fused step computes the bias with its own
dot-product order, so it matches the torch chain at tolerance level, not bitwise.

The fused step streams ``w2`` once for all ``G`` rows: program ``(g_tile, s_tile)`` multiplies the
gathered ``w1`` rows of its request tile with one ``[BLOCK_S, r]`` tile of ``w2`` on tensor cores,
adds the base logits, optionally stores the corrected row, and reduces an order-T pair per
(row, tile); a second launch, one program per row, reduces the row's tile pairs. One launch with
the last-arriving program reducing (an acq_rel count, as in ``_pair``'s chunk merge) was slower
on an H200: a K = 7 chain at SmolLM2's vocabulary took 91 us against 57 us at one row, 108 against
62 at eight (``markov-chain-ab_nvidia-h200_2026-12-04T1748Z.txt``).

Up to 16 rows in bf16 the chain (``_markov_chain_kernel``) runs every position in one launch of
at most one program per SM: each program holds its vocabulary columns of ``w2`` across the
positions and computes them as the step does (same bits), and between positions the programs
meet at a counter instead of at two launch boundaries. On an H100, in a 1B target's round at one
row, 28 us alone against the steps' 34; level at eight rows
(``chain-one-launch_nvidia-h100_2026-12-07T1619Z.txt``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels import pdl_on
from draftsmith.kernels._launch import block_size, or_dummy, pdl_kwargs, pdl_start, row_stride
from draftsmith.kernels._pair import PairScratch, merge_argmax_t, sm_count, tile_argmax_t

_I64 = torch.int64
_BASES = (torch.float32, torch.bfloat16)
_CHAIN_SCRATCH = PairScratch()
"""Counts and pairs of :func:`_markov_chain_kernel` (one launch of the chain at a time per
device)."""
_CHAIN_SPAN = 1024
"""Most vocabulary columns one program of :func:`_markov_chain_kernel` holds (its logits and
products stay in registers)."""


def markov_bias_reference(w1: torch.Tensor, w2: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """The Markov bias of the previous tokens: ``[G, S] fp32``.

    ``w1: [V, r]``, ``w2: [S, r]`` (rows of one vocabulary shard, or all ``V``), same dtype;
    ``prev: [G] int64`` global ids::

        bias = float( (w1[prev] @ w2^T) rounded to the weight dtype )

    A ``prev`` outside ``0 .. V-1`` (e.g. ``-1`` padding) selects a zero ``w1`` row, hence a zero
    bias (TensorRT-LLM's rule; DeepSpec raises).
    """
    vocab = w1.shape[0]
    valid = (prev >= 0) & (prev < vocab)
    rows = w1[prev.clamp(0, vocab - 1)]
    rows = torch.where(valid[:, None], rows, torch.zeros((), dtype=w1.dtype, device=w1.device))
    return F.linear(rows, w2).float()


def markov_step_reference(
    base: torch.Tensor,
    prev: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    vocab_start: int,
    out_corrected: torch.Tensor | None = None,
    *,
    reverse: bool = False,
    out_idx: torch.Tensor | None = None,
    pdl: bool = False,
    out_prev: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block position of the chain on one shard.

    ``base: [G, S]`` fp32 (or bf16, widened exactly) base logits of global ids
    ``vocab_start .. vocab_start + S - 1``; ``prev: [G] int64``; ``w1: [V, r]``; ``w2: [S, r]``
    (the same shard's rows); ``out_corrected: [G, S] fp32 | None`` receives
    ``z = base + markov_bias(prev)``. Returns the order-T pair of each row of ``z``:
    ``(pair_val [G] fp32, pair_idx [G] int64)`` with ``pair_idx`` global
    (``vocab_start + argmax_T(z)``), ready for a cross-shard pair reduction. ``out_prev: [G]
    int64 | None`` receives a copy of ``prev`` (a chain's anchor beside its drafts).

    ``reverse`` is the fused step's ``w2`` tile order, which never changes the result, and
    ``pdl`` its launch option; the reference takes them only so the two signatures agree.
    """
    del reverse, pdl
    _check_width("base", base.shape[-1])
    z = base.float() + markov_bias_reference(w1, w2, prev)
    if out_corrected is not None:
        out_corrected.copy_(z)
    local = torch.argmax(z, dim=-1)
    idx = local + vocab_start
    if out_idx is not None:
        idx = out_idx.copy_(idx)
    if out_prev is not None:
        out_prev.copy_(prev)
    return z.gather(1, local[:, None])[:, 0], idx


def markov_chain_reference(
    base: torch.Tensor, anchor: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, *,
    store_corrected: bool = True, pdl: bool = False, tokens_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The greedy Markov chain over one block (DeepSpec ``VanillaMarkov``, TensorRT-LLM precision).

    ``base: [G, K, V]`` fp32 block logits, ``anchor: [G] int64`` (the bonus), ``w1, w2: [V, r]``::

        prev = anchor
        for j in 0 .. K-1:
            z[:, j] = base[:, j] + markov_bias(prev)       fp32
            x[:, j] = argmax_T(z[:, j]);  prev = x[:, j]

    Returns ``(drafts [G, K] int64, corrected [G, K, V] fp32)``, ``corrected`` ``None`` when
    ``store_corrected`` is false (a greedy chain's caller that only needs the drafts). ``K == 0``
    returns an empty ``[G, 0]`` draft tensor and the ``base`` object itself. ``pdl`` (the
    kernel form's launch option) is accepted and ignored. ``tokens_out: [G, K + 1] int64``
    receives the anchor then the drafts (a verification's tokens); the drafts returned are then
    its view ``tokens_out[:, 1:]``.
    """
    del pdl
    g, k, vocab = base.shape
    _check_width("base", vocab)
    drafts = _drafts_in(tokens_out, anchor, g, k, base.device)
    if tokens_out is not None:
        tokens_out[:, 0] = anchor
    if k == 0:
        return drafts, base
    corrected = torch.empty(base.shape, dtype=torch.float32, device=base.device)
    prev = anchor
    for j in range(k):
        z = base[:, j].float() + markov_bias_reference(w1, w2, prev)
        corrected[:, j] = z
        prev = torch.argmax(z, dim=-1)
        drafts[:, j] = prev
    return drafts, corrected if store_corrected else None


def _drafts_in(tokens_out: torch.Tensor | None, anchor: torch.Tensor, g: int, k: int,
               device: torch.device) -> torch.Tensor:
    """The chain's drafts ``[G, K]``: a new tensor, or the columns of ``tokens_out`` after the
    anchor's (checked: ``[G, K + 1] int64`` rows that do not overlap)."""
    if tokens_out is None:
        return torch.empty((g, k), dtype=_I64, device=device)
    check_tensor("tokens_out", tokens_out, (g, k + 1), _I64, None, anchor.device,
                 distinct_rows=True)
    return tokens_out[:, 1:]


@triton.jit
def _markov_step_kernel(
    base_ptr, prev_ptr, w1_ptr, w2_ptr, out_ptr, part_val_ptr, part_idx_ptr,
    lead_ptr, G, S, R, V, stride_base, stride_prev, stride_out, stride_lead, num_tiles,
    STORE: tl.constexpr, IEEE: tl.constexpr, REVERSE: tl.constexpr, LEAD: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_R: tl.constexpr,
    ONE_CHUNK: tl.constexpr, PDL: tl.constexpr,
):
    """Stage 1: program ``(g_tile, s_tile)`` writes one order-T pair per row of its tile.

    Tile addresses are int32 offsets from per-program 64-bit bases (a tile spans far less than
    2**31 elements), which keeps the address arithmetic out of the register budget.

    ``REVERSE`` walks the ``w2`` tiles from the last to the first (programs are dispatched in
    increasing id order): a chain that alternates the direction from one position to the next
    starts each pass on the tiles the previous pass read last, which are still in L2. The tile
    pairs land at the same places either way, so the result does not depend on it.

    ``ONE_CHUNK`` (``R <= BLOCK_R``): the ``w2`` tile is one load, issued before the program
    waits for the previous position's tokens under ``PDL`` (a weight: no kernel writes it).

    ``LEAD``: the programs of the grid's first tile column also copy the previous tokens they
    read to ``lead_ptr`` (a chain's anchor into the column before its drafts).
    """
    pid_g = tl.program_id(0)
    pid_s = tl.program_id(1)
    if REVERSE:
        pid_s = num_tiles - 1 - pid_s
    s0 = pid_s * BLOCK_S
    rows = pid_g * BLOCK_G + tl.arange(0, BLOCK_G)
    row_ok = rows < G
    cols = tl.arange(0, BLOCK_S)
    col_ok = s0 + cols < S
    w2_tile = w2_ptr + s0.to(tl.int64) * R
    if ONE_CHUNK:
        rr = tl.arange(0, BLOCK_R)
        r_ok = rr < R
        b = tl.load(w2_tile + (cols[None, :] * R + rr[:, None]),
                    mask=r_ok[:, None] & col_ok[None, :], other=0.0)
    pdl_start(PDL, True)
    prev = tl.load(prev_ptr + rows.to(tl.int64) * stride_prev, mask=row_ok, other=-1)
    row_base = rows.to(tl.int64)
    tile_ok = row_ok[:, None] & col_ok[None, :]
    # the drafter's logits tile with the tokens: loaded after the product it waited for the
    # product's barrier, one more round trip a position
    base_tile = base_ptr + row_base[:, None] * stride_base + (s0 + cols)[None, :]
    x = tl.load(base_tile, mask=tile_ok, other=float("-inf"))
    if LEAD:
        if tl.program_id(1) == 0:
            tl.store(lead_ptr + rows.to(tl.int64) * stride_lead, prev, mask=row_ok)
    in_vocab = row_ok & (prev >= 0) & (prev < V)
    w1_rows = w1_ptr + tl.where(in_vocab, prev, 0).to(tl.int64) * R
    acc = tl.zeros((BLOCK_G, BLOCK_S), tl.float32)
    if ONE_CHUNK:
        a = tl.load(w1_rows[:, None] + rr[None, :], mask=in_vocab[:, None] & r_ok[None, :],
                    other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    else:
        for r0 in range(0, R, BLOCK_R):
            rr = r0 + tl.arange(0, BLOCK_R)
            r_ok = rr < R
            a = tl.load(w1_rows[:, None] + rr[None, :], mask=in_vocab[:, None] & r_ok[None, :],
                        other=0.0)
            b = tl.load(w2_tile + (cols[None, :] * R + rr[:, None]),
                        mask=r_ok[:, None] & col_ok[None, :], other=0.0)
            if IEEE:
                acc = tl.dot(a, b, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
    bias = acc.to(w2_ptr.dtype.element_ty).to(tl.float32)
    z = x.to(tl.float32) + bias
    if STORE:
        out_tile = out_ptr + row_base[:, None] * stride_out + (s0 + cols)[None, :]
        tl.store(out_tile, z, mask=tile_ok)
    val, idx = tile_argmax_t(z, (s0 + cols)[None, :], tile_ok)
    part = row_base * num_tiles + pid_s
    tl.store(part_val_ptr + part, val, mask=row_ok)
    tl.store(part_idx_ptr + part, idx, mask=row_ok)


@triton.jit
def _markov_reduce_kernel(
    part_val_ptr, part_idx_ptr, val_ptr, idx_ptr, num_tiles, vocab_start, stride_idx,
    BLOCK_T: tl.constexpr, PDL: tl.constexpr,
):
    """Stage 2: one program per row reduces its tile pairs in increasing tile order."""
    pdl_start(PDL, True)
    g = tl.program_id(0).to(tl.int64)
    best_val = tl.full((1,), float("-inf"), tl.float32)
    best_tile = tl.full((1,), 2**62, tl.int64)
    for t0 in range(0, num_tiles, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        ok = t < num_tiles
        v = tl.load(part_val_ptr + g * num_tiles + t, mask=ok, other=float("-inf"))
        val, tile = tile_argmax_t(v[None, :], t[None, :], ok[None, :])
        best_val, best_tile = merge_argmax_t(best_val, best_tile, val, tile)
    idx = tl.load(part_idx_ptr + g * num_tiles + best_tile)
    one = tl.arange(0, 1)
    tl.store(val_ptr + g + one, best_val)
    tl.store(idx_ptr + g * stride_idx + one, idx + vocab_start)


@triton.jit
def _markov_chain_kernel(
    base_ptr, anchor_ptr, w1_ptr, w2_ptr, drafts_ptr, lead_ptr, out_ptr,
    part_val_ptr, part_idx_ptr, count_ptr,
    G, K, S, R, V, stride_bg, stride_bk, stride_anchor, stride_dg, stride_dk, stride_lead,
    stride_og, stride_ok, span, n_progs,
    STORE: tl.constexpr, IEEE: tl.constexpr, LEAD: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_K: tl.constexpr, TWO: tl.constexpr, PDL: tl.constexpr,
):
    """The whole chain in one launch (``G <= BLOCK_G``, ``R <= BLOCK_R``, or ``<= 2 * BLOCK_R``
    in two chunks with ``TWO``): program ``p`` owns the vocabulary columns ``p * span ..
    (p + 1) * span - 1`` at every position.

    Its ``w2`` rows are loaded once. At position ``j`` it loads its columns of the base logits,
    waits for the previous position, multiplies the ``w1`` rows of the previous tokens with its
    ``w2`` rows as :func:`_markov_step_kernel` does with the same ``BLOCK_R`` (so the same bits:
    each column's dot is the same), stores its columns' order-T pair per row at ``[j, p, row]``
    and counts itself on ``count[j]`` (release). Before position ``j + 1`` every program waits
    until all ``n_progs`` have counted (acquire) and reduces the pairs in program order, which is
    column order, so each sees the same tokens; program 0 writes them into the drafts. After the
    last position program 0 resets the counts to zero for the next launch or graph replay: every
    other program has passed its last wait once it has counted the last position.

    The wait needs all ``n_progs`` programs on the GPU at once: the host launches at most one
    program per SM, and under ``PDL`` a program lets the next kernel start only once every
    program has started, so a later kernel cannot take the SMs that a program still waits for.
    """
    pid = tl.program_id(0)
    c0 = pid * span
    cols = c0 + tl.arange(0, BLOCK_W)
    col_ok = (cols < c0 + span) & (cols < S)
    rr = tl.arange(0, BLOCK_R)
    r_ok = rr < R
    w2_cols = w2_ptr + cols[None, :].to(tl.int64) * R
    b = tl.load(w2_cols + rr[:, None], mask=r_ok[:, None] & col_ok[None, :], other=0.0)
    if TWO:  # the step's second chunk of the rank, summed after the first as its loop does
        r2_ok = BLOCK_R + rr < R
        b2 = tl.load(w2_cols + (BLOCK_R + rr)[:, None], mask=r2_ok[:, None] & col_ok[None, :],
                     other=0.0)
    pdl_start(PDL, True)
    rows = tl.arange(0, BLOCK_G)
    row_ok = rows < G
    row_base = rows.to(tl.int64)
    tile_ok = row_ok[:, None] & col_ok[None, :]
    progs = tl.arange(0, BLOCK_P)
    p_ok = row_ok[:, None] & (progs[None, :] < n_progs)
    prev = tl.load(anchor_ptr + row_base * stride_anchor, mask=row_ok, other=-1)
    if LEAD:
        if pid == 0:
            tl.store(lead_ptr + row_base * stride_lead, prev, mask=row_ok)
    for j in range(0, K):
        x = tl.load(base_ptr + row_base[:, None] * stride_bg + j * stride_bk + cols[None, :],
                    mask=tile_ok, other=float("-inf"))
        if j > 0:
            _wait_for_all(count_ptr + (j - 1), n_progs)
            prev = _chain_tokens(part_val_ptr, part_idx_ptr, drafts_ptr, j - 1, n_progs, G,
                                 row_base, row_ok, progs, p_ok, stride_dg, stride_dk, pid)
        in_vocab = row_ok & (prev >= 0) & (prev < V)
        w1_rows = w1_ptr + tl.where(in_vocab, prev, 0).to(tl.int64)[:, None] * R
        a = tl.load(w1_rows + rr[None, :], mask=in_vocab[:, None] & r_ok[None, :], other=0.0)
        acc = tl.zeros((BLOCK_G, BLOCK_W), tl.float32)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        if TWO:
            a2 = tl.load(w1_rows + (BLOCK_R + rr)[None, :],
                         mask=in_vocab[:, None] & r2_ok[None, :], other=0.0)
            if IEEE:
                acc = tl.dot(a2, b2, acc, input_precision="ieee")
            else:
                acc = tl.dot(a2, b2, acc)
        z = x.to(tl.float32) + acc.to(w2_ptr.dtype.element_ty).to(tl.float32)
        if STORE:
            tl.store(out_ptr + row_base[:, None] * stride_og + j * stride_ok + cols[None, :], z,
                     mask=tile_ok)
        val, idx = tile_argmax_t(z, cols[None, :], tile_ok)
        mine = (j * n_progs + pid).to(tl.int64) * G + row_base
        tl.store(part_val_ptr + mine, val, mask=row_ok)
        tl.store(part_idx_ptr + mine, idx.to(tl.int32), mask=row_ok)
        tl.debug_barrier()  # every thread's pair store precedes the release below
        tl.atomic_add(count_ptr + j, 1, sem="release")
    if pid == 0:
        _wait_for_all(count_ptr + (K - 1), n_progs)
        _chain_tokens(part_val_ptr, part_idx_ptr, drafts_ptr, K - 1, n_progs, G, row_base,
                      row_ok, progs, p_ok, stride_dg, stride_dk, pid)
        ks = tl.arange(0, BLOCK_K)
        tl.store(count_ptr + ks, 0, mask=ks < K)


@triton.jit
def _wait_for_all(count_ptr, n_progs):
    """Spin until the count at ``count_ptr`` reaches ``n_progs`` (acquire: the pairs the programs
    stored before counting are then visible)."""
    seen = tl.atomic_add(count_ptr, 0, sem="acquire")
    while seen < n_progs:
        seen = tl.atomic_add(count_ptr, 0, sem="acquire")


@triton.jit
def _chain_tokens(part_val_ptr, part_idx_ptr, drafts_ptr, j, n_progs, G, row_base, row_ok, progs,
                  p_ok, stride_dg, stride_dk, pid):
    """Position ``j``'s tokens ``[BLOCK_G] int64`` from its ``n_progs`` pairs per row (order T,
    program order); program 0 also writes them into the drafts' column ``j``."""
    part = (j * n_progs + progs[None, :]).to(tl.int64) * G + row_base[:, None]
    # .cg: read at L2, never an L1 line from an earlier position
    vals = tl.load(part_val_ptr + part, mask=p_ok, other=float("-inf"), cache_modifier=".cg")
    idxs = tl.load(part_idx_ptr + part, mask=p_ok, other=0, cache_modifier=".cg")
    _, tokens = tile_argmax_t(vals, idxs, p_ok)
    tokens = tl.where(row_ok, tokens, -1)
    if pid == 0:
        tl.store(drafts_ptr + row_base * stride_dg + j * stride_dk, tokens, mask=row_ok)
    return tokens


def _markov_launch_sizes(
    rows: int, shard: int, rank: int, dtype: torch.dtype
) -> tuple[int, int, int, int, int]:
    """``(BLOCK_G, BLOCK_S, BLOCK_R, num_warps, num_stages)`` of the stage-1 kernel.

    Up to 16 rows share one ``w2`` tile (``BLOCK_G = 16`` is the tensor-core minimum); larger
    batches use 32- or 64-row tiles whose programs for one ``w2`` tile run back to back (grid axis
    0), so ``w2`` comes from HBM once and from L2 after that. Tile sizes keep the sm_90 build at
    <= ~170 registers per thread (3 programs per SM) so enough ``w2`` loads stay in flight (sizes
    picked with ``benchmarks/kernels.py`` on an H200). fp32 weights cap ``BLOCK_S`` at 64 and
    ``BLOCK_R`` at 32.
    """
    if rows <= 16:
        block_g, block_s, block_r, num_warps = 16, 128, 64, 4
    elif rows <= 32:
        block_g, block_s, block_r, num_warps = 32, 128, 32, 4
    else:
        block_g, block_s, block_r, num_warps = 64, 128, 64, 8
    if dtype == torch.float32:
        block_s, block_r = min(block_s, 64), 32
    block_s = block_size(shard, lo=16, hi=block_s)
    block_r = block_size(rank, lo=16, hi=block_r)
    return block_g, block_s, block_r, num_warps, 3


def _check_width(name: str, width: int) -> None:
    """An empty vocabulary has no argmax (the fused reduce would read past its scratch)."""
    if width < 1:
        raise ShapeError(f"{name} has no vocabulary column; the chain needs at least one")


def _check_step(base, prev, w1, w2, vocab_start, out_corrected, out_idx) -> dict[str, int]:
    """Shapes, dtypes and strides of :func:`markov_step`'s arguments; returns the sizes."""
    s: dict[str, int] = {}
    check_tensor("base", base, ("G", "S"), _BASES, s, unit_stride=True)
    dev = base.device
    check_tensor("prev", prev, ("G",), _I64, s, dev)
    check_tensor("w1", w1, ("V", "r"), FLOAT_DTYPES, s, dev, contiguous=True)
    check_tensor("w2", w2, ("S", "r"), w1.dtype, s, dev, contiguous=True)
    _check_width("base", s["S"])
    if out_corrected is not None:
        check_tensor("out_corrected", out_corrected, ("G", "S"), torch.float32, s, dev,
                     unit_stride=True, distinct_rows=True)
    if out_idx is not None:
        check_tensor("out_idx", out_idx, ("G",), _I64, s, dev)
        if s["G"] > 1 and out_idx.stride(0) == 0:
            raise ShapeError("out_idx must give each row its own element (stride 0 found)")
    if not isinstance(vocab_start, int) or not 0 <= vocab_start <= s["V"] - s["S"]:
        raise ShapeError(
            f"vocab_start must be an int in 0..V-S = {s['V'] - s['S']} so the shard of {s['S']} "
            f"ids fits in the vocabulary of {s['V']}, got {vocab_start!r}"
        )
    return s


def markov_step(
    base: torch.Tensor,
    prev: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    vocab_start: int,
    out_corrected: torch.Tensor | None = None,
    *,
    reverse: bool = False,
    out_idx: torch.Tensor | None = None,
    pdl: bool = False,
    out_prev: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused :func:`markov_step_reference`: two launches (tiled bias GEMM + add + tile pairs,
    then each row's pair reduce; ``reverse`` as in :func:`_markov_step_kernel`). ``pdl``: both
    launch with programmatic dependent launch where the device has it
    (:func:`~draftsmith.kernels.pdl_on`): each lets the next start at once, and the step's
    programs load their ``w2`` tile before they wait for the previous tokens; same bits.

    ``base: [G, S]`` fp32/bf16 and ``out_corrected: [G, S] fp32 | None`` may be row-strided
    views (unit stride along ``S``); ``prev: [G] int64`` and ``out_idx: [G] int64 | None`` any
    stride; ``w1: [V, r]`` and ``w2: [S, r]`` contiguous, same dtype. Pairs match the reference
    at tolerance level: values ``assert_close``, indices equal away from near-ties.
    ``out_prev: [G] int64 | None`` (any stride) is written by the step's first tile column.
    """
    _check_step(base, prev, w1, w2, vocab_start, out_corrected, out_idx)
    if out_prev is not None:
        check_tensor("out_prev", out_prev, (base.shape[0],), _I64, None, base.device)
    rows, shard = base.shape
    dev = base.device
    pair_val = torch.empty((rows,), dtype=torch.float32, device=dev)
    pair_idx = torch.empty((rows,), dtype=_I64, device=dev) if out_idx is None else out_idx
    if rows == 0:
        return pair_val, pair_idx
    block_g, block_s, block_r, num_warps, num_stages = _markov_launch_sizes(
        rows, shard, w1.shape[1], w2.dtype)
    num_tiles = triton.cdiv(shard, block_s)
    part_val = torch.empty((rows, num_tiles), dtype=torch.float32, device=dev)
    part_idx = torch.empty((rows, num_tiles), dtype=_I64, device=dev)
    on = pdl_on(pdl, base)
    _markov_step_kernel[(triton.cdiv(rows, block_g), num_tiles)](
        base, prev, w1, w2, or_dummy(out_corrected, base), part_val, part_idx,
        or_dummy(out_prev, prev), rows, shard, w1.shape[1], w1.shape[0], base.stride(0),
        prev.stride(0), row_stride(out_corrected), 0 if out_prev is None else out_prev.stride(0),
        num_tiles, STORE=out_corrected is not None, IEEE=w2.dtype == torch.float32,
        REVERSE=bool(reverse), LEAD=out_prev is not None,
        BLOCK_G=block_g, BLOCK_S=block_s, BLOCK_R=block_r, ONE_CHUNK=w1.shape[1] <= block_r,
        PDL=on, num_warps=num_warps, num_stages=num_stages, **pdl_kwargs(on),
    )
    _markov_reduce_kernel[(rows,)](
        part_val, part_idx, pair_val, pair_idx, num_tiles, vocab_start, pair_idx.stride(0),
        BLOCK_T=block_size(num_tiles, lo=16, hi=2048), PDL=on, **pdl_kwargs(on),
    )
    return pair_val, pair_idx


def markov_chain(
    base: torch.Tensor, anchor: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, *,
    store_corrected: bool = True, pdl: bool = False, tokens_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Fused :func:`markov_chain_reference` in one launch (:func:`_markov_chain_kernel`): the
    drafts and corrected rows of one :func:`markov_step` per position, bit for bit. Where
    :func:`_chain_in_one_launch` declines (more than 16 rows, fp32 weights on a GPU, a large
    rank or vocabulary, a scratch that would grow inside a CUDA-graph capture) it runs those
    steps: ``j`` reads its previous tokens from the draft column ``j - 1`` that the launch
    before wrote (the anchor for ``j = 0``) and writes its tokens straight into column ``j``;
    odd positions walk ``w2`` backwards (L2 reuse, same bits).

    ``base: [G, K, V]`` fp32/bf16 (unit stride along ``V``), ``anchor: [G] int64``,
    ``w1, w2: [V, r]`` contiguous, same dtype. Drafts equal the reference's away from
    near-ties, corrected logits at tolerance level (the bias sums in another order); against
    a chain of :func:`markov_step` calls both are bit for bit the same. ``pdl``: the launch
    (or every step's, as :func:`markov_step`'s) lets the next kernel start at once and waits
    for the earlier ones before it reads. With ``tokens_out: [G, K + 1] int64`` the chain
    copies the anchor into column 0 and the drafts land in the columns after it (a
    verification's tokens, no concatenation after the chain).
    """
    s: dict[str, int] = {}
    check_tensor("base", base, ("G", "K", "V"), _BASES, s, unit_stride=True)
    check_tensor("anchor", anchor, ("G",), _I64, s, base.device)
    check_tensor("w1", w1, ("V", "r"), FLOAT_DTYPES, s, base.device)
    check_tensor("w2", w2, ("V", "r"), w1.dtype, s, base.device)
    g, k, _ = base.shape
    drafts = _drafts_in(tokens_out, anchor, g, k, base.device)
    if k == 0:
        if tokens_out is not None:
            tokens_out[:, 0] = anchor
        return drafts, base
    corrected = (torch.empty(base.shape, dtype=torch.float32, device=base.device)
                 if store_corrected else None)
    if _chain_in_one_launch(base, anchor, w1, w2, drafts, corrected, tokens_out, pdl):
        return drafts, corrected
    prev = anchor
    for j in range(k):
        lead = tokens_out[:, 0] if j == 0 and tokens_out is not None else None
        markov_step(base[:, j], prev, w1, w2, 0, None if corrected is None else corrected[:, j],
                    reverse=j % 2 == 1, out_idx=drafts[:, j], pdl=pdl, out_prev=lead)
        prev = drafts[:, j]
    return drafts, corrected


def _chain_in_one_launch(base: torch.Tensor, anchor: torch.Tensor, w1: torch.Tensor,
                         w2: torch.Tensor, drafts: torch.Tensor, corrected: torch.Tensor | None,
                         tokens_out: torch.Tensor | None, pdl: bool) -> bool:
    """Run the chain as :func:`_markov_chain_kernel`; ``False`` (nothing launched) where the
    caller chains :func:`markov_step` launches instead (the same bits): more than 16 rows (the
    step's smallest row tile), fp32 weights on a GPU (an H100 gave corrected logits one rounding
    apart from the step's; not pursued: the hot path is bf16, and the interpreter, fp32 only,
    gives the step's bits), a rank over two chunks, more than :data:`_CHAIN_SPAN` columns a
    program (half that with two chunks), or a scratch that would have to grow inside a
    CUDA-graph capture."""
    g, k, vocab = base.shape
    rank = w1.shape[1]
    block_g, block_s, block_r, _, _ = _markov_launch_sizes(g, vocab, rank, w2.dtype)
    if not 0 < g <= 16 or (w2.dtype == torch.float32 and base.is_cuda) or rank > 2 * block_r:
        return False
    num_tiles = triton.cdiv(vocab, block_s)
    span = triton.cdiv(num_tiles, min(num_tiles, sm_count(base.device))) * block_s
    if span > _CHAIN_SPAN or (rank > block_r and span > _CHAIN_SPAN // 2):
        return False  # (two chunks of w2 over 1024 columns would need 320 KB of shared memory)
    n_progs = triton.cdiv(vocab, span)  # every program owns at least one column
    bufs = _CHAIN_SCRATCH.get(base.device, k, k * n_progs * g)
    if bufs is None:
        return False
    counts, part_val, part_idx = bufs
    lead = None if tokens_out is None else tokens_out[:, 0]
    on = pdl_on(pdl, base)
    block_w = block_size(span)
    _markov_chain_kernel[(n_progs,)](
        base, anchor, w1, w2, drafts, or_dummy(lead, anchor), or_dummy(corrected, base),
        part_val, part_idx, counts, g, k, vocab, rank, w1.shape[0], base.stride(0),
        base.stride(1), anchor.stride(0), drafts.stride(0), drafts.stride(1),
        0 if lead is None else lead.stride(0), row_stride(corrected),
        0 if corrected is None else corrected.stride(1), span, n_progs,
        STORE=corrected is not None, IEEE=w2.dtype == torch.float32, LEAD=lead is not None,
        BLOCK_G=block_g, BLOCK_W=block_w, BLOCK_R=block_r,
        BLOCK_P=block_size(n_progs, lo=16), BLOCK_K=block_size(k, lo=16), TWO=rank > block_r,
        PDL=on, num_warps=(8 if block_w >= 512 else 4) * (2 if rank > block_r else 1),
        num_stages=1, **pdl_kwargs(on),
    )
    return True


__all__ = [
    "markov_bias_reference",
    "markov_chain",
    "markov_chain_reference",
    "markov_step",
    "markov_step_reference",
]
