"""Section 7: buffers allocated once at bind; bucket views share storage; the dummy row is fixed."""

from __future__ import annotations

import torch
from _toy_target import ToyTarget

from draftsmith.runtime.bind import bind
from draftsmith.runtime.config import SpecConfig


def _decoder(max_batch=6):
    cfg = SpecConfig.from_dict({
        "drafter": {"family": "dspark-gqa", "options": {"target_layer_ids": [0, 2]}},
        "num_draft_tokens": 3, "selection": {"kind": "sample", "temperature": 1.0},
        "runtime": {"max_batch": max_batch, "max_context": 64, "page_size": 8},
    })
    return bind(ToyTarget(), None, cfg)


def test_bucket_views_share_storage_before_first_prepare():
    dec = _decoder()
    bufs = dec.buffers
    views = {g: bufs.view(g) for g in (1, 2, 4, 6)}  # created before any prepare
    assert bufs.draft_probs is not None
    assert bufs.draft_probs.shape == (7, 3, 64) and bufs.dummy_slot_row == 6
    for g, v in views.items():
        assert v.ctx_len is bufs.ctx_len and v.page_table is bufs.page_table
        assert v.draft_probs is bufs.draft_probs
        assert v.dummy_slot_row == bufs.dummy_slot_row == 6  # never re-derived from the bucket
        for name in ("batch_to_slot", "accepted", "num_accepted", "block_ids"):
            view, base = getattr(v, name), getattr(bufs, name)
            assert view.data_ptr() == base.data_ptr(), name
            assert view.shape[0] == g and view.untyped_storage().data_ptr() == \
                base.untyped_storage().data_ptr()
    # the components hold the same tensors as the buffers
    assert dec.slots.ctx_len is bufs.ctx_len and dec.pager.ctx_len is bufs.ctx_len
    # loading a slot through the base buffers is what every bucket's view sees
    slot = dec.slots.assign(0)
    bufs.load_slots(torch.tensor([slot]), first_tokens=torch.tensor([5]),
                    positions=torch.tensor([9]), seeds=torch.tensor([3]),
                    features=torch.ones(1, bufs.features.shape[-1]))
    assert views[2].batch_to_slot.tolist() == [0, 6]
    assert views[4].target_len[:2].tolist() == [9, 0]
    assert views[1].accepted[0].tolist() == [5, 0, 0, 0] and int(views[1].num_accepted[0]) == 1
    assert bool((views[2].features[0, 0] == 1).all()) and bool((views[2].features[0, 1:] == 0).all())


def test_padding_rows_write_only_the_dummy_row():
    """Spec 7, failure 1: the decoder's padding rows write ``draft_probs`` at the dummy row, never
    at a real slot outside the batch."""
    dec = _decoder(max_batch=3)
    bufs = dec.buffers
    assert bufs.draft_probs is not None and bufs.dummy_slot_row == 3
    bufs.draft_probs.fill_(7.0)
    dummy = bufs.dummy_slot_row
    bufs.batch_to_slot[:3] = torch.tensor([1, dummy, dummy])  # slot 1 live, two padding rows
    b2s = bufs.batch_to_slot[:3]
    probs = torch.rand(3, 3, 64, generator=torch.Generator().manual_seed(0))
    got_probs = dec.round.slot_probs(probs, bufs.view(3))
    assert torch.equal(bufs.draft_probs[1], probs[0])  # the live row, at its slot
    assert torch.equal(got_probs[0], probs[0])
    assert torch.equal(got_probs, bufs.draft_probs[b2s])
    for slot in (0, 2):  # real slots outside the batch keep what they held
        assert bool((bufs.draft_probs[slot] == 7.0).all()), slot
    # the padding rows landed on the dummy row (which of the two wins is unspecified)
    assert any(torch.equal(bufs.draft_probs[dummy], probs[row]) for row in (1, 2))
    # the decoder itself: run a batch smaller than the capacity, then check slot rows
    out = dec.generate([[1, 2, 3]], 4, seeds=[0])
    assert len(out[0].tokens) == 4
    assert bufs.ctx_len[bufs.dummy_slot] == 0
