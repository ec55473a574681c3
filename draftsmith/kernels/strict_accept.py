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
from draftsmith.kernels._launch import FastLaunch, hooks_installed, raw_stream
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
def _store_num_accepted(target, rows, b, drafts_ptr, verify_ptr, num_ptr, K,
                        HAS_VERIFY: tl.constexpr):
    """Request ``b``'s accepted count (bonus included) from its ``K+1`` target tokens
    ``target`` (lanes ``rows``): one plus the leading drafts that match, cut at ``verify_len``."""
    is_draft = rows < K
    draft = tl.load(drafts_ptr + b * K + rows, mask=is_draft, other=-1)
    match = is_draft & (draft == target)
    if HAS_VERIFY:
        match = match & (rows < tl.load(verify_ptr + b))
    first_miss = tl.min(tl.where(is_draft & ~match, rows, K), axis=0)
    tl.store(num_ptr + b, (first_miss + 1).to(tl.int64))


@triton.jit
def _strict_accept_kernel(
    logits_ptr, drafts_ptr, verify_ptr, accepted_ptr, num_ptr, part_val_ptr, part_idx_ptr,
    counter_ptr, K, V, CHUNK, NUM_CHUNKS,
    HAS_VERIFY: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr, LANE: tl.constexpr = False,
):
    """Program ``(chunk, row)`` reduces ``CHUNK`` columns of one logits row to an order-T pair;
    the last program of a request to finish (device counter, acq_rel) merges the pairs of its
    ``K+1`` rows in chunk order, counts the leading matches and resets the counter.

    ``LANE=False`` reduces every ``BLOCK_V`` step across the program (three block reductions
    per step; ``CHUNK`` a multiple of ``BLOCK_V``). ``LANE=True`` keeps an order-T best per
    lane (lane ``i`` sees columns ``start + i, start + i + BLOCK_V, ...`` in increasing order,
    so a later column replaces the lane's best only when strictly larger, or a NaN over a
    non-NaN) and reduces across the program once at the end; ``CHUNK`` is then any multiple of
    64 and the last step of a chunk is masked at the chunk end.
    """
    pid = tl.program_id(0)
    c = pid % NUM_CHUNKS
    row = (pid // NUM_CHUNKS).to(tl.int64)
    start = c * CHUNK
    stop = tl.minimum(start + CHUNK, V)
    base = logits_ptr + row * V
    cols0 = tl.arange(0, BLOCK_V)
    if LANE:
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
    else:
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
        _store_num_accepted(target, rows, b, drafts_ptr, verify_ptr, num_ptr, K, HAS_VERIFY)
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
    _store_num_accepted(target, rows, b, drafts_ptr, verify_ptr, num_ptr, K, HAS_VERIFY)


_TARGET_PROGRAMS = 1056
"""About 8 resident programs on each of the 132 SMs of an H200: enough loads in flight to stream
the logits at copy bandwidth when ``G`` is small."""

_MAX_BLOCK_V = 2048
_MAX_STEPS = 16

StrictConfig = tuple[bool, int, int, int]
"""``(LANE, BLOCK_V, TARGET_PROGRAMS, num_warps)`` of :func:`strict_accept`'s kernel."""

_DEFAULT_CONFIG: StrictConfig = (False, _MAX_BLOCK_V, _TARGET_PROGRAMS, 4)

_DEFAULT_BY_ROWS: tuple[tuple[int, StrictConfig], ...] = (
    (32, (True, 2048, 528, 4)),
    (1 << 62, (True, 1024, 1056, 8)),
)
"""``(max rows, config)`` in increasing order: the first entry with ``rows = G * (K+1)`` at
most its bound is the default (``benchmarks/kernels.py --sweep`` prints a replacement). These
are the picks of the H200 sweep of 2026-11-30 (lane reduction; G = 4 / 32 / 128 at K+1 = 8:
10.2 / 43.2 / 146.1 us in a graph against 12.6 / 68.1 / 237.8 us for ``_DEFAULT_CONFIG``;
``benchmarks/results/kernels_nvidia-h200_2026-11-30T093729Z.txt``)."""

_SIZE_OVERRIDE: StrictConfig | None = None
"""Set only by ``benchmarks/kernels.py --sweep`` (which also clears ``_SIZES`` and ``_PLANS``)
to time an alternative launch configuration."""

_SWEEP_CONFIGS: tuple[StrictConfig, ...] = (
    _DEFAULT_CONFIG,
    (False, 1024, 1056, 4), (False, 2048, 2112, 4), (False, 4096, 1056, 8),
    (True, 1024, 1056, 4), (True, 2048, 1056, 4), (True, 2048, 528, 4), (True, 2048, 2112, 4),
    (True, 1024, 2112, 4), (True, 1024, 4224, 4), (True, 4096, 1056, 8), (True, 4096, 2112, 8),
    (True, 512, 2112, 2), (True, 512, 4224, 2), (True, 1024, 1056, 8), (True, 2048, 4224, 8),
)
"""Launch configurations ``benchmarks/kernels.py --sweep`` times (the default first)."""


def _strict_accept_launch_sizes(
    rows: int, k1: int, vocab: int
) -> tuple[int, int, int, int, int, int, bool]:
    """``(BLOCK_V, CHUNK, NUM_CHUNKS, BLOCK_R, BLOCK_C, num_warps, LANE)`` for
    ``rows = G * (K+1)`` under ``_SIZE_OVERRIDE`` or the default configuration.

    Default (``LANE=False``): each of the ``rows * NUM_CHUNKS`` programs streams ``CHUNK`` (a
    multiple of ``BLOCK_V``) columns of one row in ``BLOCK_V``-wide steps (2048 fp32 = 16 per
    thread with 4 warps: four 16-byte loads in flight per thread). The vocabulary is cut into
    enough chunks for about ``_TARGET_PROGRAMS`` programs, and never more than ``_MAX_STEPS``
    steps per chunk, so large batches run many short programs and the last partial wave stays
    short. A small vocabulary still gets two chunks so that the chunk merge is exercised on the
    CPU interpreter too.

    ``LANE=True``: ``NUM_CHUNKS`` is the chunk count nearest ``TARGET_PROGRAMS / rows`` (at
    least one), ``CHUNK`` the vocabulary split evenly and rounded up to 64 columns (16-byte
    aligned chunk starts), ``BLOCK_V`` at most the configured width; no step cap (a lane step is
    element-wise, so long chunks cost no extra reductions).
    """
    config = _SIZE_OVERRIDE
    if config is None:
        config = next(c for bound, c in _DEFAULT_BY_ROWS if rows <= bound)
    lane, max_block_v, programs, num_warps = config
    block_r = triton.next_power_of_2(max(k1, 1))
    if lane:
        want_chunks = max(1, round(programs / max(rows, 1)))
        chunk = triton.cdiv(triton.cdiv(vocab, want_chunks), 64) * 64
        num_chunks = -(-vocab // chunk)
        block_v = max(16, min(max_block_v, triton.next_power_of_2(chunk)))
    else:
        block_v = max(16, min(max_block_v, triton.next_power_of_2(max(-(-vocab // 2), 1))))
        tiles = -(-vocab // block_v)
        want_chunks = max(1, -(-programs // max(rows, 1)))
        steps = max(1, min(_MAX_STEPS, round(tiles / want_chunks)))
        chunk = block_v * steps
        num_chunks = -(-vocab // chunk)
    block_c = max(2, triton.next_power_of_2(num_chunks))
    return block_v, chunk, num_chunks, block_r, block_c, num_warps, lane


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
_SIZES: dict[tuple[int, int, int], tuple[int, int, int, int, int, int, bool]] = {}
_PLANS: dict[tuple, tuple] = {}
"""Direct-launch plans of :func:`strict_accept`: ``(G, K+1, V, dtype, has_verify, device)`` ->
``(grid, num_warps, fixed trailing args, run, function, packed)``. Recorded after a launch whose
three caller pointers were 16-byte aligned (outputs from the caching allocator always are), and
used only for such pointers; everything else the compiled specialization depends on (scratch,
sizes, constexprs) is fixed by the key."""
_T = torch.Tensor
_I64 = torch.int64


def _fast_ok(table, ndim: int, dtypes, drafts, verify_len) -> bool:
    """The common case checked with plain attribute comparisons; on ``False`` the caller runs
    the full validation, which raises with a precise message (or accepts an unusual but valid
    input)."""
    if type(table) is not _T or type(drafts) is not _T:
        return False
    ts, ds = table.shape, drafts.shape
    if (len(ts) != ndim or len(ds) != 2 or ts[0] != ds[0] or ts[1] != ds[1] + 1
            or table.dtype not in dtypes or drafts.dtype is not _I64
            or not table.is_contiguous() or not drafts.is_contiguous()):
        return False
    cuda = table.is_cuda
    if cuda:
        dev = table.get_device()
        if not drafts.is_cuda or drafts.get_device() != dev:
            return False
    elif table.device != drafts.device:
        return False
    if verify_len is None:
        return True
    return (type(verify_len) is _T and verify_len.dim() == 1 and verify_len.dtype is _I64
            and verify_len.shape[0] == ds[0] and verify_len.is_contiguous()
            and (verify_len.get_device() == dev and verify_len.is_cuda if cuda
                 else verify_len.device == table.device))


def _plan_strict(logits, drafts, v, accepted, num_accepted, has_verify: bool) -> None:
    """The general launch (``FastLaunch``): sizes, scratch, and a plan for the next calls."""
    g, k1, vocab = logits.shape
    rows = g * k1
    sizes = _SIZES.get((rows, k1, vocab))
    if sizes is None:
        sizes = _SIZES[(rows, k1, vocab)] = _strict_accept_launch_sizes(rows, k1, vocab)
    block_v, chunk, num_chunks, block_r, block_c, num_warps, lane = sizes
    scratch = _Scratch.get(logits.device, g, rows, num_chunks)
    tail = (scratch.part_val, scratch.part_idx, scratch.counter, k1 - 1, vocab, chunk,
            num_chunks, has_verify, block_v, block_r, block_c, lane)
    args = (logits, drafts, v, accepted, num_accepted, *tail)
    grid = rows * num_chunks
    _LAUNCH((grid,), args, num_warps=num_warps)
    if logits.is_cuda and not (logits.data_ptr() | drafts.data_ptr() | v.data_ptr()) & 15:
        dev = logits.get_device()
        hit = _LAUNCH.handle(dev, args, num_warps)
        if hit is not None:
            _PLANS[(g, k1, vocab, logits.dtype, has_verify, dev)] = (grid, tail, *hit)


def strict_accept(
    logits: torch.Tensor, drafts: torch.Tensor, verify_len: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused :func:`strict_accept_reference` in one launch; bit-identical outputs.

    ``logits: [G, K+1, V]`` contiguous fp32/bf16/fp16, ``drafts: [G, K] int64``,
    ``verify_len: [G] int64 | None``. The ``G * (K+1) * NUM_CHUNKS`` programs each reduce one
    chunk of one row; the last one of each request finishes it (no second launch). Launches
    that share a shape must not run concurrently on two streams (they share a device scratch).
    Every call returns freshly allocated outputs.
    """
    if not _fast_ok(logits, 3, _LOGIT_DTYPES, drafts, verify_len):
        _check_acceptance_inputs("logits", logits, ("G", "K1", "V"), _LOGIT_DTYPES, drafts,
                                 verify_len)
    g, k1, vocab = logits.shape
    accepted = logits.new_empty((g, k1), dtype=_I64)
    num_accepted = logits.new_empty((g,), dtype=_I64)
    if g == 0:
        return accepted, num_accepted
    if vocab == 0:
        raise ShapeError("logits must have a vocabulary of at least one column (V >= 1)")
    has_verify = verify_len is not None
    v = verify_len if has_verify else drafts
    if logits.is_cuda:
        dev = logits.get_device()
        plan = _PLANS.get((g, k1, vocab, logits.dtype, has_verify, dev))
        if (plan is not None and not (logits.data_ptr() | drafts.data_ptr() | v.data_ptr()) & 15
                and not hooks_installed()):
            grid, tail, run, function, packed = plan
            run(grid, 1, 1, raw_stream(dev), function, packed, None, None, None,
                logits, drafts, v, accepted, num_accepted, *tail)
            return accepted, num_accepted
    _plan_strict(logits, drafts, v, accepted, num_accepted, has_verify)
    return accepted, num_accepted


def strict_accept_tokens(
    target_tokens: torch.Tensor, drafts: torch.Tensor, verify_len: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel form of :func:`strict_accept_tokens_reference`; bit-identical outputs.

    ``target_tokens: [G, K+1] int64``, ``drafts: [G, K] int64``, ``verify_len: [G] int64 | None``.
    """
    if not _fast_ok(target_tokens, 2, (_I64,), drafts, verify_len):
        _check_acceptance_inputs(
            "target_tokens", target_tokens, ("G", "K1"), _I64, drafts, verify_len
        )
    g, k1 = target_tokens.shape
    accepted = target_tokens.new_empty((g, k1), dtype=_I64)
    num_accepted = target_tokens.new_empty((g,), dtype=_I64)
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
