"""Test helpers for the GQA drafter tests: a tiny paged context pool writer and placement builder.

The runtime's paging component is not used (drafter tests import nothing from runtime); these
helpers place ``project_context`` entries into permuted pages the way a pool would.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from draftsmith.contract import DraftBlockPlacement, PagedContextCache


def permuted_tables(num_requests: int, pages_per_row: int, seed: int = 0) -> torch.Tensor:
    """``[G, P] int64`` page tables that use a random permutation of ``G * P`` pages."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_requests * pages_per_row, generator=g)
    return perm.view(num_requests, pages_per_row).to(torch.int64)


def write_context(
    cache: PagedContextCache, table_row: torch.Tensor, entries: torch.Tensor, start: int = 0
) -> None:
    """Write ``entries: [T, L, planes, heads, width]`` at columns ``start .. start + T - 1`` of the
    request whose page-table row is ``table_row: [P]``."""
    for t in range(entries.shape[0]):
        col = start + t
        page = int(table_row[col // cache.page_size])
        cache.pool[:, page, :, :, col % cache.page_size, :] = entries[t].to(cache.pool.dtype)


def make_placement(
    tables: torch.Tensor,
    num_ctx: Sequence[int],
    width: int,
    page_size: int,
    bonus: Sequence[int] | None = None,
) -> DraftBlockPlacement:
    """A placement whose requests read ``num_ctx[b]`` context columns and query positions
    ``num_ctx[b] .. num_ctx[b] + W - 1`` (one committed token per request, nothing to write)."""
    g = tables.shape[0]
    n = torch.tensor(list(num_ctx), dtype=torch.int64)
    j = torch.arange(width, dtype=torch.int64)
    query = (n[:, None] + j).contiguous()
    k1 = 1
    cols = (n - 1).clamp(min=0)[:, None].expand(g, k1).contiguous()
    rows = torch.arange(g, dtype=torch.int64)
    return DraftBlockPlacement(
        slots=rows.clone(),
        cache_rows=rows.clone(),
        rows_start=None,
        bonus=torch.tensor(list(bonus) if bonus is not None else [0] * g, dtype=torch.int64),
        query_positions=query,
        ctx_positions=cols.clone(),
        write_mask=torch.ones(g, k1, dtype=torch.bool),
        dest_cols=cols.clone(),
        dest_pages=torch.gather(tables, 1, cols // page_size),
        dest_offsets=cols % page_size,
        num_ctx=n.clone(),
        new_ctx_len=n.clone(),
        block_tables=tables.contiguous(),
        page_size=page_size,
    )
