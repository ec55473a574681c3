"""Eligibility of the vocab-parallel path (even shards; when full logits must still be gathered)
and the route each strategy takes."""

from __future__ import annotations

import pytest
import torch

from draftsmith.contract import (
    ConfigError,
    LogitsShard,
    PlanError,
    SelectorCapabilities,
    SingleRank,
)
from draftsmith.selection import ExchangeWorkspace, decode_pairs
from draftsmith.selection.configs import GreedyConfig, SampleConfig, capabilities_of
from draftsmith.selection.eligibility import (
    SelectionRoute,
    selection_route,
    vocab_parallel_eligibility,
)
from draftsmith.selection.vocab_parallel import (
    check_shard_layout,
    order_t_sort,
    order_t_sort_columns,
)

V = 151936


def test_eligible_greedy_and_temperature_only() -> None:
    for sel in (None, GreedyConfig(), SampleConfig(temperature=0.7),
                SampleConfig(temperature=0.0, top_k=5)):
        e = vocab_parallel_eligibility(tp_size=4, vocab_size=V,
                                       strategy=sel and capabilities_of(sel))
        assert e.ok and not e.gather_required, e


def test_tp1_needs_nothing() -> None:
    e = vocab_parallel_eligibility(tp_size=1, vocab_size=V)
    assert not e.ok and not e.gather_required and "TP == 1" in e.reason
    assert selection_route(SampleConfig(top_p=0.5), 1, V).kind == "local"


@pytest.mark.parametrize("kwargs,needle", [
    (dict(attention_dp=True), "attention-DP"),
    (dict(vocab_size=V + 1), "not divisible"),
    (dict(vocab_size=4 * 1001, tp_size=4), "multiple of 4"),
    (dict(vocab_size=2**24), "2**24"),
    (dict(penalties=True), "penalties"),
    (dict(logit_processors=True), "post-processors"),
    (dict(guided_decoding=True), "guided"),
    (dict(min_p=0.05), "min-p"),
    (dict(head_has_bias=True), "bias"),
    (dict(head_quantized=True), "quantized"),
    (dict(workspace_allocated=False), "workspace"),
    (dict(wants_logits=True), "logits"),
    (dict(rejection_full_vocab=True), "rejection"),
    (dict(reduced_draft_vocab=True), "d2t"),
    (dict(selection=SampleConfig(top_k=20)), "top-k"),
    (dict(selection=SampleConfig(top_p=0.9)), "top-p"),
])
def test_each_condition_blocks_with_its_reason(kwargs: dict, needle: str) -> None:
    args = dict(tp_size=2, vocab_size=V) | kwargs
    selection = args.pop("selection", None)
    e = vocab_parallel_eligibility(**args, strategy=selection and capabilities_of(selection))
    assert not e.ok and e.gather_required
    assert needle in e.reason, e.reason
    route = selection_route(selection, args["tp_size"], args["vocab_size"], e)
    assert isinstance(route, SelectionRoute)
    if needle == "top-k":
        assert e.filter_only and route.kind == "topk_candidates"
    else:
        assert route.kind == "gather" and needle in route.reason


def test_a_strategy_is_shardable_only_when_it_declares_it() -> None:
    mine = SelectorCapabilities(kind="mine", greedy=False, temperature=0.5)
    e = vocab_parallel_eligibility(tp_size=2, vocab_size=V, strategy=mine)
    assert not e.ok and "strategy 'mine' does not declare a vocab-parallel path" in e.reason
    shardable = mine.model_copy(update={"vocab_parallel": True})
    assert vocab_parallel_eligibility(tp_size=2, vocab_size=V, strategy=shardable).ok
    filtered = shardable.model_copy(update={"filters": ("top-q = 3",)})
    e = vocab_parallel_eligibility(tp_size=2, vocab_size=V, strategy=filtered)
    assert not e.ok and e.filter_only and "top-q = 3 is enabled" in e.reason


def test_routes_by_config() -> None:
    assert selection_route(GreedyConfig(), 2, V).kind == "pair_argmax"
    assert selection_route(SampleConfig(temperature=0.5), 2, V).kind == "gumbel_pairs"
    assert selection_route(SampleConfig(top_k=50, top_p=0.9), 4, V).kind == "topk_candidates"
    assert selection_route(SampleConfig(top_k=5000), 4, V).kind == "gather"  # beyond the bound
    assert selection_route(SampleConfig(top_k=300), 4, 1024).kind == "gather"  # k > S = 256
    assert selection_route(SampleConfig(top_p=0.9), 4, V).kind == "gather"
    # a top-k that is blocked for another reason still gathers
    e = vocab_parallel_eligibility(tp_size=2, vocab_size=V,
                                   strategy=capabilities_of(SampleConfig(top_k=5)),
                                   penalties=True)
    assert selection_route(SampleConfig(top_k=5), 2, V, e).kind == "gather"


def test_decode_prefers_lowest_rank_and_nan() -> None:
    g = torch.tensor([
        [0.0, 1.0, 10.0, 1.0, 20.0, 0.5],  # tie of ranks 0 and 1 -> rank 0's id
        [0.0, 1.0, 10.0, float("nan"), 20.0, float("nan")],  # first NaN rank
        [0.0, float("-inf"), 10.0, float("-inf"), 20.0, float("-inf")],  # all -inf -> rank 0
        [0.0, -0.0, 10.0, 0.0, 20.0, -1.0],  # -0.0 == +0.0 -> rank 0
    ])
    assert decode_pairs(g, 3).tolist() == [0, 10, 0, 0]
    # one rank: its own pair's id, whatever its value (a NaN or -inf included)
    assert decode_pairs(g, 1).tolist() == [0, 0, 0, 0]
    assert decode_pairs(g[:, 2:], 1).tolist() == [10, 10, 10, 10]


def test_shard_layout_is_checked() -> None:
    class Rank1Of2(SingleRank):
        rank, world_size = 1, 2

    good = LogitsShard(torch.zeros(1, 8), 8, 16)
    assert check_shard_layout(good, Rank1Of2()) == 8
    with pytest.raises(PlanError, match="contiguous shards"):
        check_shard_layout(LogitsShard(torch.zeros(1, 8), 0, 16), Rank1Of2())
    with pytest.raises(PlanError):
        check_shard_layout(LogitsShard(torch.zeros(1, 6), 6, 16), Rank1Of2())


def test_workspace_views_share_storage() -> None:
    ws = ExchangeWorkspace(8)
    view = ws.rows(3)
    assert view is not None and view.data_ptr() == ws.staging.data_ptr()
    assert view.shape == (3, 128) and ws.rows(9) is None


@pytest.mark.parametrize("rows,n,start", [(1, 1, 0), (3, 257, 0), (5, 1031, 4096)])
def test_column_sort_equals_order_t_sort(rows: int, n: int, start: int) -> None:
    """One stable sort of columns in id order gives order T: ties keep the lower id first, NaN
    comes first, -inf last; compared bit for bit with the id-sorting reference."""
    g = torch.Generator().manual_seed(rows * n)
    scores = torch.randint(-4, 5, (rows, n), generator=g).float() / 2  # many exact ties
    scores[0, n // 2] = float("nan")
    scores[-1, 0] = float("-inf")
    perm = torch.randperm(n, generator=g)  # the reference sees the columns shuffled
    ids = (torch.arange(n) + start)[perm].expand(rows, n)
    want_s, want_ids = order_t_sort(scores[:, perm], ids)
    got_s, got_ids = order_t_sort_columns(scores, start)
    assert torch.equal(got_ids, want_ids)
    assert torch.equal(got_s.nan_to_num(7.0), want_s.nan_to_num(7.0))
    if n > 1:
        assert torch.equal(got_ids[0, :1], torch.tensor([start + n // 2]))  # NaN first


@pytest.mark.parametrize("kind", ["greedy", "sample"])
def test_vocab_parallel_off_routes_through_the_gather_and_says_why(kind: str) -> None:
    from draftsmith.runtime.config import SpecConfig  # the config layer wraps the selection's

    config = (GreedyConfig(vocab_parallel=False) if kind == "greedy"
              else SampleConfig(temperature=0.7, vocab_parallel=False))
    route = selection_route(config, 2, V)
    assert route == SelectionRoute("gather", "gather logits: selection.vocab_parallel is false")
    assert selection_route(config, 1, V).kind == "local"
    with pytest.raises(ConfigError, match="selection.vocab_parallel: Input should be a valid "
                                          "boolean"):
        SpecConfig.from_dict({"selection": {"kind": kind, "vocab_parallel": "maybe"}})
