"""The draft chain: Markov head over full and sharded vocabularies, greedy and sampled."""

from __future__ import annotations

import pytest
import torch
from _runtime_doubles import run_ranks

from draftsmith.contract import (
    LogitsShard,
    MarkovHeadKind,
    MarkovHeadWeights,
    SamplingKey,
    SingleRank,
)
from draftsmith.kernels.markov_chain import markov_bias_reference, markov_chain_reference
from draftsmith.runtime.markov import DraftChain, markov_bias
from draftsmith.selection.configs import SampleConfig
from draftsmith.selection.strategies import GreedySelector, SampleSelector

G, K, V, R = 3, 7, 64, 8


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(G, K, V, generator=g) * 2
    weights = MarkovHeadWeights.make_dummy(vocab_size=V, rank=R, seed=1)
    anchor = torch.tensor([3, -1, V - 1])  # an out-of-vocab anchor gives a zero bias
    return base, weights, anchor


def test_greedy_full_chain_equals_reference(data):
    base, w, anchor = data
    chain = DraftChain(w, GreedySelector(), SingleRank(), mode="eager", vocab_size=V)
    drafts, corrected = chain.run(base, 0, anchor, None)
    want_drafts, want_corrected = markov_chain_reference(base, anchor, w.w1, w.w2)
    assert torch.equal(drafts, want_drafts) and torch.equal(corrected, want_corrected)
    assert torch.equal(corrected[1, 0], base[1, 0])  # zero bias for anchor -1


def test_fused_chain_tokens_equal_reference(data):
    base, w, anchor = data
    base = base[:, :3]  # the kernel is interpreted on CPU: keep it short
    chain = DraftChain(w, GreedySelector(), SingleRank(), mode="fused", vocab_size=V)
    drafts, corrected = chain.run(base, 0, anchor, None)
    want_drafts, want_corrected = markov_chain_reference(base, anchor, w.w1, w.w2)
    assert torch.equal(drafts, want_drafts)
    torch.testing.assert_close(corrected, want_corrected)


def test_fused_chain_can_skip_the_corrected_store_and_writes_one_hot_probs(data):
    """The round asks for drafts only (no corrected store); a greedy ``q`` is the one-hot of
    each draft, whichever was asked."""
    base, w, anchor = data
    base = base[:, :3]
    chain = DraftChain(w, GreedySelector(), SingleRank(), mode="fused", vocab_size=V)
    drafts, _ = chain.run(base, 0, anchor, None)
    lean, none = chain.run(base, 0, anchor, None, want_corrected=False)
    assert none is None and torch.equal(lean, drafts)
    probs = torch.full((G, 3, V), 0.5)
    with_probs, _ = chain.run(base, 0, anchor, None, probs_out=probs, want_corrected=False)
    assert torch.equal(with_probs, drafts)
    assert torch.equal(probs, torch.nn.functional.one_hot(drafts, V).float())


def test_k0_returns_base_object(data):
    base, w, anchor = data
    empty = base[:, :0]
    chain = DraftChain(w, GreedySelector(), SingleRank(), mode="eager", vocab_size=V)
    drafts, corrected = chain.run(empty, 0, anchor, None)
    assert corrected is empty and drafts.shape == (G, 0)


def test_sampled_chain_feeds_the_sampled_token_forward(data):
    base, w, anchor = data
    sel = SampleSelector(SampleConfig(temperature=0.7))
    key = SamplingKey(seeds=torch.tensor([5, 6, 7]), offsets=torch.tensor([10, 20, 30]))
    probs = torch.zeros(G, K, V)
    chain = DraftChain(w, sel, SingleRank(), mode="eager", vocab_size=V)
    drafts, corrected = chain.run(base, 0, anchor, key, probs_out=probs)
    prev = anchor
    for j in range(K):
        z = base[:, j] + markov_bias_reference(w.w1, w.w2, prev)
        assert torch.equal(corrected[:, j], z)
        kj = SamplingKey(seeds=key.seeds, offsets=key.offsets + j)
        tok = sel.select(LogitsShard.full(z), kj, 1, SingleRank())
        assert torch.equal(drafts[:, j], tok)
        torch.testing.assert_close(probs[:, j], torch.softmax(z / 0.7, -1))
        prev = tok
    # sampling really departed from the argmax somewhere, so feeding it forward mattered
    assert not torch.equal(drafts, corrected.argmax(-1))
    again, _ = chain.run(base, 0, anchor, key)
    assert torch.equal(again, drafts)  # keyed draws: deterministic


def test_chain_without_head_selects_each_slot(data):
    base, _, anchor = data
    sel = SampleSelector(SampleConfig(temperature=1.0))
    key = SamplingKey(seeds=torch.tensor([1, 2, 3]), offsets=torch.tensor([4, 5, 6]))
    chain = DraftChain(None, sel, SingleRank(), mode="none", vocab_size=V)
    drafts, out = chain.run(base, 0, anchor, key)
    assert out is base
    for j in range(K):
        kj = SamplingKey(seeds=key.seeds, offsets=key.offsets + j)
        assert torch.equal(drafts[:, j], sel.select(LogitsShard.full(base[:, j]), kj, 1,
                                                    SingleRank()))


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("sampled", [False, True])
def test_sharded_chain_reassembles_to_full_chain(data, tp, sampled):
    base, w, anchor = data
    sel = SampleSelector(SampleConfig(temperature=0.8)) if sampled else GreedySelector()
    key = (SamplingKey(seeds=torch.tensor([5, 6, 7]), offsets=torch.tensor([10, 20, 30]))
           if sampled else None)
    full_drafts, full_corr = DraftChain(w, sel, SingleRank(), mode="eager",
                                        vocab_size=V).run(base, 0, anchor, key)
    s = V // tp

    def rank_fn(coll):
        lo = coll.rank * s
        shard_w = MarkovHeadWeights(MarkovHeadKind.VANILLA, w.w1, w.w2[lo : lo + s].contiguous(),
                                    vocab_start=lo)
        chain = DraftChain(shard_w, sel, coll, mode="eager", vocab_size=V)
        return chain.run(base[:, :, lo : lo + s].contiguous(), lo, anchor, key)

    outs = run_ranks(tp, rank_fn)
    for drafts, _ in outs:
        assert torch.equal(drafts, full_drafts)  # identical on every rank, equal to TP = 1
    torch.testing.assert_close(torch.cat([c for _, c in outs], dim=-1), full_corr)


def test_gated_and_rnn_bias_formulas():
    g = torch.Generator().manual_seed(3)
    r, h = 4, 6
    w1, w2 = torch.randn(V, r, generator=g), torch.randn(V, r, generator=g)
    prev = torch.tensor([1, 2])
    hidden = torch.randn(2, h, generator=g)
    gated = MarkovHeadWeights(MarkovHeadKind.GATED, w1, w2,
                              gate_weight=torch.randn(r, h + r, generator=g),
                              gate_bias=torch.randn(r, generator=g))
    bias, _ = markov_bias(gated, prev, hidden, None)
    e = w1[prev]
    gate = torch.sigmoid(torch.cat([hidden, e], -1) @ gated.gate_weight.T + gated.gate_bias)
    torch.testing.assert_close(bias, (gate * e) @ w2.T)
    rnn = MarkovHeadWeights(MarkovHeadKind.RNN, w1, w2,
                            joint_weight=torch.randn(3 * r, 2 * r + h, generator=g),
                            joint_bias=torch.randn(3 * r, generator=g))
    bias, state = markov_bias(rnn, prev, hidden, None)
    z = torch.cat([torch.zeros(2, r), e, hidden], -1) @ rnn.joint_weight.T + rnn.joint_bias
    gr, cr, orr = z.chunk(3, -1)
    torch.testing.assert_close(bias, torch.tanh(orr) @ w2.T)
    torch.testing.assert_close(state, (1 - torch.sigmoid(gr)) * torch.tanh(cr))
