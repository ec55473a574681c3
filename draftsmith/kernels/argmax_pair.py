"""Per-rank (value, global index) pair of a logits shard, packed for the vocab-parallel exchange.

Owns ``argmax_pair`` (spec 5.2 and the staging row of 5.3), its eager reference, and the
``@triton.jit`` order-T helpers that ``gumbel_pair`` reuses (lane update, lane reduction, the
chunk-combine kernel and the staging-row writer). Imports ``draftsmith.contract`` only.

Layout: one program per ``(row, chunk)`` scans its chunk tile by tile, keeping a running order-T
best per lane; when a row has several chunks, a second tiny kernel merges the per-chunk pairs, so
a handful of rows still spreads over the whole GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor

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
def lane_argmax_t(vals, idxs):
    """Order-T winner over lanes ``vals: [N] fp32`` with distinct ``idxs: [N] int32``.

    Returns ``(value, index)``; the value is the winning lane's own bits (``±0.0`` kept), or
    the canonical NaN ``0x7FFF0000`` when a NaN wins.
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
def write_pair_row(row_ptr, C, slot, idx, val, BLOCK_OUT: tl.constexpr):
    """Write a whole staging row: ``idx`` (fp32) at ``2*slot``, ``val`` at ``2*slot+1``, +0.0
    elsewhere."""
    cols = tl.arange(0, BLOCK_OUT)
    idx_f = idx.to(tl.float32)
    row = tl.where(cols == 2 * slot, idx_f, tl.where(cols == 2 * slot + 1, val, 0.0))
    tl.store(row_ptr + cols, row, mask=cols < C)


@triton.jit
def pair_combine_kernel(
    part_val_ptr, part_idx_ptr, out_ptr, out_row_stride, C, n_chunks, vocab_start, slot,
    BLOCK_C: tl.constexpr, BLOCK_OUT: tl.constexpr,
):
    """Second pass: merge the ``n_chunks`` partial pairs of one row (program = row)."""
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK_C)
    mask = c < n_chunks
    vals = tl.load(part_val_ptr + row * n_chunks + c, mask=mask, other=float("-inf"))
    idxs = tl.load(part_idx_ptr + row * n_chunks + c, mask=mask, other=2147483647)
    val, idx = lane_argmax_t(vals, idxs)
    write_pair_row(out_ptr + row * out_row_stride, C, slot, idx + vocab_start, val, BLOCK_OUT)


@triton.jit
def _argmax_pair_kernel(
    x_ptr, x_row_stride, S,
    part_val_ptr, part_idx_ptr, out_ptr, out_row_stride, C, vocab_start, slot, n_chunks,
    TILES: tl.constexpr, BLOCK: tl.constexpr, SINGLE: tl.constexpr, BLOCK_OUT: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    lanes = tl.arange(0, BLOCK)
    best_val = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.full([BLOCK], 2147483647, tl.int32)
    base = x_ptr + row.to(tl.int64) * x_row_stride
    for t in range(TILES):
        cols = (chunk * TILES + t) * BLOCK + lanes
        valid = cols < S
        x = tl.load(base + cols, mask=valid, other=float("-inf")).to(tl.float32)
        best_val, best_idx = lane_update(best_val, best_idx, x, cols, valid)
    val, idx = lane_argmax_t(best_val, best_idx)
    if SINGLE:
        write_pair_row(out_ptr + row * out_row_stride, C, slot, idx + vocab_start, val, BLOCK_OUT)
    else:
        tl.store(part_val_ptr + row * n_chunks + chunk, val)
        tl.store(part_idx_ptr + row * n_chunks + chunk, idx)


# ---- launch -------------------------------------------------------------------------------


def pair_launch_sizes(rows: int, shard_width: int, device: torch.device) -> tuple[int, int, int]:
    """``(BLOCK, TILES, n_chunks)`` for a per-(row, chunk) pair reduction.

    Aims at about four programs per streaming multiprocessor (four on the CPU interpreter), so a
    few long rows are split into chunks while many rows get one chunk each. A chunk covers
    ``TILES * BLOCK`` columns.
    """
    if device.type == "cuda":
        target = 4 * torch.cuda.get_device_properties(device).multi_processor_count
        max_block = 2048
    else:
        target, max_block = 4, 4096
    block = max(16, min(max_block, triton.next_power_of_2(shard_width)))
    total_tiles = triton.cdiv(shard_width, block)
    chunks_per_row = max(1, min(total_tiles, triton.cdiv(target, max(rows, 1))))
    tiles = triton.cdiv(total_tiles, chunks_per_row)
    return block, tiles, triton.cdiv(total_tiles, tiles)


def run_pair_reduction(kernel, out: torch.Tensor, rows: int, shard_width: int, vocab_start: int,
                       slot: int, args: tuple, constexprs: dict) -> torch.Tensor:
    """Launch ``kernel`` over ``(rows, n_chunks)`` and, when a row has several chunks, the
    combine pass. ``args`` precede the common partial/output arguments in the kernel signature.
    """
    block, tiles, n_chunks = pair_launch_sizes(rows, shard_width, out.device)
    C = out.shape[1]
    block_out = triton.next_power_of_2(C)
    single = n_chunks == 1
    if single:
        part_val = part_idx = out  # unused by the kernel
    else:
        part_val = torch.empty(rows, n_chunks, dtype=torch.float32, device=out.device)
        part_idx = torch.empty(rows, n_chunks, dtype=torch.int32, device=out.device)
    kernel[(rows, n_chunks)](
        *args, part_val, part_idx, out, out.stride(0), C, vocab_start, slot, n_chunks,
        TILES=tiles, BLOCK=block, SINGLE=single, BLOCK_OUT=block_out, **constexprs,
    )
    if not single:
        pair_combine_kernel[(rows,)](
            part_val, part_idx, out, out.stride(0), C, n_chunks, vocab_start, slot,
            BLOCK_C=max(2, triton.next_power_of_2(n_chunks)), BLOCK_OUT=block_out,
        )
    return out


def argmax_pair(
    logits: torch.Tensor, vocab_start: int = 0, out: torch.Tensor | None = None, slot: int = 0
) -> torch.Tensor:
    """Triton form of :func:`argmax_pair_reference` (same arguments, identical bits)."""
    out = _check_args("argmax_pair", logits, vocab_start, out, slot)
    rows, shard_width = logits.shape
    if rows == 0:
        return out
    return run_pair_reduction(
        _argmax_pair_kernel, out, rows, shard_width, vocab_start, slot,
        (logits, logits.stride(0), shard_width), {},
    )


def _check_args(op: str, logits: torch.Tensor, vocab_start: int, out: torch.Tensor | None,
                slot: int) -> torch.Tensor:
    """Validate the common pair arguments; return ``out`` (allocated when ``None``)."""
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
    "lane_argmax_t",
    "lane_update",
    "pair_combine_kernel",
    "pair_launch_sizes",
    "run_pair_reduction",
    "write_pair_row",
]
