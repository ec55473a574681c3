"""Strict (greedy) acceptance of a verified block (spec 3.2, 3.4 ragged lengths, 0.3 order T).

Owns ``strict_accept`` (argmax of the target logits fused with the leading-match count, one
launch) and ``strict_accept_tokens`` (the same count when the target tokens already came from a
vocab-parallel exchange). Imports ``draftsmith.contract`` only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.kernels._launch import FastLaunch
from draftsmith.kernels._order_t import merge_argmax_t, tile_argmax_t

_LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


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
def _strict_accept_kernel(
    logits_ptr, drafts_ptr, verify_ptr, accepted_ptr, num_ptr, part_val_ptr, part_idx_ptr,
    counter_ptr, K, V, CHUNK, NUM_CHUNKS,
    HAS_VERIFY: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Program ``(chunk, row)`` reduces ``CHUNK`` columns of one logits row to an order-T pair;
    the last program of a request to finish (device counter, acq_rel) merges the pairs of its
    ``K+1`` rows in chunk order, counts the leading matches and resets the counter."""
    pid = tl.program_id(0)
    c = pid % NUM_CHUNKS
    row = (pid // NUM_CHUNKS).to(tl.int64)
    start = c * CHUNK
    stop = tl.minimum(start + CHUNK, V)
    base = logits_ptr + row * V
    cols0 = tl.arange(0, BLOCK_V)
    best_val = tl.full((1,), float("-inf"), tl.float32)
    best_idx = tl.full((1,), 2**62, tl.int64)
    for s in range(start, stop, BLOCK_V):
        cols = s + cols0
        valid = cols < V  # CHUNK is a multiple of BLOCK_V: no step crosses the chunk end
        x = tl.load(base + cols, mask=valid, other=float("-inf")).to(tl.float32)
        val, idx = tile_argmax_t(x[None, :], cols[None, :], valid[None, :])
        best_val, best_idx = merge_argmax_t(best_val, best_idx, val, idx)
    one = tl.arange(0, 1)
    part = row * NUM_CHUNKS + c
    tl.store(part_val_ptr + part + one, best_val)
    tl.store(part_idx_ptr + part + one, best_idx)
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
                         other=0, cache_modifier=".cg")
        tl.store(accepted_ptr + b * (K + 1) + rows, target, mask=row_ok)
        is_draft = rows < K
        draft = tl.load(drafts_ptr + b * K + rows, mask=is_draft, other=-1)
        match = is_draft & (draft == target)
        if HAS_VERIFY:
            match = match & (rows < tl.load(verify_ptr + b))
        first_miss = tl.min(tl.where(is_draft & ~match, rows, K), axis=0)
        tl.store(num_ptr + b, (first_miss + 1).to(tl.int64))
        tl.store(counter_ptr + b, 0)


@triton.jit
def _strict_accept_tokens_kernel(
    tokens_ptr, drafts_ptr, verify_ptr, accepted_ptr, num_ptr, K,
    HAS_VERIFY: tl.constexpr, BLOCK_R: tl.constexpr,
):
    """One program per request: load its ``K+1`` target tokens, copy them, count the matches."""
    b = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, BLOCK_R)
    row_ok = rows < K + 1
    target = tl.load(tokens_ptr + b * (K + 1) + rows, mask=row_ok, other=0)
    tl.store(accepted_ptr + b * (K + 1) + rows, target, mask=row_ok)
    is_draft = rows < K
    draft = tl.load(drafts_ptr + b * K + rows, mask=is_draft, other=-1)
    match = is_draft & (draft == target)
    if HAS_VERIFY:
        match = match & (rows < tl.load(verify_ptr + b))
    first_miss = tl.min(tl.where(is_draft & ~match, rows, K), axis=0)
    tl.store(num_ptr + b, (first_miss + 1).to(tl.int64))


_TARGET_PROGRAMS = 1056
"""About 8 resident programs on each of the 132 SMs of an H200: enough loads in flight to stream
the logits at copy bandwidth when ``G`` is small."""

_MAX_BLOCK_V = 2048
_MAX_STEPS = 16


def _strict_accept_launch_sizes(
    rows: int, k1: int, vocab: int
) -> tuple[int, int, int, int, int, int]:
    """``(BLOCK_V, CHUNK, NUM_CHUNKS, BLOCK_R, BLOCK_C, num_warps)`` for ``rows = G * (K+1)``.

    Each of the ``rows * NUM_CHUNKS`` programs streams ``CHUNK`` (a multiple of ``BLOCK_V``)
    columns of one row in ``BLOCK_V``-wide steps (2048 fp32 = 16 per thread with 4 warps: four
    16-byte loads in flight per thread). The vocabulary is cut into enough chunks for about
    ``_TARGET_PROGRAMS`` programs, and never more than ``_MAX_STEPS`` steps per chunk, so large
    batches run many short programs and the last partial wave stays short. A small vocabulary
    still gets two chunks so that the chunk merge is exercised on the CPU interpreter too.
    """
    block_v = max(16, min(_MAX_BLOCK_V, triton.next_power_of_2(max(-(-vocab // 2), 1))))
    tiles = -(-vocab // block_v)
    want_chunks = max(1, -(-_TARGET_PROGRAMS // max(rows, 1)))
    steps = max(1, min(_MAX_STEPS, round(tiles / want_chunks)))
    chunk = block_v * steps
    num_chunks = -(-vocab // chunk)
    block_r = triton.next_power_of_2(max(k1, 1))
    block_c = max(2, triton.next_power_of_2(num_chunks))
    return block_v, chunk, num_chunks, block_r, block_c, 4


def _check_acceptance_inputs(
    name: str, table: torch.Tensor, table_shape: tuple, table_dtypes, drafts: torch.Tensor,
    verify_len: torch.Tensor | None,
) -> dict[str, int]:
    sizes: dict[str, int] = {}
    check_tensor(name, table, table_shape, table_dtypes, sizes, contiguous=True)
    check_tensor("drafts", drafts, ("G", "K"), torch.int64, sizes, table.device, contiguous=True)
    if table.shape[1] != drafts.shape[1] + 1:
        raise ShapeError(
            f"{name} dim 1 must be K+1 = {drafts.shape[1] + 1} for drafts of shape "
            f"{tuple(drafts.shape)}, got shape {tuple(table.shape)}"
        )
    if verify_len is not None:
        check_tensor("verify_len", verify_len, ("G",), torch.int64, sizes, table.device,
                     contiguous=True)
    return sizes


class _Scratch:
    """Per-shape device scratch of :func:`strict_accept`: the chunk pairs and the per-request
    finish counters (zeroed once, reset by the kernel). Cached for the life of the process so
    that a captured CUDA graph keeps valid addresses; launches sharing a shape must be ordered
    (one stream, or graph replays), never concurrent."""

    _cache: dict[tuple, _Scratch] = {}

    def __init__(self, device: torch.device, g: int, rows: int, num_chunks: int) -> None:
        self.part_val = torch.empty((rows * num_chunks,), dtype=torch.float32, device=device)
        self.part_idx = torch.empty((rows * num_chunks,), dtype=torch.int64, device=device)
        self.counter = torch.zeros((g,), dtype=torch.int32, device=device)

    @classmethod
    def get(cls, device: torch.device, g: int, rows: int, num_chunks: int) -> _Scratch:
        key = (device, g, rows, num_chunks)
        hit = cls._cache.get(key)
        if hit is None:
            hit = cls._cache[key] = cls(device, g, rows, num_chunks)
        return hit


_LAUNCH = FastLaunch(_strict_accept_kernel)
_LAUNCH_TOKENS = FastLaunch(_strict_accept_tokens_kernel)
_SIZES: dict[tuple[int, int, int], tuple[int, int, int, int, int, int]] = {}


def _fast_ok(table, ndim: int, dtypes, drafts, verify_len) -> bool:
    """The common case checked with plain attribute comparisons; on ``False`` the caller runs
    the full validation, which raises with a precise message (or accepts an unusual but valid
    input)."""
    return (
        type(table) is torch.Tensor and type(drafts) is torch.Tensor
        and table.dim() == ndim and drafts.dim() == 2 and table.dtype in dtypes
        and drafts.dtype is torch.int64 and table.shape[0] == drafts.shape[0]
        and table.shape[1] == drafts.shape[1] + 1 and table.device == drafts.device
        and table.is_contiguous() and drafts.is_contiguous()
        and (verify_len is None or (
            type(verify_len) is torch.Tensor and verify_len.dim() == 1
            and verify_len.dtype is torch.int64 and verify_len.shape[0] == drafts.shape[0]
            and verify_len.device == drafts.device and verify_len.is_contiguous()))
    )


def _outputs(g: int, k1: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``accepted [G, K+1]`` and ``num_accepted [G]`` (two allocations: cheaper on the host than
    one allocation split into views)."""
    return (torch.empty((g, k1), dtype=torch.int64, device=device),
            torch.empty((g,), dtype=torch.int64, device=device))


def strict_accept(
    logits: torch.Tensor, drafts: torch.Tensor, verify_len: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused :func:`strict_accept_reference` in one launch; bit-identical outputs.

    ``logits: [G, K+1, V]`` contiguous fp32/bf16/fp16, ``drafts: [G, K] int64``,
    ``verify_len: [G] int64 | None``. The ``G * (K+1) * NUM_CHUNKS`` programs each reduce one
    chunk of one row; the last one of each request finishes it (no second launch). Launches
    that share a shape must not run concurrently on two streams (they share a device scratch).
    """
    if not _fast_ok(logits, 3, _LOGIT_DTYPES, drafts, verify_len):
        _check_acceptance_inputs("logits", logits, ("G", "K1", "V"), _LOGIT_DTYPES, drafts,
                                 verify_len)
    g, k1, vocab = logits.shape
    dev = logits.device
    accepted, num_accepted = _outputs(g, k1, dev)
    if g == 0:
        return accepted, num_accepted
    if vocab == 0:
        raise ShapeError("logits must have a vocabulary of at least one column (V >= 1)")
    rows = g * k1
    sizes = _SIZES.get((rows, k1, vocab))
    if sizes is None:
        sizes = _SIZES[(rows, k1, vocab)] = _strict_accept_launch_sizes(rows, k1, vocab)
    block_v, chunk, num_chunks, block_r, block_c, num_warps = sizes
    scratch = _Scratch.get(dev, g, rows, num_chunks)
    has_verify = verify_len is not None
    _LAUNCH(
        (rows * num_chunks,),
        (logits, drafts, verify_len if has_verify else drafts, accepted, num_accepted,
         scratch.part_val, scratch.part_idx, scratch.counter, k1 - 1, vocab, chunk, num_chunks,
         has_verify, block_v, block_r, block_c),
        num_warps=num_warps,
    )
    return accepted, num_accepted


def strict_accept_tokens(
    target_tokens: torch.Tensor, drafts: torch.Tensor, verify_len: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel form of :func:`strict_accept_tokens_reference`; bit-identical outputs.

    ``target_tokens: [G, K+1] int64``, ``drafts: [G, K] int64``, ``verify_len: [G] int64 | None``.
    """
    if not _fast_ok(target_tokens, 2, (torch.int64,), drafts, verify_len):
        _check_acceptance_inputs(
            "target_tokens", target_tokens, ("G", "K1"), torch.int64, drafts, verify_len
        )
    g, k1 = target_tokens.shape
    accepted, num_accepted = _outputs(g, k1, target_tokens.device)
    if g:
        has_verify = verify_len is not None
        _LAUNCH_TOKENS(
            (g,),
            (target_tokens, drafts, verify_len if has_verify else drafts, accepted, num_accepted,
             k1 - 1, has_verify, triton.next_power_of_2(k1)),
        )
    return accepted, num_accepted


__all__ = [
    "strict_accept",
    "strict_accept_reference",
    "strict_accept_tokens",
    "strict_accept_tokens_reference",
]
