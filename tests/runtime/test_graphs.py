"""CUDA-graph capture of the drafting step (block forward, Markov chain, selection): replays are
bit-identical to eager (GPU), and the static context width the capture uses (CPU)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from draftsmith.contract import DraftBlockPlacement, SamplingKey
from draftsmith.runtime.bind import bind
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.decoder import DraftGraph, copy_grouped
from draftsmith.runtime.targets import ToyTarget


def _config(family: str, selection: dict, cuda_graphs: bool) -> SpecConfig:
    return SpecConfig.from_dict({
        "drafter": {"family": family, "options": {"target_layer_ids": [0, 2]}, "seed": 1},
        "num_draft_tokens": 5, "selection": selection,
        "runtime": {"max_batch": 4, "max_context": 96, "page_size": 16, "kernels": "fused",
                    "cuda_graphs": cuda_graphs},
    })


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["dspark-gqa", "dflash", "dspark-mla"])
@pytest.mark.parametrize("selection", [{"kind": "greedy"},
                                       {"kind": "sample", "temperature": 0.8}])
def test_fifty_replays_bit_identical_to_eager(family, selection):
    target = ToyTarget(max_slots=8, max_len=128, device="cuda")
    dec = bind(target, None, _config(family, selection, cuda_graphs=False))
    g, k = 4, dec.plan.num_draft_tokens
    gen = torch.Generator(device="cpu").manual_seed(0)
    for rid in range(g):
        slot = dec.slots.assign(rid)
        feats = torch.randn(20 + 3 * rid, dec.drafter.capabilities.feature_width, generator=gen)
        pos = torch.arange(feats.shape[0], device="cuda")
        dec.pager.store_prefill(slot, dec.drafter.project_context(feats.cuda(), pos))
    view = dec.buffers.view(g)
    dec.slots.prepare(list(range(g)), view.batch_to_slot)
    accepted = torch.randint(0, 64, (g, k + 1), generator=gen).cuda()
    n = torch.tensor([1, 3, 6, 2], device="cuda")
    placement = dec.pager.place(view.batch_to_slot, accepted, n)
    seeds = torch.arange(g, device="cuda")

    def key(i: int) -> SamplingKey | None:
        if dec.selector.is_greedy:
            return None
        return SamplingKey(seeds=seeds + i, offsets=placement.new_ctx_len + 1 + i)

    graph = DraftGraph(dec, placement, key(0))
    for i in range(50):
        step = DraftGraph.static_placement(placement, dec.plan.max_ctx)
        step.bonus.copy_(torch.randint(0, 64, (g,), generator=gen).cuda())
        want_drafts, want_probs = dec.draft_core(step, key(i))
        got_drafts, got_probs = graph.replay(step, key(i))
        assert torch.equal(got_drafts, want_drafts), i
        if want_probs is not None:
            assert torch.equal(got_probs, want_probs), i


@pytest.mark.gpu
def test_graph_decoder_matches_eager_decoder():
    target = ToyTarget(max_slots=8, max_len=128, device="cuda", mixing=0.3)
    prompts = [[(i * 5 + j) % 60 for j in range(3 + 2 * i)] for i in range(4)]
    eager = bind(target, None, _config("dspark-gqa", {"kind": "greedy"}, cuda_graphs=False))
    graphed = bind(target, eager.drafter, _config("dspark-gqa", {"kind": "greedy"},
                                                  cuda_graphs=True))
    assert graphed.plan.cuda_graphs
    a = eager.generate(prompts, 24)
    b = graphed.generate(prompts, 24)
    assert [r.tokens for r in a] == [r.tokens for r in b]
    want = [target.greedy_generate(p, 24, slot=7) for p in prompts]
    assert [list(r.tokens) for r in b] == want


@pytest.mark.parametrize("family", ["dspark-gqa", "dflash", "dspark-mla"])
def test_static_context_width_matches_dynamic_on_cpu(family):
    """What the graph path changes (a static context width of max_ctx) changes no draft; runs on
    the CPU so the capture's only semantic difference is covered without a GPU."""
    target = ToyTarget(max_slots=8, max_len=128)
    cfg = SpecConfig.from_dict({
        "drafter": {"family": family, "options": {"target_layer_ids": [0, 2]}, "seed": 1},
        "num_draft_tokens": 5, "runtime": {"max_batch": 4, "max_context": 96, "page_size": 16},
    })
    dec = bind(target, None, cfg)
    g, k = 3, 5
    gen = torch.Generator().manual_seed(0)
    for rid in range(g):
        slot = dec.slots.assign(rid)
        feats = torch.randn(10 + 7 * rid, dec.drafter.capabilities.feature_width, generator=gen)
        dec.pager.store_prefill(slot, dec.drafter.project_context(
            feats, torch.arange(feats.shape[0])))
    view = dec.buffers.view(g)
    dec.slots.prepare(list(range(g)), view.batch_to_slot)
    placement = dec.pager.place(view.batch_to_slot, torch.randint(0, 64, (g, k + 1), generator=gen),
                                torch.tensor([1, 4, 6]))
    dynamic, _ = dec.draft_core(placement, None)
    static, _ = dec.draft_core(DraftGraph.static_placement(placement, dec.plan.max_ctx), None)
    assert torch.equal(dynamic, static)


def test_graph_load_copies_every_field_and_the_key():
    """``DraftGraph.load`` (grouped multi-tensor copies) leaves the static inputs equal to the
    step's placement and key, int64 fields and the bool mask alike; CPU, no capture needed."""
    # every tensor field the contract declares, read from the dataclass, not from the runtime
    fields = tuple(f.name for f in dataclasses.fields(DraftBlockPlacement)
                   if "Tensor" in str(f.type))
    first = DraftBlockPlacement.make_dummy(num_requests=3, width=4, num_draft_tokens=3)
    assert {f.name for f in dataclasses.fields(first)} - set(fields) == {
        "rows_start", "page_size", "context_width"}  # the scalars; all else is copied
    nxt = DraftBlockPlacement.make_dummy(num_requests=3, width=4, num_draft_tokens=3)
    for name in fields:  # the next step differs from the first in every tensor field
        value = getattr(nxt, name)
        if value.dtype == torch.bool:
            value.logical_not_()
        else:
            value.add_(1)
    graph = DraftGraph.__new__(DraftGraph)  # load needs no capture: skip __init__ (CUDA only)
    graph.placement = DraftGraph.static_placement(first, 12)
    graph.key = SamplingKey(seeds=torch.zeros(3, dtype=torch.int64),
                            offsets=torch.zeros(3, dtype=torch.int64))
    graph._tensor_fields = fields
    for name in fields:
        assert not torch.equal(getattr(graph.placement, name), getattr(nxt, name)), name
    key = SamplingKey(seeds=torch.tensor([4, 5, 6]), offsets=torch.tensor([7, 8, 9]))
    graph.load(nxt, key)
    for name in fields:
        assert torch.equal(getattr(graph.placement, name), getattr(nxt, name)), name
    assert torch.equal(graph.key.seeds, key.seeds) and torch.equal(graph.key.offsets, key.offsets)
    assert graph.placement.context_width == 12


def test_copy_grouped_mixes_dtypes():
    dst = [torch.zeros(3, dtype=torch.int64), torch.zeros(2, 2, dtype=torch.bool),
           torch.zeros(4, dtype=torch.int64)]
    src = [torch.arange(3), torch.tensor([[True, False], [False, True]]), torch.arange(4) * 7]
    copy_grouped(dst, src)
    assert all(torch.equal(d, s) for d, s in zip(dst, src, strict=True))
