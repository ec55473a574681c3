"""Acceptance component: strict (uniform and ragged), forced capped by verify_len, rejection."""

from __future__ import annotations

import pytest
import torch

from draftsmith.contract import LogitsShard, SamplingKey, ShapeError, SingleRank
from draftsmith.runtime.acceptance import Acceptance
from draftsmith.selection.configs import SampleConfig
from draftsmith.selection.strategies import GreedySelector, SampleSelector


def _acceptance(selector=None, rule="strict", forced=0.0, k=4, fused=False) -> Acceptance:
    return Acceptance(rule=rule, force_accepted=forced, num_draft_tokens=k,
                      selector=selector or GreedySelector(), collectives=SingleRank(), fused=fused)


def _torch_strict(logits: torch.Tensor, drafts: torch.Tensor, verify_len=None):
    g, k = drafts.shape
    t = logits.view(g, k + 1, -1).argmax(-1)
    n = []
    for b in range(g):
        a = 0
        limit = k if verify_len is None else int(verify_len[b])
        while a < limit and int(drafts[b, a]) == int(t[b, a]):
            a += 1
        n.append(a + 1)
    return t, torch.tensor(n)


@pytest.mark.parametrize("fused", [False, True])
def test_strict_uniform_and_ragged(fused):
    gen = torch.Generator().manual_seed(0)
    g, k, v = 6, 4, 11
    logits = torch.randn(g * (k + 1), v, generator=gen)
    t = logits.view(g, k + 1, v).argmax(-1)
    drafts = t[:, :k].clone()
    drafts[1, 0] = (drafts[1, 0] + 1) % v  # reject at 0
    drafts[2, 2] = (drafts[2, 2] + 1) % v  # reject at 2
    acc = _acceptance(k=k, fused=fused)
    accepted, n = acc.accept(LogitsShard.full(logits), drafts, None)
    want_t, want_n = _torch_strict(logits, drafts)
    assert torch.equal(accepted, want_t) and torch.equal(n, want_n)
    assert n.tolist() == [5, 1, 3, 5, 5, 5]
    verify_len = torch.tensor([0, 4, 4, 1, 2, 3])
    accepted, n = acc.accept(LogitsShard.full(logits), drafts, None, verify_len=verify_len)
    assert torch.equal(n, _torch_strict(logits, drafts, verify_len)[1])
    assert bool((n <= verify_len + 1).all())


def test_k0_selects_one_target_token():
    logits = torch.randn(3, 9)
    accepted, n = _acceptance(k=0).accept(LogitsShard.full(logits), torch.empty(3, 0, dtype=torch.int64),
                                          None)
    assert torch.equal(accepted[:, 0], logits.argmax(-1)) and n.tolist() == [1, 1, 1]


@pytest.mark.parametrize("rule", ["strict", "rejection"])
@pytest.mark.parametrize("forced", [1.0, 2.5, 9.0])
def test_forced_acceptance_never_exceeds_verify_len(rule, forced):
    g, k, v = 8, 4, 16
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(g * (k + 1), v, generator=gen)
    drafts = torch.randint(0, v, (g, k), generator=gen)
    selector = SampleSelector(SampleConfig(temperature=1.0)) if rule == "rejection" else None
    acc = _acceptance(selector, rule=rule, forced=forced, k=k)
    verify_len = torch.tensor([0, 1, 2, 3, 4, 4, 2, 0])
    key = SamplingKey(seeds=torch.arange(g), offsets=torch.full((g,), 10))
    q = torch.softmax(torch.randn(g, k, v, generator=gen), -1)
    for _ in range(5):
        accepted, n = acc.accept(LogitsShard.full(logits), drafts, key, draft_probs=q,
                                 verify_len=verify_len)
        assert bool((n >= 1).all()) and bool((n <= verify_len + 1).all())
        base = min(int(forced) + 1, k + 1)
        low = torch.clamp(verify_len + 1, max=base)
        if forced % 1 == 0 or base == k + 1:
            assert torch.equal(n, low)  # exact counts, ragged cap applied last
        else:
            high = torch.clamp(verify_len + 1, max=base + 1)
            assert bool(((n == low) | (n == high)).all())
        if rule == "rejection":
            assert torch.equal(accepted[:, 1:], drafts)  # inflated counts commit real tokens
    assert int(acc.forced_counter[0]) == (5 if forced == 2.5 else 0)
    # warm-up runs are not forced
    _, n = acc.accept(LogitsShard.full(logits), drafts, key, draft_probs=q, verify_len=verify_len,
                      warmup=True)
    assert bool((n <= verify_len + 1).all())


def test_rejection_with_equal_distributions_accepts_everything():
    """q == p and drafts in the support: every draft is accepted (u * q < p almost surely)."""
    g, k, v = 5, 3, 7
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(g * (k + 1), v, generator=gen)
    selector = SampleSelector(SampleConfig(temperature=1.0))
    p = torch.softmax(logits, -1).view(g, k + 1, v)
    drafts = p[:, :k].argmax(-1)
    acc = _acceptance(selector, rule="rejection", k=k)
    key = SamplingKey(seeds=torch.arange(g), offsets=torch.zeros(g, dtype=torch.int64))
    accepted, n = acc.accept(LogitsShard.full(logits), drafts, key, draft_probs=p[:, :k].contiguous())
    assert n.tolist() == [k + 1] * g
    assert torch.equal(accepted[:, :k], drafts)
    with pytest.raises(ShapeError, match="draft_probs"):
        acc.accept(LogitsShard.full(logits), drafts, key)
