"""Context-entry scatter into the paged pool: a generation step's entries (masked ones as zeros,
never over a committed entry) and a prefill chunk's."""

from __future__ import annotations

import pytest
import torch

from draftsmith.contract import ShapeError
from draftsmith.kernels.context_store import (
    store_context,
    store_context_reference,
    store_context_rows,
    store_context_rows_reference,
)
from draftsmith.kernels.paging import prepare_placement_reference


def private_page_table(num_slots: int, max_ctx: int, width: int, page_size: int) -> torch.Tensor:
    """The static page table of the private pool (``ceil((max_ctx + W) / P_sz)`` pages per slot),
    as the runtime's buffers build it."""
    pages = -(-(max_ctx + width) // page_size)
    return torch.arange(num_slots * pages, dtype=torch.int64).view(num_slots, pages)


# (L, planes, heads, width): GQA K/V planes and an MLA-like single latent, odd widths
ENTRY_SHAPES = [(3, 2, 3, 5), (2, 1, 1, 37)]
P_SZ, W = 4, 4


def _placement(g: int, k1: int, max_ctx: int, seed: int, device="cpu"):
    """A private-pool step with padding rows on the dummy slot."""
    rng = torch.Generator().manual_seed(seed)
    slots_real = g - 2
    dummy = slots_real
    table = private_page_table(slots_real + 1, max_ctx, W, P_SZ)
    ctx = torch.randint(0, max_ctx - k1, (slots_real + 1,), generator=rng)  # no valid collisions
    slots = torch.cat([torch.randperm(slots_real, generator=rng), torch.tensor([dummy, dummy])])
    accepted = torch.randint(0, 100, (g, k1), generator=rng)
    n = torch.randint(1, k1 + 1, (g,), generator=rng)
    p = prepare_placement_reference(ctx, slots, accepted, n, table, max_ctx, W, P_SZ, dummy)
    return p.to(device), table.to(device), dummy


def _pool_and_entries(shape, pages: int, rows: int, dtype, device, seed: int):
    layers, planes, heads, width = shape
    rng = torch.Generator().manual_seed(seed)
    pool = torch.randn(layers, pages, planes, heads, P_SZ, width, generator=rng)
    entries = torch.randn(rows, layers, planes, heads, width, generator=rng)
    return pool.to(device, dtype), entries.to(device, dtype)


def _non_dummy_pages(pool, table, dummy):
    keep = torch.ones(pool.shape[1], dtype=torch.bool)
    keep[table[dummy].cpu()] = False
    return pool[:, keep.to(pool.device)]


@pytest.mark.parametrize("shape", ENTRY_SHAPES)
def test_store_matches_reference(shape) -> None:
    g, k1 = 9, 5
    p, table, dummy = _placement(g, k1, 30, seed=1)
    pool, entries = _pool_and_entries(shape, table.numel(), g * k1, torch.float32, "cpu", 2)
    entries_before = entries.clone()
    got, want = pool.clone(), pool.clone()
    store_context(got, entries, p.dest_pages, p.dest_offsets, p.write_mask)
    store_context_reference(want, entries, p.dest_pages, p.dest_offsets, p.write_mask)
    # the two padding rows share the dummy's pages in an unspecified order; all else is exact
    assert torch.equal(_non_dummy_pages(got, table, dummy), _non_dummy_pages(want, table, dummy))
    assert torch.equal(entries, entries_before)
    # every written entry holds its value, masked ones zeros
    for b in range(g - 2):
        for j in range(k1):
            page, off = int(p.dest_pages[b, j]), int(p.dest_offsets[b, j])
            want_entry = entries[b * k1 + j] if p.write_mask[b, j] else None
            stored = got[:, page, :, :, off, :]
            if want_entry is not None:
                assert torch.equal(stored, want_entry)
            elif not _shadowed(p, b, j):
                assert torch.equal(stored, torch.zeros_like(stored))


def _shadowed(p, b, j) -> bool:
    same = (p.dest_pages[b] == p.dest_pages[b, j]) & (p.dest_offsets[b] == p.dest_offsets[b, j])
    return bool((same & p.write_mask[b]).any())


def test_dummy_rows_never_touch_real_slots() -> None:
    g, k1 = 9, 5
    p, table, dummy = _placement(g, k1, 30, seed=3)
    pool, entries = _pool_and_entries(ENTRY_SHAPES[0], table.numel(), g * k1, torch.float32,
                                      "cpu", 4)
    only_dummy = p.write_mask.clone()
    real = p.slots != dummy
    pages = torch.where(real[:, None], -1, p.dest_pages)  # drop the real rows' writes
    got = pool.clone()
    store_context(got, entries, pages, p.dest_offsets, only_dummy)
    assert torch.equal(_non_dummy_pages(got, table, dummy), _non_dummy_pages(pool, table, dummy))


def test_ceiling_collision_keeps_the_valid_entry() -> None:
    """At the context ceiling masked entries clamp onto the last committed column; the valid
    entry survives in both implementations, whatever the write order."""
    max_ctx, k1 = 12, 5
    table = private_page_table(2, max_ctx, W, P_SZ)
    ctx = torch.tensor([max_ctx - 2, 0])
    p = prepare_placement_reference(ctx, torch.tensor([0]), torch.zeros(1, k1, dtype=torch.int64),
                                    torch.tensor([2]), table, max_ctx, W, P_SZ, 1)
    assert p.dest_cols[0].tolist() == [10, 11, 11, 11, 11]
    pool, entries = _pool_and_entries(ENTRY_SHAPES[1], table.numel(), k1, torch.float32, "cpu", 5)
    for fn in (store_context, store_context_reference):
        out = pool.clone()
        fn(out, entries, p.dest_pages, p.dest_offsets, p.write_mask)
        page, off = int(p.dest_pages[0, 1]), int(p.dest_offsets[0, 1])
        assert torch.equal(out[:, page, :, :, off, :], entries[1])


def test_negative_pages_are_skipped_and_strided_pool() -> None:
    layers, planes, heads, width = ENTRY_SHAPES[0]
    big = torch.randn(layers, 10, planes, heads, P_SZ, width + 3)
    rng = torch.Generator().manual_seed(6)
    entries = torch.randn(7, layers, planes, heads, width, generator=rng)
    pages = torch.tensor([3, -1, 0, 9, 5, -4, 2])
    offsets = torch.tensor([0, 1, 3, 2, 1, 0, 3])
    mask = torch.tensor([True, True, False, True, True, True, False])
    got, want = big.clone(), big.clone()
    # the pool is a strided view, as a host engine's buffer might be
    store_context_rows(got[..., :width], entries, pages, offsets, mask)
    store_context_rows_reference(want[..., :width], entries, pages, offsets, mask)
    assert torch.equal(got, want)
    assert torch.equal(got[..., width:], big[..., width:])  # padding columns untouched
    untouched = [p for p in range(10) if p not in (3, 0, 9, 5, 2)]
    assert torch.equal(got[:, untouched], big[:, untouched])
    assert torch.equal(got[:, 0, :, :, 3, :width], torch.zeros(layers, planes, heads, width))


def test_prefill_rows_match_reference() -> None:
    """A prefill chunk: entries at consecutive columns of one slot's pages."""
    table = private_page_table(3, 40, W, P_SZ)
    cur, chunk = 6, 13
    cols = torch.arange(cur, cur + chunk)
    pages, offsets = table[1, cols // P_SZ], cols % P_SZ
    pool, entries = _pool_and_entries(ENTRY_SHAPES[1], table.numel(), chunk, torch.float32,
                                      "cpu", 7)
    mask = torch.ones(chunk, dtype=torch.bool)
    got, want = pool.clone(), pool.clone()
    store_context_rows(got, entries, pages, offsets, mask)
    store_context_rows_reference(want, entries, pages, offsets, mask)
    assert torch.equal(got, want)
    flat = got[:, table[1]].permute(0, 1, 4, 2, 3, 5).reshape(2, -1, 1, 1, 37)
    assert torch.equal(flat[:, cur:cur + chunk].transpose(0, 1), entries)


def test_bad_inputs_raise() -> None:
    pool = torch.zeros(2, 4, 1, 1, P_SZ, 8)
    entries = torch.zeros(6, 2, 1, 1, 8)
    pages = torch.zeros(2, 3, dtype=torch.int64)
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ShapeError, match="dtype"):
        store_context(pool, entries.double(), pages, pages, mask)
    with pytest.raises(ShapeError, match="rows"):
        store_context(pool, entries[:5], pages, pages, mask)
    with pytest.raises(ShapeError, match="write_mask"):
        store_context(pool, entries, pages, pages, mask.int())
    with pytest.raises(ShapeError, match="width"):
        store_context(pool, torch.zeros(6, 2, 1, 1, 9), pages, pages, mask)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 2, 8, 128), (5, 1, 1, 576)])
def test_gpu_parity(dtype, shape) -> None:
    g, k1 = 130, 8
    p, table, dummy = _placement(g, k1, 3000, seed=8, device="cuda")
    pool, entries = _pool_and_entries(shape, table.numel(), g * k1, dtype, "cuda", 9)
    got, want = pool.clone(), pool.clone()
    store_context(got, entries, p.dest_pages, p.dest_offsets, p.write_mask)
    store_context_reference(want, entries, p.dest_pages, p.dest_offsets, p.write_mask)
    assert torch.equal(_non_dummy_pages(got, table, dummy), _non_dummy_pages(want, table, dummy))


@pytest.mark.gpu
def test_gpu_graph_replay_equals_eager() -> None:
    g, k1 = 64, 8
    p, table, dummy = _placement(g, k1, 1000, seed=10, device="cuda")
    pool, entries = _pool_and_entries((5, 2, 8, 128), table.numel(), g * k1, torch.bfloat16,
                                      "cuda", 11)
    eager = pool.clone()
    store_context(eager, entries, p.dest_pages, p.dest_offsets, p.write_mask)
    captured = pool.clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        store_context(captured, entries, p.dest_pages, p.dest_offsets, p.write_mask)
    graph.replay()
    assert torch.equal(_non_dummy_pages(captured, table, dummy),
                       _non_dummy_pages(eager, table, dummy))
