"""The DSpark vanilla Markov chain (spec 2.3, 5.6; choices 9.1, 9.5, 9.6, 9.20).

Owns ``markov_bias_reference`` (the low-rank bias ``w1[prev] @ w2^T``), ``markov_step`` (one block
position on one vocabulary shard: bias, fp32 sum with the base logits, and the order-T argmax
pair) and ``markov_chain`` (the greedy full-vocabulary chain over ``K`` positions). The sampled
and the sharded chains are composed by the runtime from ``markov_step`` and the selection layer.
Imports ``draftsmith.contract`` only.

Precision (TensorRT-LLM form): base logits fp32 (bf16 is widened exactly), the bias rounded to
the weight dtype then widened, the sum in fp32. The fused step computes the bias with its own
dot-product order, so it matches the torch chain at tolerance level, not bitwise (spec 9.20).

The fused step streams ``w2`` once for all ``G`` rows: program ``(g_tile, s_tile)`` multiplies the
gathered ``w1`` rows of its request tile with one ``[BLOCK_S, r]`` tile of ``w2`` on tensor cores,
adds the base logits, optionally stores the corrected row, and reduces an order-T pair per
(row, tile); the last program of each request tile to finish (a device counter with acq_rel
semantics, reset by that program) reduces the tile pairs of its rows: one launch per position.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.kernels._launch import FastLaunch
from draftsmith.kernels._order_t import tile_argmax_t

_I64 = torch.int64
_WEIGHTS = (torch.float32, torch.bfloat16, torch.float16)
_BASES = (torch.float32, torch.bfloat16)


# ----------------------------------------------------------------------------------------------
# Eager references
# ----------------------------------------------------------------------------------------------


def markov_bias_reference(w1: torch.Tensor, w2: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """The Markov bias of the previous tokens: ``[G, S] fp32``.

    ``w1: [V, r]``, ``w2: [S, r]`` (rows of one vocabulary shard, or all ``V``), same dtype;
    ``prev: [G] int64`` global ids::

        bias = float( (w1[prev] @ w2^T) rounded to the weight dtype )

    A ``prev`` outside ``0 .. V-1`` (e.g. ``-1`` padding) selects a zero ``w1`` row, hence a zero
    bias (spec 9.6).
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block position of the chain on one shard.

    ``base: [G, S]`` fp32 (or bf16, widened exactly) base logits of global ids
    ``vocab_start .. vocab_start + S - 1``; ``prev: [G] int64``; ``w1: [V, r]``; ``w2: [S, r]``
    (the same shard's rows); ``out_corrected: [G, S] fp32 | None`` receives
    ``z = base + markov_bias(prev)``. Returns the order-T pair of each row of ``z``:
    ``(pair_val [G] fp32, pair_idx [G] int64)`` with ``pair_idx`` global
    (``vocab_start + argmax_T(z)``), ready for a cross-shard pair reduction.
    """
    z = base.float() + markov_bias_reference(w1, w2, prev)
    if out_corrected is not None:
        out_corrected.copy_(z)
    local = torch.argmax(z, dim=-1)
    return z.gather(1, local[:, None])[:, 0], local + vocab_start


def markov_chain_reference(
    base: torch.Tensor, anchor: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy Markov chain over one block (DeepSpec ``VanillaMarkov``, TensorRT-LLM precision).

    ``base: [G, K, V]`` fp32 block logits, ``anchor: [G] int64`` (the bonus), ``w1, w2: [V, r]``::

        prev = anchor
        for j in 0 .. K-1:
            z[:, j] = base[:, j] + markov_bias(prev)       fp32
            x[:, j] = argmax_T(z[:, j]);  prev = x[:, j]

    Returns ``(drafts [G, K] int64, corrected [G, K, V] fp32)``. ``K == 0`` returns an empty
    ``[G, 0]`` draft tensor and the ``base`` object itself.
    """
    g, k, _ = base.shape
    drafts = torch.empty((g, k), dtype=_I64, device=base.device)
    if k == 0:
        return drafts, base
    corrected = torch.empty(base.shape, dtype=torch.float32, device=base.device)
    prev = anchor
    for j in range(k):
        z = base[:, j].float() + markov_bias_reference(w1, w2, prev)
        corrected[:, j] = z
        prev = torch.argmax(z, dim=-1)
        drafts[:, j] = prev
    return drafts, corrected


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------


@triton.jit
def _markov_step_kernel(
    base_ptr, prev_ptr, w1_ptr, w2_ptr, out_ptr, part_val_ptr, part_idx_ptr, grp_val_ptr,
    grp_idx_ptr, counter_ptr, val_ptr, idx_ptr,
    G, S, R, V, stride_base, stride_prev, stride_out, stride_idx, num_tiles, num_groups,
    vocab_start,
    STORE: tl.constexpr, IEEE: tl.constexpr, EARLY_BASE: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_R: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_NG: tl.constexpr, FIN_R: tl.constexpr,
):
    """Program ``(g_tile, s_tile)``: the bias GEMM of its tile, ``+ base``, the corrected store
    and one order-T pair per row. Device counters (acq_rel, reset by the program that completes
    them) finish the step inside the launch: the last program of each group of ``GROUP`` tiles
    reduces the group's pairs in tile order, the last group of the ``g_tile`` reduces the group
    pairs in group order and writes the step's pairs. One launch per position.

    ``EARLY_BASE`` loads the base tile before the GEMM loop (its latency overlaps the ``w2``
    stream, at the cost of registers held through the loop). Tile
    addresses are int32 offsets from per-program 64-bit bases (a tile spans far less than 2**31
    elements), which keeps the address arithmetic out of the register budget.
    """
    pid_g = tl.program_id(0)
    pid_s = tl.program_id(1)
    s0 = pid_s * BLOCK_S
    rows = pid_g * BLOCK_G + tl.arange(0, BLOCK_G)
    row_ok = rows < G
    cols = tl.arange(0, BLOCK_S)
    col_ok = s0 + cols < S
    tile_ok = row_ok[:, None] & col_ok[None, :]
    row_base = rows.to(tl.int64)[:, None]
    base_tile = base_ptr + row_base * stride_base + (s0 + cols)[None, :]
    if EARLY_BASE:
        x = tl.load(base_tile, mask=tile_ok, other=float("-inf"))
    prev = tl.load(prev_ptr + rows.to(tl.int64) * stride_prev, mask=row_ok, other=-1)
    in_vocab = row_ok & (prev >= 0) & (prev < V)
    w1_rows = w1_ptr + tl.where(in_vocab, prev, 0).to(tl.int64) * R
    w2_tile = w2_ptr + s0.to(tl.int64) * R

    acc = tl.zeros((BLOCK_G, BLOCK_S), tl.float32)
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

    if not EARLY_BASE:
        x = tl.load(base_tile, mask=tile_ok, other=float("-inf"))
    z = x.to(tl.float32) + bias
    if STORE:
        tl.store(out_ptr + row_base * stride_out + (s0 + cols)[None, :], z, mask=tile_ok)
    val, idx = tile_argmax_t(z, (s0 + cols)[None, :], tile_ok)
    part = rows.to(tl.int64) * num_tiles + pid_s
    tl.store(part_val_ptr + part, val, mask=row_ok)
    tl.store(part_idx_ptr + part, idx, mask=row_ok)

    # Two-level finish, so no single program reduces a long row: the last program of each group
    # of GROUP consecutive tiles reduces the group's pairs, and the last group of the row tile
    # reduces the group pairs. debug_barrier: every thread's stores happen before the release
    # of the counter increment; the .cg loads read the other programs' pairs from L2.
    tl.debug_barrier()
    grp = pid_s // GROUP
    in_grp = tl.minimum(num_tiles - grp * GROUP, GROUP)
    done = tl.atomic_add(counter_ptr + pid_g * (num_groups + 1) + grp, 1, sem="acq_rel",
                         scope="gpu")
    if done == in_grp - 1:
        t = grp * GROUP + tl.arange(0, GROUP)
        # FIN_R rows at a time keeps the finishing tiles small in registers
        for rf in range(0, BLOCK_G // FIN_R):
            fr = pid_g * BLOCK_G + rf * FIN_R + tl.arange(0, FIN_R)
            fr_ok = fr < G
            fr64 = fr.to(tl.int64)
            ok = fr_ok[:, None] & (t < num_tiles)[None, :]
            v = tl.load(part_val_ptr + fr64[:, None] * num_tiles + t[None, :], mask=ok,
                        other=float("-inf"), cache_modifier=".cg")
            gv, gt = tile_argmax_t(v, t[None, :], ok)
            gi = tl.load(part_idx_ptr + fr64 * num_tiles + tl.where(fr_ok, gt, 0), mask=fr_ok,
                         other=0, cache_modifier=".cg")
            tl.store(grp_val_ptr + fr64 * num_groups + grp, gv, mask=fr_ok)
            tl.store(grp_idx_ptr + fr64 * num_groups + grp, gi, mask=fr_ok)
        tl.store(counter_ptr + pid_g * (num_groups + 1) + grp, 0)
        tl.debug_barrier()
        last = tl.atomic_add(counter_ptr + pid_g * (num_groups + 1) + num_groups, 1,
                             sem="acq_rel", scope="gpu")
        if last == num_groups - 1:
            gg = tl.arange(0, BLOCK_NG)
            for rf in range(0, BLOCK_G // FIN_R):
                fr = pid_g * BLOCK_G + rf * FIN_R + tl.arange(0, FIN_R)
                fr_ok = fr < G
                fr64 = fr.to(tl.int64)
                ok2 = fr_ok[:, None] & (gg < num_groups)[None, :]
                v2 = tl.load(grp_val_ptr + fr64[:, None] * num_groups + gg[None, :], mask=ok2,
                             other=float("-inf"), cache_modifier=".cg")
                fv, fg = tile_argmax_t(v2, gg[None, :], ok2)
                fi = tl.load(grp_idx_ptr + fr64 * num_groups + tl.where(fr_ok, fg, 0),
                             mask=fr_ok, other=0, cache_modifier=".cg")
                tl.store(val_ptr + fr64, fv, mask=fr_ok)
                tl.store(idx_ptr + fr64 * stride_idx, fi + vocab_start, mask=fr_ok)
            tl.store(counter_ptr + pid_g * (num_groups + 1) + num_groups, 0)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------


def _markov_launch_sizes(
    rows: int, shard: int, rank: int, dtype: torch.dtype
) -> tuple[int, int, int, int, int, bool]:
    """``(BLOCK_G, BLOCK_S, BLOCK_R, num_warps, num_stages, EARLY_BASE)`` of the step kernel.

    Up to 16 rows share one ``w2`` tile (``BLOCK_G = 16`` is the tensor-core minimum); larger
    batches use 32- or 64-row tiles whose programs for one ``w2`` tile run back to back (grid axis
    0), so ``w2`` comes from HBM once and from L2 after that. Tile sizes keep the sm_90 build at
    <= ~170 registers per thread (3 programs per SM) so enough ``w2`` loads stay in flight;
    ``benchmarks/kernels.py --ops markov --sweep`` times the alternatives (``_SIZE_OVERRIDE``).
    """
    if _SIZE_OVERRIDE is not None:
        return _SIZE_OVERRIDE
    if rows <= 16:
        block_g, block_s, block_r = 16, 128, 64
    elif rows <= 32:
        block_g, block_s, block_r = 32, 128, 32
    else:
        block_g, block_s, block_r = 64, 64, 32
    if dtype == torch.float32:
        block_s, block_r = min(block_s, 64), 32
    block_s = min(block_s, max(16, triton.next_power_of_2(max(shard, 1))))
    block_r = min(block_r, max(16, triton.next_power_of_2(max(rank, 1))))
    return block_g, block_s, block_r, 4, 3, False


_SIZE_OVERRIDE: tuple[int, int, int, int, int, bool] | None = None
"""Benchmark hook: when set, every step uses these launch sizes (``--sweep``)."""

_SWEEP_CONFIGS: tuple[tuple[int, int, int, int, int, bool], ...] = (
    # (BLOCK_G, BLOCK_S, BLOCK_R, num_warps, num_stages, EARLY_BASE), all checked offline for
    # sm_90 (no spills, shared memory fits); benchmarks/kernels.py --sweep times them and
    # tests/kernels/test_markov_chain.py::test_gpu_sweep_configs_match_reference checks them.
    (16, 128, 64, 4, 3, False), (16, 128, 64, 4, 3, True), (16, 128, 64, 4, 4, False),
    (16, 64, 64, 4, 4, False), (16, 256, 64, 4, 2, False), (16, 256, 64, 4, 3, False),
    (16, 256, 64, 8, 3, False), (16, 256, 32, 4, 4, False), (16, 128, 128, 4, 2, False),
    (16, 512, 32, 8, 3, False),
    (32, 128, 32, 4, 3, False), (32, 128, 32, 8, 3, False), (32, 64, 64, 4, 3, False),
    (64, 64, 32, 4, 3, False), (64, 64, 32, 4, 3, True), (64, 64, 64, 4, 3, False),
    (64, 128, 32, 8, 3, False), (64, 128, 64, 8, 3, False), (64, 256, 32, 8, 3, False),
    (128, 128, 32, 8, 3, False), (128, 128, 64, 8, 3, False),
)


def _finish_sizes(block_g: int, num_tiles: int) -> tuple[int, int, int, int]:
    """``(GROUP, num_groups, BLOCK_NG, FIN_R)``: about ``sqrt(num_tiles)`` tiles per group (a
    power of two, <= 128), so both finishing reductions read at most a few KB per row block of
    ``FIN_R = min(BLOCK_G, 16)`` rows."""
    root = triton.next_power_of_2(max(int(num_tiles**0.5), 1))
    group = max(2, min(root, 128))
    num_groups = triton.cdiv(num_tiles, group)
    return group, num_groups, max(2, triton.next_power_of_2(num_groups)), min(block_g, 16)


class _StepScratch:
    """Tile and group pair buffers and finish counters of one ``(G, S)`` step shape.

    Cached for the life of the process (a captured CUDA graph keeps their addresses); the
    counters are zeroed once and reset by the program that completes them in every launch, so
    launches of one shape must be ordered (one stream or graph replays), never concurrent.
    """

    _cache: dict[tuple, _StepScratch] = {}

    def __init__(self, sizes, rows: int, shard: int, device) -> None:
        self.sizes = sizes
        self.num_tiles = triton.cdiv(shard, sizes[1])
        self.grid = (triton.cdiv(rows, sizes[0]), self.num_tiles)
        self.group, self.num_groups, self.block_ng, self.fin_r = _finish_sizes(
            sizes[0], self.num_tiles)
        self.part_val = torch.empty((rows * self.num_tiles,), dtype=torch.float32, device=device)
        self.part_idx = torch.empty((rows * self.num_tiles,), dtype=_I64, device=device)
        self.grp_val = torch.empty((rows * self.num_groups,), dtype=torch.float32, device=device)
        self.grp_idx = torch.empty((rows * self.num_groups,), dtype=_I64, device=device)
        self.counter = torch.zeros((self.grid[0] * (self.num_groups + 1),), dtype=torch.int32,
                                   device=device)

    @classmethod
    def get(cls, rows: int, shard: int, rank: int, dtype: torch.dtype, device) -> _StepScratch:
        sizes = _markov_launch_sizes(rows, shard, rank, dtype)
        key = (device, rows, shard, sizes)
        hit = cls._cache.get(key)
        if hit is None:
            hit = cls._cache[key] = cls(sizes, rows, shard, device)
        return hit


_LAUNCH = FastLaunch(_markov_step_kernel)


def _run_step(base, prev, w1, w2, vocab_start, out_corrected, pair_val, pair_idx, scratch):
    """One launch; ``pair_idx`` may be a strided column (the chain's draft column)."""
    rows, shard = base.shape
    block_g, block_s, block_r, num_warps, num_stages, early_base = scratch.sizes
    store = out_corrected is not None
    _LAUNCH(
        scratch.grid,
        (base, prev, w1, w2, out_corrected if store else base, scratch.part_val,
         scratch.part_idx, scratch.grp_val, scratch.grp_idx, scratch.counter, pair_val, pair_idx,
         rows, shard, w1.shape[1], w1.shape[0], base.stride(0), prev.stride(0),
         out_corrected.stride(0) if store else 0, pair_idx.stride(0), scratch.num_tiles,
         scratch.num_groups, vocab_start, store, w2.dtype == torch.float32, early_base,
         block_g, block_s, block_r, scratch.group, scratch.block_ng, scratch.fin_r),
        num_warps=num_warps, num_stages=num_stages,
    )


def _check_rows(name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ShapeError(f"{name} must have unit stride along the vocabulary; call .contiguous()")


def _check_weights(w1: torch.Tensor, w2: torch.Tensor, s: dict[str, int], device) -> None:
    check_tensor("w1", w1, ("V", "r"), _WEIGHTS, s, device, contiguous=True)
    check_tensor("w2", w2, ("S", "r"), w1.dtype, s, device, contiguous=True)


def markov_step(
    base: torch.Tensor,
    prev: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    vocab_start: int,
    out_corrected: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused :func:`markov_step_reference` in one launch (tiled bias GEMM + add + pair; the last
    program of each row tile reduces the tile pairs).

    ``base: [G, S]`` fp32/bf16 and ``out_corrected: [G, S] fp32 | None`` may be row-strided
    views (unit stride along ``S``); ``prev: [G] int64`` any stride; ``w1: [V, r]`` and
    ``w2: [S, r]`` contiguous, same dtype. Pairs match the reference at tolerance level: values
    ``assert_close``, indices equal away from near-ties (spec 9.20).
    """
    s: dict[str, int] = {}
    check_tensor("base", base, ("G", "S"), _BASES, s)
    dev = base.device
    check_tensor("prev", prev, ("G",), _I64, s, dev)
    _check_weights(w1, w2, s, dev)
    _check_rows("base", base)
    if out_corrected is not None:
        check_tensor("out_corrected", out_corrected, ("G", "S"), torch.float32, s, dev)
        _check_rows("out_corrected", out_corrected)
    if not isinstance(vocab_start, int) or not 0 <= vocab_start <= s["V"] - s["S"]:
        raise ShapeError(
            f"vocab_start must be an int in 0..V-S = {s['V'] - s['S']} so the shard of {s['S']} "
            f"ids fits in the vocabulary of {s['V']}, got {vocab_start!r}"
        )
    rows = s["G"]
    pair_val = torch.empty((rows,), dtype=torch.float32, device=dev)
    pair_idx = torch.empty((rows,), dtype=_I64, device=dev)
    if rows:
        scratch = _StepScratch.get(rows, s["S"], s["r"], w2.dtype, dev)
        _run_step(base, prev, w1, w2, vocab_start, out_corrected, pair_val, pair_idx, scratch)
    return pair_val, pair_idx


def markov_chain(
    base: torch.Tensor, anchor: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused :func:`markov_chain_reference`: one launch per position, no host sync (graph-safe).

    ``base: [G, K, V]`` fp32 (bf16 widened), ``anchor: [G] int64``, ``w1, w2: [V, r]``
    contiguous, same dtype. Returns ``(drafts [G, K] int64, corrected [G, K, V] fp32)``;
    ``K == 0`` returns ``base`` itself.
    """
    s: dict[str, int] = {}
    check_tensor("base", base, ("G", "K", "V"), _BASES, s)
    dev = base.device
    check_tensor("anchor", anchor, ("G",), _I64, s, dev)
    check_tensor("w1", w1, ("V", "r"), _WEIGHTS, s, dev, contiguous=True)
    check_tensor("w2", w2, ("V", "r"), w1.dtype, s, dev, contiguous=True)
    _check_rows("base", base)
    rows, k, vocab = base.shape
    drafts = torch.empty((rows, k), dtype=_I64, device=dev)
    if k == 0:
        return drafts, base
    corrected = torch.empty((rows, k, vocab), dtype=torch.float32, device=dev)
    if rows == 0:
        return drafts, corrected
    scratch = _StepScratch.get(rows, vocab, s["r"], w2.dtype, dev)
    pair_val = torch.empty((rows,), dtype=torch.float32, device=dev)
    prev = anchor
    for j in range(k):
        _run_step(base[:, j], prev, w1, w2, 0, corrected[:, j], pair_val, drafts[:, j], scratch)
        prev = drafts[:, j]
    return drafts, corrected


__all__ = [
    "markov_bias_reference",
    "markov_chain",
    "markov_chain_reference",
    "markov_step",
    "markov_step_reference",
]
