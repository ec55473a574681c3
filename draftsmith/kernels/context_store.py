"""Scatter of new context entries (K/V planes or MLA latents) into the paged pool.

Owns ``store_context`` (a generation step: ``K+1`` entries per request, masked entries written
as zeros) and ``store_context_rows`` (any flat run of entries, e.g. a prefill chunk). Every layer
is written by one launch. Imports ``draftsmith.contract`` only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels._launch import block_size, warps_for


def _scatter_rows(pool, entries, dest_pages, dest_offsets, write_mask, skip) -> None:
    values = torch.where(write_mask.view(-1, 1, 1, 1, 1), entries, torch.zeros_like(entries))
    keep = (dest_pages >= 0) & ~skip
    pool[:, dest_pages[keep], :, :, dest_offsets[keep], :] = values[keep]


def store_context_rows_reference(
    pool: torch.Tensor,
    entries: torch.Tensor,
    dest_pages: torch.Tensor,
    dest_offsets: torch.Tensor,
    write_mask: torch.Tensor,
) -> None:
    """Write ``T`` entries into the pool, in place.

    ``pool: [L, pages, planes, heads, P_sz, width]``, ``entries: [T, L, planes, heads, width]``
    (same dtype), ``dest_pages, dest_offsets: [T] int64``, ``write_mask: [T] bool``::

        pool[l, dest_pages[t], :, :, dest_offsets[t], :] = entries[t, l] if write_mask[t] else 0

    for every layer ``l``; rows with ``dest_pages[t] < 0`` (no allocated page) are skipped. Two
    rows with the same destination land in an unspecified order.
    """
    skip = torch.zeros_like(write_mask)
    _scatter_rows(pool, entries, dest_pages, dest_offsets, write_mask, skip)


def store_context_reference(
    pool: torch.Tensor,
    entries: torch.Tensor,
    dest_pages: torch.Tensor,
    dest_offsets: torch.Tensor,
    write_mask: torch.Tensor,
) -> None:
    """Write the ``K+1`` new context entries of ``G`` generation requests, in place.

    ``pool: [L, pages, planes, heads, P_sz, width]``,
    ``entries: [G*(K+1), L, planes, heads, width]`` (row ``b*(K+1) + j``),
    ``dest_pages, dest_offsets: [G, K+1] int64``, ``write_mask: [G, K+1] bool`` (from
    :class:`~draftsmith.contract.DraftBlockPlacement`). As :func:`store_context_rows_reference`,
    with one extra rule: a masked entry whose destination equals that of a valid entry of the same
    request is not written, so the zeros of a clamped masked entry never overwrite a committed
    entry at the context ceiling, and the result does not depend on write order.
    """
    same = (dest_pages[:, :, None] == dest_pages[:, None, :]) & (
        dest_offsets[:, :, None] == dest_offsets[:, None, :]
    )
    shadowed = ~write_mask & (same & write_mask[:, None, :]).any(dim=2)
    _scatter_rows(
        pool, entries, dest_pages.reshape(-1), dest_offsets.reshape(-1),
        write_mask.reshape(-1), shadowed.reshape(-1),
    )


@triton.jit
def _store_context_kernel(
    pool_ptr, entries_ptr, pages_ptr, offsets_ptr, mask_ptr,
    GROUP, LAYERS, PH, HEADS, WIDTH,
    s_layer, s_page, s_plane, s_head, s_off, s_w,
    SHADOW_CHECK: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_PH: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    """Program ``(t, layer)`` copies the ``[planes * heads, width]`` entry of row ``t``."""
    t = tl.program_id(0).to(tl.int64)
    layer = tl.program_id(1).to(tl.int64)
    # the entry is loaded with its page (its address does not depend on it): after the page's
    # test it would be one more round trip to memory in series
    ph = tl.arange(0, BLOCK_PH)
    w = tl.arange(0, BLOCK_W)
    ok = (ph < PH)[:, None] & (w < WIDTH)[None, :]
    src = entries_ptr + ((t * LAYERS + layer) * PH + ph[:, None]) * WIDTH + w[None, :]
    x = tl.load(src, mask=ok, other=0.0)
    page = tl.load(pages_ptr + t)
    offset = tl.load(offsets_ptr + t)
    valid = tl.load(mask_ptr + t) != 0
    write = page >= 0
    if SHADOW_CHECK:
        first = (t // GROUP) * GROUP
        g = tl.arange(0, BLOCK_G)
        in_group = g < GROUP
        other_pages = tl.load(pages_ptr + first + g, mask=in_group, other=-1)
        other_offsets = tl.load(offsets_ptr + first + g, mask=in_group, other=-1)
        other_valid = tl.load(mask_ptr + first + g, mask=in_group, other=0) != 0
        hits = other_valid & (other_pages == page) & (other_offsets == offset)
        shadowed = tl.max(hits.to(tl.int32), axis=0) > 0
        write = write & (valid | ~shadowed)
    if write:
        x = tl.where(valid, x, tl.zeros_like(x))
        plane = (ph // HEADS).to(tl.int64)
        head = (ph % HEADS).to(tl.int64)
        dst = (pool_ptr + layer * s_layer + page * s_page + offset * s_off
               + (plane * s_plane + head * s_head)[:, None] + w.to(tl.int64)[None, :] * s_w)
        tl.store(dst, x, mask=ok)


def _store_launch_sizes(planes_heads: int, width: int) -> tuple[int, int, int]:
    """``(BLOCK_PH, BLOCK_W, num_warps)``: one program copies one layer of one entry."""
    block_ph, block_w = block_size(planes_heads, lo=1), block_size(width, lo=1)
    return block_ph, block_w, warps_for(block_ph * block_w, (1024, 4096), fewest=2)


def _check_store(pool, entries, dest_pages, dest_offsets, write_mask, dest_shape) -> None:
    s: dict[str, int] = {}
    check_tensor("pool", pool, ("L", "pages", "planes", "heads", "P_sz", "width"), FLOAT_DTYPES, s)
    check_tensor("entries", entries, ("T", "L", "planes", "heads", "width"), pool.dtype, s,
                 pool.device, contiguous=True)
    for name, tensor, dtype in (
        ("dest_pages", dest_pages, torch.int64),
        ("dest_offsets", dest_offsets, torch.int64),
        ("write_mask", write_mask, torch.bool),
    ):
        check_tensor(name, tensor, dest_shape, dtype, s, pool.device, contiguous=True)
    if dest_pages.numel() != s["T"]:
        raise ShapeError(f"entries has {s['T']} rows but the destinations "
                         f"{tuple(dest_pages.shape)} name {dest_pages.numel()}")


def _launch_store(pool, entries, dest_pages, dest_offsets, write_mask, group: int) -> None:
    t, num_layers, planes, heads, width = entries.shape
    if t == 0 or num_layers * planes * heads == 0:
        return
    block_ph, block_w, num_warps = _store_launch_sizes(planes * heads, width)
    _store_context_kernel[(t, num_layers)](
        pool, entries, dest_pages, dest_offsets, write_mask.view(torch.int8),
        group, num_layers, planes * heads, heads, width, *pool.stride(),
        SHADOW_CHECK=group > 1, BLOCK_G=block_size(group, lo=1),
        BLOCK_PH=block_ph, BLOCK_W=block_w, num_warps=num_warps,
    )


def store_context(
    pool: torch.Tensor,
    entries: torch.Tensor,
    dest_pages: torch.Tensor,
    dest_offsets: torch.Tensor,
    write_mask: torch.Tensor,
) -> None:
    """Kernel form of :func:`store_context_reference` (every layer in one launch); identical
    pool contents. ``pool`` may be a strided view; the other tensors must be contiguous."""
    _check_store(pool, entries, dest_pages, dest_offsets, write_mask, ("G", "K1"))
    _launch_store(pool, entries, dest_pages, dest_offsets, write_mask, int(dest_pages.shape[1]))


def store_context_rows(
    pool: torch.Tensor,
    entries: torch.Tensor,
    dest_pages: torch.Tensor,
    dest_offsets: torch.Tensor,
    write_mask: torch.Tensor,
) -> None:
    """Kernel form of :func:`store_context_rows_reference` (prefill chunks)."""
    _check_store(pool, entries, dest_pages, dest_offsets, write_mask, ("T",))
    _launch_store(pool, entries, dest_pages, dest_offsets, write_mask, 1)


__all__ = [
    "store_context",
    "store_context_reference",
    "store_context_rows",
    "store_context_rows_reference",
]
