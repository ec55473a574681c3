"""Launch plumbing every kernel file shares: power-of-two block sizes, warps by block size, the
dummy pointer of an absent optional tensor, inputs flattened to rows, and programmatic dependent
launch.

Each kernel's own tuning (which clamps, which thresholds) stays in its file's named size
helper; this module only spells the arithmetic those helpers repeat. Imports triton and torch
only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


def block_size(n: int, lo: int = 0, hi: int | None = None) -> int:
    """The power of two at or above ``n`` (``triton.next_power_of_2``), raised to ``lo`` and
    then capped at ``hi``: ``min(hi, max(lo, next_power_of_2(n)))``.

    ``n = 0`` gives ``0`` (triton's value) unless ``lo`` lifts it: pass ``lo=1`` where a size
    may be zero and the kernel still needs a block (``next_power_of_2(max(n, 1))``).
    """
    size = max(lo, triton.next_power_of_2(n))
    return size if hi is None else min(hi, size)


def warps_for(elems: int, doubling_at: Sequence[int], fewest: int = 1) -> int:
    """Warps of one program over ``elems`` elements: ``fewest``, doubled at each threshold of
    ``doubling_at`` that ``elems`` reaches (:data:`ROW_WARPS` from 1: 1 warp below 512, 2 from
    512, 4 from 2048)."""
    return fewest * 2 ** sum(elems >= at for at in doubling_at)


ROW_WARPS = (512, 2048)
"""``warps_for`` thresholds of the one-row-per-program norm and RoPE kernels (from 1 warp)."""


def or_dummy(tensor: torch.Tensor | None, dummy: torch.Tensor) -> torch.Tensor:
    """``tensor``, or ``dummy`` in its place when absent: a kernel's pointer argument must be a
    tensor even where a constexpr flag (``HAS_BIAS``, ``RESIDUAL``...) keeps it from being read."""
    return dummy if tensor is None else tensor


def row_stride(tensor: torch.Tensor | None) -> int:
    """``tensor.stride(0)``, or 0 for an absent optional tensor (never read then)."""
    return 0 if tensor is None else tensor.stride(0)


def unit_rows(x: torch.Tensor, width: int) -> torch.Tensor:
    """``x: [..., width]`` as ``[rows, width]`` with a unit column stride (a view when ``x``
    already has one, else a contiguous copy)."""
    rows = x.reshape(-1, width)
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def pdl_kwargs(on: bool) -> dict[str, Any]:
    """The launch option of a kernel launched with PDL (:func:`~draftsmith.kernels.pdl_on`), else none."""
    return {"launch_pdl": True} if on else {}


@triton.jit
def pdl_start(PDL: tl.constexpr, RELEASE: tl.constexpr):
    """Under ``PDL``: with ``RELEASE``, let the next kernel's programs start now (a small
    kernel, so they can prefetch their weights while it runs); then wait until every earlier
    kernel has finished and its writes are visible. Every program must call it before its
    first read of another kernel's output and before any write."""
    if PDL:
        if RELEASE:
            gdc_launch_dependents()
        gdc_wait()


@triton.jit
def pdl_release(PDL: tl.constexpr):
    """Under ``PDL``: let the next kernel's programs start (its programs then wait for this
    kernel to finish before reading anything it writes)."""
    if PDL:
        gdc_launch_dependents()
