"""Order-T argmax building blocks shared by the Triton kernels of this package.

Order T is the total order of ``torch.argmax``: a NaN beats every non-NaN value (lowest index
among NaNs), otherwise the larger value wins with ``-0.0 == +0.0``, and ties go to the lowest
index. These helpers reduce one tile along its last axis and merge a running best with the
result of a later (higher-index) tile. Imports nothing of draftsmith.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tile_argmax_t(x, cols, valid):
    """Order-T (value, index) of each row of ``x: [R, C] fp32`` along axis 1.

    ``cols: [C]`` (or ``[R, C]``) are the global column indices of the tile and ``valid`` masks the
    columns that exist; invalid entries never win. A row without a valid column returns
    ``(-inf, 2**62)`` so that any real candidate replaces it.
    """
    is_nan = (x != x) & valid
    any_nan = tl.max(is_nan.to(tl.int32), axis=1) > 0
    finite_or_inf = tl.where(valid & (x == x), x, float("-inf"))
    best = tl.max(finite_or_inf, axis=1)
    hit = tl.where(any_nan[:, None], is_nan, valid & (finite_or_inf == best[:, None]))
    # column ids fit int32 (V < 2**24: ids travel as exact fp32 values); reduce in int32 to halve
    # register pressure
    big = tl.full(hit.shape, 2**31 - 1, tl.int32)
    idx32 = tl.min(tl.where(hit, cols.to(tl.int32), big), axis=1)
    idx = tl.where(idx32 == 2**31 - 1, 2**62, idx32.to(tl.int64))
    val = tl.where(any_nan, float("nan"), best)
    return val, idx


@triton.jit
def merge_argmax_t(best_val, best_idx, new_val, new_idx):
    """Merge a running order-T best with the best of a tile of strictly higher indices.

    The later candidate replaces the running one only when it is strictly larger, or when it is
    a NaN and the running one is not (or when the running one is the empty sentinel); the
    first-seen candidate keeps every tie.
    """
    best_nan = best_val != best_val
    new_nan = new_val != new_val
    empty = best_idx == 2**62
    take = empty | (new_nan & ~best_nan) | (~best_nan & ~new_nan & (new_val > best_val))
    return tl.where(take, new_val, best_val), tl.where(take, new_idx, best_idx)
