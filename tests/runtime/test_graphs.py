"""CUDA-graph capture of whole rounds (drafting, target forward, acceptance, commit): graphed
decoding equals eager decoding token for token (GPU), a round synchronizes with the host once
(GPU), the buckets a capture covers, and the static context width a round uses (CPU)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _toy_target import ToyTarget, host_syncs, syncs_per_step

from draftsmith.runtime.bind import bind
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.decoder import MIN_CONTEXT_BUCKET, row_buckets, width_buckets

PROMPTS = [[(i * 5 + j) % 60 for j in range(3 + 2 * i)] for i in range(6)]


def _config(family: str, selection: dict, cuda_graphs: bool, k: int = 5,
            max_batch: int = 4, kernels: str = "fused", overlap: str = "auto") -> SpecConfig:
    return SpecConfig.from_dict({
        "drafter": {"family": family, "options": {"target_layer_ids": [0, 2]}, "seed": 1},
        "num_draft_tokens": k, "selection": selection,
        "runtime": {"max_batch": max_batch, "max_context": 200, "page_size": 16,
                    "kernels": kernels, "cuda_graphs": cuda_graphs, "overlap": overlap},
    })


def test_buckets():
    assert row_buckets(1) == (1,)
    assert row_buckets(8) == (1, 2, 4, 8)
    assert row_buckets(6) == (1, 2, 4, 6)
    assert width_buckets(MIN_CONTEXT_BUCKET) == (MIN_CONTEXT_BUCKET,)
    assert width_buckets(300) == (128, 256, 300)
    assert width_buckets(1024) == (128, 256, 512, 1024)


def test_rounds_use_the_smallest_buckets_and_padding_rows_stay_padding():
    """Three requests in slots 0..2 of a 4-slot decoder run rounds of 4 rows (the bucket), the
    fourth row a padding row routed to the dummy slot; the context width follows the longest
    request. Eager on the CPU: the same round a graph captures."""
    target = ToyTarget(max_slots=8, max_len=256, mixing=0.3)
    # a CPU target: the torch references (on a GPU host Triton cannot take CPU tensors)
    dec = bind(target, None, _config("dspark-gqa", {"kind": "greedy"}, cuda_graphs=False,
                                     kernels="auto"))
    seen = []
    real = dec.round_core

    def core(g, width):
        seen.append((g, width, dec.buffers.batch_to_slot[:g].tolist()))
        real(g, width)

    dec.round_core = core
    results = dec.generate(PROMPTS[:3], 40)
    assert {g for g, _, _ in seen} == {4}
    assert seen[0][2] == [0, 1, 2, dec.plan.dummy_slot]
    assert {w for _, w, _ in seen} <= set(width_buckets(dec.round.length))
    want = [target.greedy_generate(p, 40, slot=7) for p in PROMPTS[:3]]
    assert [list(r.tokens) for r in results] == want


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["dspark-gqa", "dflash", "dspark-mla"])
@pytest.mark.parametrize("selection", [{"kind": "greedy"},
                                       {"kind": "sample", "temperature": 0.8},
                                       {"kind": "sample", "temperature": 0.8,
                                        "acceptance": "rejection"}])
def test_graphed_rounds_equal_eager_rounds(family, selection):
    """Same draws, same tokens: replayed rounds emit what eager rounds emit, per request and per
    round, with more requests than slots (admission between rounds) and mixed budgets."""
    target = ToyTarget(max_slots=8, max_len=256, device="cuda", mixing=0.3)
    eager = bind(target, None, _config(family, selection, cuda_graphs=False))
    graphed = bind(target, eager.drafter, _config(family, selection, cuda_graphs=True))
    assert graphed.plan.cuda_graphs and not eager.plan.cuda_graphs
    # prompts over three prefill widths (16, 24, 48): admissions replay three captures
    prompts = [*PROMPTS[:4], [7] * 20, [(3 * j) % 60 for j in range(40)]]
    budgets = [30, 17, 41, 9, 25, 33]
    a = eager.generate(prompts, budgets)
    b = graphed.generate(prompts, budgets)
    assert graphed.graphs, "no round was captured"
    assert {16, 24, 48} <= set(graphed.admissions), sorted(graphed.admissions)
    assert [(r.tokens, r.accepted_lengths) for r in a] == [(r.tokens, r.accepted_lengths)
                                                           for r in b]
    if selection["kind"] == "greedy":
        want = [target.greedy_generate(p, n, slot=7) for p, n in zip(prompts, budgets,
                                                                       strict=True)]
        assert [list(r.tokens) for r in b] == want


@pytest.mark.gpu
@pytest.mark.parametrize("k", [0, 5])
def test_a_graphed_round_synchronizes_with_the_host_once(k):
    """torch's sync debug mode reports every synchronizing call; a replayed round (plain
    decoding at K = 0, speculation at K = 5) makes exactly one: the read of its counts and
    tokens; an admission forward (one prompt replayed, or a group) one. The negative control adds a ``.item()`` and
    sees two."""
    target = ToyTarget(max_slots=8, max_len=256, device="cuda", mixing=0.3)
    # committing each round before the next (runtime.overlap off), so that a step's reads are
    # its own; test_overlap.py checks the overlapped loop
    dec = bind(target, None, _config("dspark-gqa", {"kind": "greedy"}, cuda_graphs=True, k=k,
                                     overlap="off"))
    dec.generate(PROMPTS[:3], 20)  # captures
    admissions: list[int] = []
    real_admit = dec._admit_rows

    def admit(reqs, width):
        result, syncs = host_syncs(real_admit, reqs, width)
        admissions.append(syncs)
        return result

    dec._admit_rows = admit
    counts = syncs_per_step(dec, PROMPTS[:3], 20)
    assert len(counts) > 3 and set(counts) == {1}, counts
    assert dec.admissions and set(admissions) == {1}, admissions  # one read per forward
    counts = syncs_per_step(dec, PROMPTS[:3], 20, extra=True)
    assert len(counts) > 3 and set(counts) == {2}, counts


@pytest.mark.parametrize("family", ["dspark-gqa", "dflash", "dspark-mla"])
def test_static_context_width_matches_dynamic_on_cpu(family):
    """A round's drafter reads a static context width (its bucket); the drafts equal those of a
    placement whose width is read from the lengths."""
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
    rows = torch.arange(g)
    placement = dec.pager.place(rows, torch.randint(0, 64, (g, k + 1), generator=gen),
                                torch.tensor([1, 4, 6]))
    dynamic, _, _ = dec.round.draft(placement, None)
    static, _, _ = dec.round.draft(dataclasses.replace(placement, context_width=dec.plan.max_ctx),
                                   None)
    assert torch.equal(dynamic, static)


@pytest.mark.gpu
@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
@pytest.mark.parametrize("k", [0, 4])
def test_graphed_rounds_with_a_hugging_face_target(architecture, k):
    """The static-cache HF target inside captured rounds: fp32 greedy output equals
    transformers' own greedy ``generate`` for every prompt, at several batch sizes."""
    from _tiny_models import make_tiny_causal_lm

    from draftsmith.runtime.targets.hf import HFTarget

    model = make_tiny_causal_lm(architecture=architecture, seed=5).cuda()
    target = HFTarget(model, max_slots=8)
    cfg = SpecConfig.from_dict({
        "drafter": {"family": "dspark-gqa", "options": {"target_layer_ids": [1, 3]}, "seed": 1},
        "num_draft_tokens": k,
        "runtime": {"max_batch": 4, "max_context": 256, "cuda_graphs": "on"},
    })
    dec = bind(target, None, cfg)
    assert dec.plan.cuda_graphs
    prompts = [[(i * 37 + j * 11 + 3) % 500 for j in range(4 + 5 * i)] for i in range(6)]
    want = []
    for p in prompts:
        out = model.generate(torch.tensor([p], device="cuda"), max_new_tokens=30,
                             do_sample=False, pad_token_id=0, eos_token_id=None)
        want.append(out[0, len(p):].tolist())
    got = dec.generate(prompts, 30)
    assert dec.graphs
    assert [list(r.tokens) for r in got] == want
