"""CUDA-graph capture of the drafting step (block forward, Markov chain, selection): replays are
bit-identical to eager (GPU), and the static context width the capture uses (CPU)."""

from __future__ import annotations

import pytest
import torch

from draftsmith.contract import SamplingKey
from draftsmith.runtime.bind import bind
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.decoder import DraftGraph
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
