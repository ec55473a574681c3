"""DraftChain.run checks its tensors' shapes (no device sync) and raises ShapeError."""

from __future__ import annotations

import pytest
import torch

from draftsmith.contract import MarkovHeadKind, MarkovHeadWeights, SingleRank
from draftsmith.contract.errors import ShapeError
from draftsmith.runtime.markov import DraftChain
from draftsmith.selection.strategies import GreedySelector

G, K, V, R = 3, 4, 16, 4


@pytest.fixture
def chain() -> DraftChain:
    weights = MarkovHeadWeights.make_dummy(vocab_size=V, rank=R, seed=1)
    return DraftChain(weights, GreedySelector(), SingleRank(), mode="eager", vocab_size=V)


def _base(s: int = V, g: int = G) -> torch.Tensor:
    return torch.randn(g, K, s, generator=torch.Generator().manual_seed(0))


ANCHOR = torch.tensor([1, 2, 3])


def test_well_formed_inputs_run(chain: DraftChain) -> None:
    drafts, corrected = chain.run(_base(), 0, ANCHOR, None)
    assert drafts.shape == (G, K) and corrected.shape == (G, K, V)


@pytest.mark.parametrize("width", [V - 1, V + 1])
def test_base_width_must_equal_the_shard_width(chain: DraftChain, width: int) -> None:
    with pytest.raises(ShapeError, match=rf"base dim 2 \(S\) must be {V}"):
        chain.run(_base(width), 0, ANCHOR, None)


def test_base_must_be_three_dim_float(chain: DraftChain) -> None:
    with pytest.raises(ShapeError, match="base must have 3 dims"):
        chain.run(_base()[:, 0], 0, ANCHOR, None)
    with pytest.raises(ShapeError, match="base must have dtype"):
        chain.run(_base().to(torch.int64), 0, ANCHOR, None)


@pytest.mark.parametrize("anchor", [torch.tensor([1, 2]), torch.tensor([1, 2, 3, 4]),
                                    torch.tensor([[1, 2, 3]])])
def test_anchor_must_have_one_row_per_request(chain: DraftChain, anchor: torch.Tensor) -> None:
    with pytest.raises(ShapeError, match="anchor"):
        chain.run(_base(), 0, anchor, None)


def test_anchor_must_be_int64(chain: DraftChain) -> None:
    with pytest.raises(ShapeError, match="anchor must have dtype int64"):
        chain.run(_base(), 0, ANCHOR.to(torch.int32), None)


def test_vocab_start_must_match_the_weights_shard() -> None:
    w = MarkovHeadWeights.make_dummy(vocab_size=V, rank=R, seed=1)
    shard = MarkovHeadWeights(MarkovHeadKind.VANILLA, w.w1, w.w2[8:].contiguous(), vocab_start=8)
    chain = DraftChain(shard, GreedySelector(), SingleRank(), mode="eager", vocab_size=V)
    with pytest.raises(ShapeError, match="base logits start at vocab id 0, the Markov w2 rows at 8"):
        chain.run(_base(8), 0, ANCHOR, None)


def test_probs_out_and_hidden_shapes(chain: DraftChain) -> None:
    with pytest.raises(ShapeError, match=rf"probs_out dim 2 must be {V}"):
        chain.run(_base(), 0, ANCHOR, None, probs_out=torch.zeros(G, K, V - 1))
    with pytest.raises(ShapeError, match=r"hidden dim 0 \(G\) must be 3"):
        chain.run(_base(), 0, ANCHOR, None, hidden=torch.zeros(G + 1, K, 8))


def test_chain_without_head_checks_rows_too() -> None:
    chain = DraftChain(None, GreedySelector(), SingleRank(), mode="none", vocab_size=V)
    drafts, _ = chain.run(_base(), 0, ANCHOR, None)
    assert drafts.shape == (G, K)
    with pytest.raises(ShapeError, match="anchor"):
        chain.run(_base(), 0, ANCHOR[:2], None)


@pytest.mark.parametrize("mode", ["none", "eager", "fused"])
def test_tokens_out_receives_the_anchor_then_the_drafts(mode: str) -> None:
    """Every chain writes the anchor and its drafts into ``tokens_out`` (the fused one inside its
    launches) and returns the drafts as its view: the drafts of a run without it."""
    weights = None if mode == "none" else MarkovHeadWeights.make_dummy(vocab_size=V, rank=R,
                                                                       seed=1)
    chain = DraftChain(weights, GreedySelector(), SingleRank(), mode=mode, vocab_size=V)
    want, _ = chain.run(_base(), 0, ANCHOR, None)
    for tokens in (torch.full((G, K + 1), -5, dtype=torch.int64),
                   torch.full((G, K + 3), -5, dtype=torch.int64)[:, 1:K + 2]):  # row-strided
        drafts, _ = chain.run(_base(), 0, ANCHOR, None, tokens_out=tokens)
        assert drafts.data_ptr() == tokens[:, 1:].data_ptr()
        assert torch.equal(tokens[:, 0], ANCHOR) and torch.equal(drafts, want)
    with pytest.raises(ShapeError, match="tokens_out"):
        chain.run(_base(), 0, ANCHOR, None, tokens_out=tokens[:, :K])
