"""Strict (greedy) acceptance of a verified block (ragged verify lengths,
torch.argmax order).

Owns ``strict_accept`` (argmax of the target logits fused with the leading-match count, one
launch) and ``strict_accept_tokens`` (the same count when the target tokens already came from a
vocab-parallel exchange). Imports ``draftsmith.contract`` only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels._launch import block_size, or_dummy
from draftsmith.kernels._pair import PROGRAMS_PER_SM, PairScratch, sm_count, tile_argmax_t


def strict_accept_tokens_reference(
    target_tokens: torch.Tensor, drafts: torch.Tensor, verify_len: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Count the accepted prefix given the target's tokens.

    ``target_tokens: [G, K+1] int64`` (``t``, row ``j`` predicts the token after draft ``j-1``),
    ``drafts: [G, K] int64`` (``e``), ``verify_len: [G] int64`` drafted positions verified
    (``0..K``; ``None`` means ``K``). Returns ``accepted: [G, K+1] int64 = t`` (a copy) and
    ``num_accepted: [G] int64``::

        n_b = 1 + #leading j < K with e_j == t_j and j < verify_len_b

    so ``1 <= n_b <= verify_len_b + 1`` and the bonus token is ``accepted[b, n_b - 1]``.
    """
    k = drafts.shape[1]
    match = drafts == target_tokens[:, :k]
    if verify_len is not None:
        match &= torch.arange(k, device=drafts.device) < verify_len[:, None]
    num_accepted = 1 + match.to(torch.int64).cumprod(dim=1).sum(dim=1)
    return target_tokens.to(torch.int64, copy=True), num_accepted


def strict_accept_reference(
    logits: torch.Tensor, drafts: torch.Tensor, verify_len: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy acceptance from the target logits.

    ``logits: [G, K+1, V]`` float (fp32, bf16 or fp16), ``drafts: [G, K] int64``,
    ``verify_len: [G] int64 | None``. ``t = argmax_T(logits, -1)`` (order T: first NaN, else the
    first maximum, ``-0.0 == +0.0``), then :func:`strict_accept_tokens_reference`. Returns
    ``(accepted [G, K+1] int64, num_accepted [G] int64)``.
    """
    return strict_accept_tokens_reference(torch.argmax(logits, dim=-1), drafts, verify_len)


@triton.jit
def _store_num_accepted(target, rows, b, drafts_ptr, stride_drafts, verify_ptr, num_ptr, K,
                        HAS_VERIFY: tl.constexpr):
    """Request ``b``'s accepted count (bonus included) from its ``K+1`` target tokens
    ``target`` (lanes ``rows``): one plus the leading drafts that match, cut at ``verify_len``."""
    is_draft = rows < K
    draft = tl.load(drafts_ptr + b * stride_drafts + rows, mask=is_draft, other=-1)
    match = is_draft & (draft == target)
    if HAS_VERIFY:
        match = match & (rows < tl.load(verify_ptr + b))
    first_miss = tl.min(tl.where(is_draft & ~match, rows, K), axis=0)
    tl.store(num_ptr + b, (first_miss + 1).to(tl.int64))


@triton.jit
def _strict_accept_kernel(
    logits_ptr, drafts_ptr, verify_ptr, accepted_ptr, num_ptr, part_val_ptr, part_idx_ptr,
    counter_ptr, K, V, CHUNK, NUM_CHUNKS, stride_drafts,
    HAS_VERIFY: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Program ``(chunk, row)`` reduces ``CHUNK`` columns of one logits row to an order-T pair;
    the last program of a request to finish (device counter, acq_rel) merges the pairs of its
    ``K+1`` rows in chunk order, counts the leading matches and resets the counter.

    Each lane keeps an order-T best (lane ``i`` sees columns ``start + i, start + i + BLOCK_V,
    ...`` in increasing order, so a later column replaces the lane's best only when strictly
    larger, or a NaN over a non-NaN) and the program reduces its lanes once at the end.
    """
    pid = tl.program_id(0)
    c = pid % NUM_CHUNKS
    row = (pid // NUM_CHUNKS).to(tl.int64)
    start = c * CHUNK
    stop = tl.minimum(start + CHUNK, V)
    base = logits_ptr + row * V
    cols0 = tl.arange(0, BLOCK_V)
    lane_val = tl.full((BLOCK_V,), float("-inf"), tl.float32)
    lane_idx = tl.full((BLOCK_V,), 2**31 - 1, tl.int32)  # empty lane
    for s in range(start, stop, BLOCK_V):
        cols = s + cols0
        # two compares against multiples of 16 (not one against min(...)) keep the mask
        # provably constant over 16-column groups: vectorized loads
        valid = (cols < start + CHUNK) & (cols < V)
        x = tl.load(base + cols, mask=valid, other=float("-inf")).to(tl.float32)
        lane_nan = lane_val != lane_val
        take = valid & ((lane_idx == 2**31 - 1) | ((x != x) & ~lane_nan)
                        | (~lane_nan & (x > lane_val)))
        lane_val = tl.where(take, x, lane_val)
        lane_idx = tl.where(take, cols, lane_idx)
    best_val, best_idx = tile_argmax_t(lane_val[None, :], lane_idx[None, :],
                                       (lane_idx != 2**31 - 1)[None, :])
    one = tl.arange(0, 1)
    part = row * NUM_CHUNKS + c
    tl.store(part_val_ptr + part + one, best_val)
    tl.store(part_idx_ptr + part + one, best_idx.to(tl.int32))
    # every thread's pair store happens before the release of the counter increment
    tl.debug_barrier()
    b = row // (K + 1)
    done = tl.atomic_add(counter_ptr + b, 1, sem="acq_rel", scope="gpu")
    if done == (K + 1) * NUM_CHUNKS - 1:
        rows = tl.arange(0, BLOCK_R)
        row_ok = rows < K + 1
        chunks = tl.arange(0, BLOCK_C)
        ok = row_ok[:, None] & (chunks < NUM_CHUNKS)[None, :]
        pair = (b * (K + 1) + rows.to(tl.int64))[:, None] * NUM_CHUNKS + chunks[None, :]
        # .cg: read the other programs' pairs from L2, never from a stale L1 line
        pv = tl.load(part_val_ptr + pair, mask=ok, other=float("-inf"), cache_modifier=".cg")
        _, win = tile_argmax_t(pv, chunks[None, :], ok)
        win = tl.where(row_ok, win, 0)
        target = tl.load(part_idx_ptr + (b * (K + 1) + rows) * NUM_CHUNKS + win, mask=row_ok,
                         other=0, cache_modifier=".cg").to(tl.int64)
        tl.store(accepted_ptr + b * (K + 1) + rows, target, mask=row_ok)
        _store_num_accepted(target, rows, b, drafts_ptr, stride_drafts, verify_ptr, num_ptr, K,
                            HAS_VERIFY)
        tl.store(counter_ptr + b, 0)


@triton.jit
def _strict_accept_tokens_kernel(
    tokens_ptr, drafts_ptr, verify_ptr, accepted_ptr, num_ptr, K, stride_drafts,
    HAS_VERIFY: tl.constexpr, BLOCK_R: tl.constexpr,
):
    """One program per request: load its ``K+1`` target tokens, copy them, count the matches."""
    b = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, BLOCK_R)
    row_ok = rows < K + 1
    target = tl.load(tokens_ptr + b * (K + 1) + rows, mask=row_ok, other=0)
    tl.store(accepted_ptr + b * (K + 1) + rows, target, mask=row_ok)
    _store_num_accepted(target, rows, b, drafts_ptr, stride_drafts, verify_ptr, num_ptr, K,
                            HAS_VERIFY)


def _launch_sizes(rows: int, k1: int, vocab: int,
                  device: torch.device) -> tuple[int, int, int, int, int, int]:
    """``(BLOCK_V, CHUNK, NUM_CHUNKS, BLOCK_R, BLOCK_C, num_warps)`` for ``rows = G * (K+1)``.

    The vocabulary is split into the chunk count nearest ``programs / rows`` (at least one),
    each chunk rounded up to 64 columns (16-byte aligned starts). Sizes picked with
    ``benchmarks/kernels.py`` on an H200: up to 32 rows, 2048-column steps, 4 programs per SM,
    4 warps; beyond, 1024-column steps, 8 programs per SM, 8 warps.
    """
    small = rows <= 32
    # the interpreter takes an H200's 132 SMs, so CPU tests see its chunks
    sms = sm_count(device) if device.type == "cuda" else 132
    programs = sms * PROGRAMS_PER_SM * (1 if small else 2)
    want_chunks = max(1, round(programs / max(rows, 1)))
    chunk = triton.cdiv(triton.cdiv(vocab, want_chunks), 64) * 64
    num_chunks = triton.cdiv(vocab, chunk)
    block_v = block_size(chunk, lo=16, hi=2048 if small else 1024)
    return (block_v, chunk, num_chunks, block_size(k1, lo=1), block_size(num_chunks, lo=2),
            4 if small else 8)


def _check_acceptance_inputs(
    name: str, table: torch.Tensor, table_shape: tuple, table_dtypes, drafts: torch.Tensor,
    verify_len: torch.Tensor | None,
) -> None:
    sizes: dict[str, int] = {}
    check_tensor(name, table, table_shape, table_dtypes, sizes, contiguous=True)
    check_tensor("drafts", drafts, ("G", "K"), torch.int64, sizes, table.device, unit_stride=True)
    if table.shape[1] != drafts.shape[1] + 1:
        raise ShapeError(
            f"{name} dim 1 must be K+1 = {drafts.shape[1] + 1} for drafts of shape "
            f"{tuple(drafts.shape)}, got shape {tuple(table.shape)}"
        )
    if verify_len is not None:
        check_tensor("verify_len", verify_len, ("G",), torch.int64, sizes, table.device,
                     contiguous=True)


_SCRATCH = PairScratch()
_I64 = torch.int64


def strict_accept(
    logits: torch.Tensor, drafts: torch.Tensor, verify_len: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused :func:`strict_accept_reference` in one launch; bit-identical outputs.

    Every tensor contiguous but ``drafts``, which may be row-strided (the drafts beside their
    bonus in a verification's tokens). The ``G * (K+1) * NUM_CHUNKS`` programs each reduce one chunk of
    one row; the last one of each request finishes it (no second launch). Launches must not run
    concurrently on two streams (they share a device scratch). Every call returns freshly
    allocated outputs.
    """
    _check_acceptance_inputs("logits", logits, ("G", "K1", "V"), FLOAT_DTYPES, drafts,
                             verify_len)
    g, k1, vocab = logits.shape
    accepted = logits.new_empty((g, k1), dtype=_I64)
    num_accepted = logits.new_empty((g,), dtype=_I64)
    if g == 0:
        return accepted, num_accepted
    if vocab == 0:
        raise ShapeError("logits must have a vocabulary of at least one column (V >= 1)")
    rows = g * k1
    block_v, chunk, num_chunks, block_r, block_c, num_warps = _launch_sizes(rows, k1, vocab,
                                                                            logits.device)
    bufs = _SCRATCH.get(logits.device, g, rows * num_chunks)
    if bufs is None:  # a capture that needs more scratch: this graph zeroes its own counters
        bufs = (torch.zeros(g, dtype=torch.int32, device=logits.device),
                logits.new_empty(rows * num_chunks, dtype=torch.float32),
                logits.new_empty(rows * num_chunks, dtype=torch.int32))
    counts, part_val, part_idx = bufs
    has_verify = verify_len is not None
    _strict_accept_kernel[(rows * num_chunks,)](
        logits, drafts, or_dummy(verify_len, drafts), accepted, num_accepted, part_val,
        part_idx, counts, k1 - 1, vocab, chunk, num_chunks, drafts.stride(0),
        HAS_VERIFY=has_verify,
        BLOCK_V=block_v, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=num_warps,
    )
    return accepted, num_accepted


def strict_accept_tokens(
    target_tokens: torch.Tensor, drafts: torch.Tensor, verify_len: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel form of :func:`strict_accept_tokens_reference` (every tensor contiguous but
    ``drafts``, which may be row-strided); bit-identical outputs."""
    _check_acceptance_inputs("target_tokens", target_tokens, ("G", "K1"), _I64, drafts,
                             verify_len)
    g, k1 = target_tokens.shape
    accepted = target_tokens.new_empty((g, k1), dtype=_I64)
    num_accepted = target_tokens.new_empty((g,), dtype=_I64)
    if g:
        has_verify = verify_len is not None
        _strict_accept_tokens_kernel[(g,)](
            target_tokens, drafts, or_dummy(verify_len, drafts), accepted, num_accepted,
            k1 - 1, drafts.stride(0), HAS_VERIFY=has_verify, BLOCK_R=block_size(k1),
        )
    return accepted, num_accepted


__all__ = [
    "strict_accept",
    "strict_accept_reference",
    "strict_accept_tokens",
    "strict_accept_tokens_reference",
]
