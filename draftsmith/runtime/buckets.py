"""The shapes the runtime captures and pads to: round rows, context widths, prefill widths.

A captured CUDA graph has fixed shapes, so a round runs at the smallest captured row count and
context width that hold it, and a prompt is prefilled at the smallest prefill width that holds
it (padding after the prompt is causal-invisible to it and overwritten before it is read). The
ladders are short, so everything shape-specific is paid once per bucket.
"""

from __future__ import annotations

MIN_CONTEXT_BUCKET = 128
"""Smallest context width a round is captured for; widths double up to the target cache."""

PREFILL_TOKENS = 4096
"""Positions one prefill forward holds (padded rows times columns); longer prompts run in chunks."""

PREFILL_WIDTHS = tuple(sorted({w for p in range(4, 13) for w in (1 << p, 3 << (p - 1))
                               if w <= PREFILL_TOKENS}))
"""Widths a prefill is padded to: 16, 24, 32, 48, ... 3072, 4096 (at most 1.5x padding)."""


def row_buckets(capacity: int) -> tuple[int, ...]:
    """Round sizes captured for ``capacity`` slots: powers of two below it, then itself."""
    out, g = [], 1
    while g < capacity:
        out.append(g)
        g *= 2
    return (*out, capacity)


def width_buckets(length: int) -> tuple[int, ...]:
    """Context widths captured for a target cache of ``length`` positions: doubling from
    :data:`MIN_CONTEXT_BUCKET`, then ``length`` itself."""
    out, w = [], MIN_CONTEXT_BUCKET
    while w < length:
        out.append(w)
        w *= 2
    return (*out, length)


def prefill_width(length: int, room: int) -> int:
    """The smallest of :data:`PREFILL_WIDTHS` that holds ``length`` positions, but no more than
    ``room`` (the cache positions left; at least ``length``)."""
    width = next((w for w in PREFILL_WIDTHS if w >= length), length)
    return max(min(width, room), length)


VERIFY_WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 65)
"""Verify widths ``Q`` (tokens per row, bonus included) a scheduled round pads to; capped at
``K + 1``."""


def verify_widths(num_draft_tokens: int) -> tuple[int, ...]:
    """The verify widths of a scheduled round for ``K = num_draft_tokens``: those of
    :data:`VERIFY_WIDTHS` below ``K + 1``, then ``K + 1``."""
    k1 = num_draft_tokens + 1
    return (*[q for q in VERIFY_WIDTHS if q < k1], k1)


def verify_token_counts(rows: int, num_draft_tokens: int) -> tuple[int, ...]:
    """Token counts ``T`` a packed verify of ``rows`` rows pads to: 1, 2, 3, 4, 6, 8, 12, ...
    (at most 1.5x padding) below ``rows * (K + 1)``, then ``rows * (K + 1)`` itself."""
    top = rows * (num_draft_tokens + 1)
    ladder = sorted({w for p in range(12) for w in (1 << p, 3 << p >> 1) if 1 <= w < top})
    return (*ladder, top)


def bucket(value: int, buckets: tuple[int, ...]) -> int:
    """The smallest of ``buckets`` (ascending) that is at least ``value``."""
    return next(b for b in buckets if b >= value)


__all__ = ["MIN_CONTEXT_BUCKET", "PREFILL_TOKENS", "PREFILL_WIDTHS", "VERIFY_WIDTHS", "bucket",
           "prefill_width", "row_buckets", "verify_token_counts", "verify_widths",
           "width_buckets"]
