"""Per-step placement of a drafter block in the paged context cache.

Owns ``prepare_placement``: from the accepted tokens and counts of a step it advances every
generation request's context length and computes the fixed-shape
:class:`~draftsmith.contract.DraftBlockPlacement` (bonus, query and context positions, write mask,
clamped destination columns, pages and offsets, advertised context length), in one kernel. The
page table is the private pool's: one row per slot, the dummy's included, wide enough for
``max_ctx + W`` columns. Imports ``draftsmith.contract`` only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import DraftBlockPlacement, ShapeError, check_tensor
from draftsmith.contract.checks import check_positive
from draftsmith.kernels._launch import block_size, or_dummy, row_stride

_I64 = torch.int64


def prepare_placement_reference(
    ctx_len: torch.Tensor,
    batch_to_slot: torch.Tensor,
    accepted: torch.Tensor,
    num_accepted: torch.Tensor,
    page_table: torch.Tensor,
    max_ctx: int,
    width: int,
    page_size: int,
    dummy_slot: int,
    block_ids: torch.Tensor | None = None,
) -> DraftBlockPlacement:
    """Advance the context of ``G`` generation requests and place their block.

    Inputs: ``ctx_len: [num_slots] int64`` (updated in place), ``batch_to_slot: [G] int64``
    (generation rows only; padding rows hold ``dummy_slot``; each real slot at most once),
    ``accepted: [G, K+1] int64``, ``num_accepted: [G] int64`` (``n``, ``1..K+1``),
    ``page_table: [num_slots, P] int64`` (slot ``s``'s pages in row ``s``, ``P * P_sz >= max_ctx
    + W``). With ``j`` in ``0..K`` and ``i`` in ``0..W-1``::

        c         = 0 if slot == dummy_slot else ctx_len[slot]          (before the step)
        bonus     = accepted[b, clamp(n - 1, 0, K)]
        new_len   = min(c + n, max_ctx)
        ctx_pos   = c + j;   write_mask = j < n
        dest_col  = clamp(c + j, 0, max_ctx - 1)
        dest_page = page_table[slot, dest_col // P_sz];  dest_offset = dest_col % P_sz
        num_ctx   = new_len
        query_pos = new_len + i
        ctx_len[slot] = new_len for real slots;  ctx_len[dummy_slot] = 0

    ``block_tables = page_table[slots]``; the placement's ``cache_rows`` are the slots and its
    ``rows_start`` is ``None``. ``block_ids: [G, W'] int64 | None`` (the block's token ids, any
    row stride): column 0 receives the bonus (the block's first token), the other columns are
    left as they are.
    """
    g, k1 = accepted.shape
    dev = accepted.device
    slots = batch_to_slot.clone()
    is_dummy = slots == dummy_slot
    c = torch.where(is_dummy, 0, ctx_len[slots])
    n = num_accepted
    j = torch.arange(k1, device=dev, dtype=_I64)
    bonus = accepted.gather(1, (n - 1).clamp(0, k1 - 1)[:, None])[:, 0].clone()
    new_len = torch.clamp(c + n, max=max_ctx)
    ctx_positions = c[:, None] + j
    write_mask = j < n[:, None]
    dest_cols = torch.clamp(ctx_positions, 0, max_ctx - 1)
    dest_pages = page_table[slots[:, None], dest_cols // page_size]
    dest_offsets = dest_cols % page_size
    query_positions = new_len[:, None] + torch.arange(width, device=dev, dtype=_I64)
    real = ~is_dummy
    ctx_len[slots[real]] = new_len[real]
    ctx_len[dummy_slot] = 0
    if block_ids is not None:
        block_ids[:, 0] = bonus
    # every field is computed above from validated-by-construction shapes: skip re-validation
    return DraftBlockPlacement._trusted(
        slots=slots,
        cache_rows=slots.clone(),
        rows_start=None,
        bonus=bonus,
        query_positions=query_positions,
        ctx_positions=ctx_positions,
        write_mask=write_mask,
        dest_cols=dest_cols,
        dest_pages=dest_pages,
        dest_offsets=dest_offsets,
        num_ctx=new_len.clone(),
        new_ctx_len=new_len,
        block_tables=page_table[slots],
        page_size=page_size,
    )


@triton.jit
def _prepare_placement_kernel(
    ctx_len_ptr, slot_ptr, accepted_ptr, num_ptr, table_ptr,
    bonus_ptr, qpos_ptr, cpos_ptr, mask_ptr, cols_ptr, pages_ptr, offs_ptr, num_ctx_ptr,
    new_len_ptr, tables_out_ptr, slots_out_ptr, rows_out_ptr, ids_ptr,
    K1, W, P, max_ctx, page_size, dummy_slot, stride_ids,
    IDS: tl.constexpr, BLOCK_K1: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_P: tl.constexpr,
):
    """One program per generation request. Each real slot belongs to one request, so the read of
    ``ctx_len[slot]`` and its update never race; dummy rows never read ``ctx_len`` and only ever
    store 0 to the dummy's entry. A request's page-table row is its slot's. ``IDS``: the bonus
    also goes to column 0 of the request's row of ``ids_ptr`` (the block's token ids)."""
    b = tl.program_id(0).to(tl.int64)
    # every load before the first store (a load after a store the compiler cannot move above
    # it: one more round trip in series on the round's first launch); a row of more than
    # BLOCK_P pages copies its other pages first
    slot = tl.load(slot_ptr + b)
    is_dummy = slot == dummy_slot
    c = tl.load(ctx_len_ptr + slot, mask=~is_dummy, other=0)
    n = tl.load(num_ptr + b)
    j = tl.arange(0, BLOCK_K1)
    j_ok = j < K1
    bonus_col = tl.minimum(tl.maximum(n - 1, 0), K1 - 1)
    bonus = tl.load(accepted_ptr + b * K1 + bonus_col)
    ctx_pos = c + j
    dest_col = tl.maximum(tl.minimum(ctx_pos, max_ctx - 1), 0)
    page = tl.load(table_ptr + slot * P + dest_col // page_size, mask=j_ok, other=-1)
    p0 = tl.arange(0, BLOCK_P)
    entries = tl.load(table_ptr + slot * P + p0, mask=p0 < P)  # the row's first pages
    for start in range(BLOCK_P, P, BLOCK_P):  # rows of more than BLOCK_P pages
        p = start + p0
        more = tl.load(table_ptr + slot * P + p, mask=p < P)
        tl.store(tables_out_ptr + b * P + p, more, mask=p < P)

    tl.store(slots_out_ptr + b, slot)
    tl.store(rows_out_ptr + b, slot)
    tl.store(bonus_ptr + b, bonus)
    if IDS:
        tl.store(ids_ptr + b * stride_ids, bonus)
    new_len = tl.minimum(c + n, max_ctx)
    write = j < n
    out = b * K1 + j
    tl.store(cpos_ptr + out, ctx_pos, mask=j_ok)
    tl.store(mask_ptr + out, write.to(tl.int8), mask=j_ok)
    tl.store(cols_ptr + out, dest_col, mask=j_ok)
    tl.store(pages_ptr + out, page, mask=j_ok)
    tl.store(offs_ptr + out, dest_col % page_size, mask=j_ok)

    i = tl.arange(0, BLOCK_W)
    tl.store(qpos_ptr + b * W + i, new_len + i, mask=i < W)
    tl.store(num_ctx_ptr + b, new_len)
    tl.store(new_len_ptr + b, new_len)
    tl.store(tables_out_ptr + b * P + p0, entries, mask=p0 < P)
    # Real rows store their new length; every dummy row stores the same 0.
    tl.store(ctx_len_ptr + slot, tl.where(is_dummy, 0, new_len))
    if b == 0:
        tl.store(ctx_len_ptr + dummy_slot, 0)


def _placement_launch_sizes(k1: int, width: int, pages: int) -> tuple[int, int, int]:
    """``(BLOCK_K1, BLOCK_W, BLOCK_P)`` of the one-program-per-request kernel."""
    return block_size(k1, lo=1), block_size(width, lo=1), block_size(pages, lo=16, hi=256)


def _check_placement_inputs(
    ctx_len, batch_to_slot, accepted, num_accepted, page_table, max_ctx, width, page_size,
    dummy_slot, block_ids,
) -> None:
    s: dict[str, int] = {}
    dev = ctx_len.device if isinstance(ctx_len, torch.Tensor) else None
    check_tensor("ctx_len", ctx_len, ("num_slots",), _I64, s, contiguous=True)
    check_tensor("batch_to_slot", batch_to_slot, ("G",), _I64, s, dev, contiguous=True)
    check_tensor("accepted", accepted, ("G", "K1"), _I64, s, dev, contiguous=True)
    check_tensor("num_accepted", num_accepted, ("G",), _I64, s, dev, contiguous=True)
    # one row per slot: the kernel reads slot s's pages from row s
    check_tensor("page_table", page_table, ("num_slots", "P"), _I64, s, dev, contiguous=True)
    for name, value in (("max_ctx", max_ctx), ("width", width), ("page_size", page_size)):
        check_positive(name, value)
    if s["K1"] < 1:
        raise ShapeError("accepted needs at least one column per request (the bonus token)")
    if type(dummy_slot) is not int or not 0 <= dummy_slot < s["num_slots"]:
        raise ShapeError(f"dummy_slot {dummy_slot!r} must be an int indexing ctx_len of "
                         f"{s['num_slots']} slots")
    if block_ids is not None:
        check_tensor("block_ids", block_ids, ("G", None), _I64, s, dev, distinct_rows=True)
        if block_ids.shape[1] < 1:
            raise ShapeError("block_ids needs a column 0 for the bonus")


def prepare_placement(
    ctx_len: torch.Tensor,
    batch_to_slot: torch.Tensor,
    accepted: torch.Tensor,
    num_accepted: torch.Tensor,
    page_table: torch.Tensor,
    max_ctx: int,
    width: int,
    page_size: int,
    dummy_slot: int,
    block_ids: torch.Tensor | None = None,
) -> DraftBlockPlacement:
    """Fused :func:`prepare_placement_reference` (one kernel, including the copies of
    ``batch_to_slot`` into ``slots`` and ``cache_rows`` and of the bonus into ``block_ids``);
    bit-identical results and the same in-place updates of ``ctx_len`` and ``block_ids``. The
    integer outputs are views of one int64 allocation."""
    _check_placement_inputs(ctx_len, batch_to_slot, accepted, num_accepted, page_table,
                            max_ctx, width, page_size, dummy_slot, block_ids)
    p = page_table.shape[1]
    if p * page_size < max_ctx + width:
        raise ShapeError(
            f"private page table rows hold {p} pages of {page_size} = "
            f"{p * page_size} columns, fewer than max_ctx + width = {max_ctx + width}; "
            "size it with ceil((max_ctx + width) / page_size) pages per slot"
        )
    g, k1 = accepted.shape
    dev = ctx_len.device
    gk = g * k1
    buf = torch.empty((g * (5 + width + p) + 4 * gk,), dtype=_I64, device=dev)
    slots, rows, bonus, num_ctx, new_len, qpos, cpos, cols, pages, offs, tables = (
        buf.split_with_sizes((g, g, g, g, g, g * width, gk, gk, gk, gk, g * p))
    )
    mask = torch.empty((g, k1), dtype=torch.bool, device=dev)
    if g == 0:
        ctx_len[dummy_slot] = 0
    else:
        block_k1, block_w, block_p = _placement_launch_sizes(k1, width, p)
        _prepare_placement_kernel[(g,)](
            ctx_len, batch_to_slot, accepted, num_accepted, page_table,
            bonus, qpos, cpos, mask.view(torch.int8), cols, pages, offs, num_ctx, new_len,
            tables, slots, rows, or_dummy(block_ids, bonus), k1, width, p, max_ctx, page_size,
            dummy_slot, row_stride(block_ids), IDS=block_ids is not None,
            BLOCK_K1=block_k1, BLOCK_W=block_w, BLOCK_P=block_p,
        )
    return DraftBlockPlacement._trusted(
        slots=slots,
        cache_rows=rows,
        rows_start=None,
        bonus=bonus,
        query_positions=qpos.view(g, width),
        ctx_positions=cpos.view(g, k1),
        write_mask=mask,
        dest_cols=cols.view(g, k1),
        dest_pages=pages.view(g, k1),
        dest_offsets=offs.view(g, k1),
        num_ctx=num_ctx,
        new_ctx_len=new_len,
        block_tables=tables.view(g, p),
        page_size=page_size,
    )


__all__ = [
    "prepare_placement",
    "prepare_placement_reference",
]
