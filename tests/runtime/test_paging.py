"""Paging component: 20 carried steps against a plain-Python model of the per-step context advance,
slots, prefill."""

from __future__ import annotations

import random

import pytest
import torch

from draftsmith.contract import ContextCacheKind, ContextEntrySpec, DraftsmithError
from draftsmith.runtime.buffers import DecoderBuffers, pages_per_slot
from draftsmith.runtime.paging import ContextPager, SlotManager

ENTRY = ContextEntrySpec(kind=ContextCacheKind.PAGED_GQA_KV, num_layers=2, planes=2, heads=1,
                         width=3)


def _setup(mode: str, capacity=5, k=3, w=4, max_ctx=40, page=8):
    bufs = DecoderBuffers.allocate(
        slot_capacity=capacity, num_draft_tokens=k, block_width=w, vocab_size=16,
        max_ctx=max_ctx, page_size=page, pages_per_slot=pages_per_slot(max_ctx, w, page),
        entry=ENTRY, pool_dtype=torch.float32, with_draft_probs=False)
    return bufs, SlotManager(capacity, bufs.ctx_len), ContextPager(
        bufs, max_ctx=max_ctx, block_width=w, mode=mode)


def _entry_value(step: int, slot: int, j: int) -> float:
    return float(step * 1000 + slot * 10 + j)


@pytest.mark.parametrize(("mode", "steps"), [("eager", 20), ("fused", 4)])
def test_twenty_carried_steps_match_python_model(mode, steps):
    """20 steps of the eager path; the fused kernels (interpreted on CPU) run the first 4."""
    k, w, max_ctx, page, capacity = 3, 4, 40, 8, 5
    bufs, slots, pager = _setup(mode, capacity, k, w, max_ctx, page)
    rng = random.Random(7)
    dummy = capacity
    model_len: dict[int, int] = {}
    # (slot, col) -> values the committed entry may hold: one value, or several where valid
    # entries clamped onto the last column collide (their write order is unspecified; the
    # column lies past the advertised length, so it is never read)
    model_cols: dict[tuple[int, int], set[float]] = {}
    live: list[int] = []
    next_id = 0
    for step in range(steps):
        # churn: finish some requests, admit new ones (their slots restart at 0)
        for rid in list(live):
            if rng.random() < 0.15:
                live.remove(rid)
                s = slots.release(rid)
                model_len.pop(s)
                model_cols = {key: v for key, v in model_cols.items() if key[0] != s}
        while slots.num_free and rng.random() < 0.7:
            s = slots.assign(next_id)
            live.append(next_id)
            model_len[s] = 0
            next_id += 1
        rows: list[int | None] = list(live) + [None] * rng.randint(0, capacity - len(live))
        rng.shuffle(rows)
        g = len(rows)
        b2s = bufs.batch_to_slot[:g]
        b2s.copy_(torch.tensor([slots.slot(r) for r in rows]))
        n = torch.tensor([rng.randint(1, k + 1) for _ in rows])
        accepted = torch.randint(0, 16, (g, k + 1), generator=torch.Generator().manual_seed(step))
        placement = pager.place(b2s, accepted, n)
        entries = torch.zeros(g * (k + 1), 2, 2, 1, 3)
        for b in range(g):
            for j in range(k + 1):
                entries[b * (k + 1) + j] = _entry_value(step, int(b2s[b]), j)
        pager.store(placement, entries)

        for b, rid in enumerate(rows):
            slot = dummy if rid is None else slots.slot(rid)
            assert int(placement.slots[b]) == slot
            c = 0 if rid is None else model_len[slot]
            nb = int(n[b])
            new_len = min(c + nb, max_ctx)
            assert int(placement.bonus[b]) == int(accepted[b, nb - 1])
            assert int(placement.new_ctx_len[b]) == new_len == int(placement.num_ctx[b])
            assert placement.query_positions[b].tolist() == [new_len + i for i in range(w)]
            assert placement.ctx_positions[b].tolist() == [c + j for j in range(k + 1)]
            assert placement.write_mask[b].tolist() == [j < nb for j in range(k + 1)]
            cols = [min(c + j, max_ctx - 1) for j in range(k + 1)]
            assert placement.dest_cols[b].tolist() == cols
            table = bufs.page_table[slot]
            assert placement.dest_pages[b].tolist() == [int(table[x // page]) for x in cols]
            assert placement.dest_offsets[b].tolist() == [x % page for x in cols]
            assert torch.equal(placement.block_tables[b], table)
            if rid is not None:
                clamped = {min(c + j, max_ctx - 1) for j in range(nb)}
                for col in clamped:
                    model_cols[(slot, col)] = {_entry_value(step, slot, j) for j in range(nb)
                                               if min(c + j, max_ctx - 1) == col}
                model_len[slot] = new_len
        assert int(bufs.ctx_len[dummy]) == 0
        for slot, length in model_len.items():
            assert int(bufs.ctx_len[slot]) == length
        # every committed column holds exactly what the model says
        pool = bufs.cache.pool
        for (slot, col), values in model_cols.items():
            if col < model_len[slot]:
                page_id = int(bufs.page_table[slot, col // page])
                got = pool[:, page_id, :, :, col % page]
                assert torch.all(got == got.flatten()[0]), (step, slot, col)
                assert float(got.flatten()[0]) in values, (step, slot, col)


def test_slot_manager_dummy_and_reuse():
    bufs, slots, _ = _setup("eager", capacity=3)
    a, b, c = slots.assign(10), slots.assign(11), slots.assign(12)
    assert (a, b, c) == (0, 1, 2) and slots.dummy_slot == 3  # lowest first
    with pytest.raises(DraftsmithError, match="all 3 slots are taken"):
        slots.assign(13)
    assert slots.slot(99) == slots.slot(None) == 3  # padding and unknown ids go to the dummy
    bufs.ctx_len[a] = 7
    bufs.ctx_len[b] = 5
    slots.release(11)
    assert int(bufs.ctx_len[b]) == 0 and int(bufs.ctx_len[a]) == 7  # freed slot zeroed at once
    slots.release(10)
    assert slots.assign(14) == a and int(bufs.ctx_len[a]) == 0  # the lowest free slot again
    assert slots.assign(15) == b


@pytest.mark.parametrize("mode", ["eager", "fused"])
def test_prefill_store_writes_positions_and_length(mode):
    bufs, slots, pager = _setup(mode, capacity=2, page=4)
    s = slots.assign(0)
    entries = torch.arange(6, dtype=torch.float32).view(6, 1, 1, 1, 1).expand(6, 2, 2, 1, 3)
    pager.store_prefill(s, entries.contiguous())
    assert int(bufs.ctx_len[s]) == 6
    for col in range(6):
        page_id = int(bufs.page_table[s, col // 4])
        assert torch.all(bufs.cache.pool[:, page_id, :, :, col % 4] == col)
    with pytest.raises(DraftsmithError, match="exceeds the drafter context limit"):
        pager.store_prefill(s, torch.zeros(41, 2, 2, 1, 3))


def test_private_page_table_example():
    """Spec 4.2: max_ctx 64, W 8, P_sz 32, 2 slots plus the dummy."""
    bufs = DecoderBuffers.allocate(
        slot_capacity=2, num_draft_tokens=7, block_width=8, vocab_size=16, max_ctx=64,
        page_size=32, pages_per_slot=pages_per_slot(64, 8, 32), entry=ENTRY,
        pool_dtype=torch.float32, with_draft_probs=False)
    assert bufs.page_table.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert bufs.cache.num_pages == 9
