"""Section 7: buffers allocated once at bind; bucket views share storage; the dummy row is fixed."""

from __future__ import annotations

import torch

from draftsmith.runtime.bind import bind
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.targets import ToyTarget


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
    # a prepare through a small bucket writes the shared buffers
    dec.slots.assign(0)
    dec.slots.prepare([0, None], views[2].batch_to_slot)
    assert bufs.batch_to_slot[:2].tolist() == [0, 6]
    assert views[4].batch_to_slot[:2].tolist() == [0, 6]


def test_padding_rows_write_only_the_dummy_row():
    dec = _decoder(max_batch=3)
    bufs = dec.buffers
    assert bufs.draft_probs is not None
    bufs.draft_probs.fill_(7.0)
    b2s = torch.tensor([1, 3, 3])  # one live request in slot 1, two padding rows
    probs = torch.rand(3, 3, 64)
    bufs.draft_probs.index_copy_(0, b2s[:1], probs[:1])
    bufs.draft_probs[b2s[1:]] = probs[1:]
    assert torch.equal(bufs.draft_probs[1], probs[0])
    assert bool((bufs.draft_probs[0] == 7.0).all()) and bool((bufs.draft_probs[2] == 7.0).all())
    # the decoder itself: run a batch smaller than the capacity, then check slot rows
    out = dec.generate([[1, 2, 3]], 4, seeds=[0])
    assert len(out[0].tokens) == 4
    assert bufs.ctx_len[bufs.dummy_slot] == 0
