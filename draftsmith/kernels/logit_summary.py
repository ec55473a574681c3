"""What a round reports of each target logit row besides its token: whether the row holds a
NaN, and its top-2 margin (the winning logit and its lead over the runner-up), in one launch.

Owns ``logit_summary``. In torch these were eleven launches a round (``isnan``, ``any`` and a
cast; two max passes with the winner masked and put back, a subtraction, a concatenation),
each costing a captured round launch latency rather than bandwidth. Imports
``draftsmith.contract`` only.

Numerics: exact. The largest and second largest values are found by comparisons, so they are
the same numbers ``torch.topk(row, 2)`` returns (a winning zero may come back with the other
sign), and the margin is their fp32 difference; a row with a NaN reports NaN for both (a NaN
wins selection, as in ``torch.argmax``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels._launch import block_size, or_dummy

_I64 = torch.int64


def logit_summary_reference(
    logits: torch.Tensor, margins: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(nan [rows] int64, top2 [rows, 2] fp32 | None)`` of ``logits: [rows, S]`` float::

        nan[r]  = 1 if any(isnan(logits[r])) else 0
        top2[r] = (first, first - second)     torch.topk(logits[r].float(), 2).values

    (a tie gives margin 0, a NaN leads; ``S = 1`` gives margin ``+inf``). ``top2`` is ``None``
    unless ``margins``. Two max passes, the winner masked between them and put back
    (``logits`` is left as it was), instead of ``topk``'s radix select, which took 0.58 ms of a
    1024-row verify round of SmolLM2's vocabulary on an H200 (``benchmarks/rows.py``).
    """
    nan = torch.isnan(logits).any(-1).to(_I64)
    if not margins:
        return nan, None
    with torch.inference_mode():  # the logits may be inference tensors (written in place)
        x = logits.float()
        first, where = x.max(-1, keepdim=True)
        held = x.gather(-1, where)
        x.scatter_(-1, where, float("-inf"))
        second = x.max(-1, keepdim=True).values
        x.scatter_(-1, where, held)
        return nan, torch.cat((first, first - second), dim=-1)


@triton.jit
def _logit_summary_kernel(logits_ptr, nan_ptr, top2_ptr, S, s_row,
                          MARGINS: tl.constexpr, BLOCK_S: tl.constexpr):
    """Program ``r`` reads row ``r`` once in chunks of ``BLOCK_S``. Each lane keeps the largest
    value it has seen and the second largest counted with multiplicity (two equal values make
    the second equal the first), elementwise, so the loop carries no reduction; one merge of
    the lanes at the end. NaNs are counted apart and replaced by ``-inf`` in the comparisons."""
    r = tl.program_id(0).to(tl.int64)
    row = logits_ptr + r * s_row
    cols = tl.arange(0, BLOCK_S)
    neg = float("-inf")
    first = tl.full((BLOCK_S,), neg, tl.float32)
    second = tl.full((BLOCK_S,), neg, tl.float32)
    nans = tl.zeros((BLOCK_S,), tl.int32)
    for s0 in tl.range(0, S, BLOCK_S, num_stages=2):
        v = tl.load(row + s0 + cols, mask=s0 + cols < S, other=neg).to(tl.float32)
        bad = v != v
        nans += bad.to(tl.int32)
        if MARGINS:
            v = tl.where(bad, neg, v)
            second = tl.maximum(second, tl.minimum(first, v))
            first = tl.maximum(first, v)
    any_nan = tl.sum(nans, axis=0) > 0
    tl.store(nan_ptr + r, any_nan.to(tl.int64))
    if MARGINS:
        top = tl.max(first, axis=0)
        ties = tl.sum((first == top).to(tl.int32), axis=0)
        # one lane holds the top: the runner-up is its own second or another lane's first
        others = tl.max(tl.where(first == top, neg, first), axis=0)
        runner = tl.maximum(tl.max(second, axis=0), tl.where(ties > 1, top, others))
        tl.store(top2_ptr + 2 * r, tl.where(any_nan, float("nan"), top))
        tl.store(top2_ptr + 2 * r + 1, tl.where(any_nan, float("nan"), top - runner))


def _launch_sizes(width: int) -> tuple[int, int]:
    """``(BLOCK_S, num_warps)``: chunks of up to 8192 columns, 16 elements a thread (a row of
    SmolLM2's vocabulary is six chunks)."""
    block = block_size(width, lo=32, hi=8192)
    return block, max(1, min(16, block // 512))


def logit_summary(
    logits: torch.Tensor, margins: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Kernel form of :func:`logit_summary_reference`, one launch: ``logits: [rows, S]`` float
    with a unit stride along ``S``, ``S >= 1``. Equal to the reference with ``torch.equal``
    on rows without NaN; rows with one report NaN in both columns."""
    check_tensor("logits", logits, ("rows", "S"), FLOAT_DTYPES, unit_stride=True)
    rows, width = logits.shape
    if width == 0:
        raise ShapeError("logit_summary needs at least one logit column (S >= 1)")
    nan = torch.empty(rows, dtype=_I64, device=logits.device)
    top2 = torch.empty(rows, 2, dtype=torch.float32, device=logits.device) if margins else None
    if rows:
        block, warps = _launch_sizes(width)
        _logit_summary_kernel[(rows,)](logits, nan, or_dummy(top2, nan), width, logits.stride(0),
                                       MARGINS=margins, BLOCK_S=block, num_warps=warps)
    return nan, top2


__all__ = ["logit_summary", "logit_summary_reference"]
