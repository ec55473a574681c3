"""A keyed Gumbel sample does not depend on the tensor-parallel split: on 2 and 4 gloo ranks (one
:class:`RankPool` of each per module), the Triton pair kernel (interpreted, fp32) and its eager
reference draw, bit for bit, the token one rank draws from the whole row, on rows built to break
it: equal logits, ``+inf``, NaN and ``-inf`` on both sides of every shard border.

``V = 1024`` splits on Gumbel group borders (shards of 512 and 256: each rank packs its own pair,
one exchange); ``V = 1008`` does not (shards of 504 and 252 start inside a group), which is where
the split used to change the token (issue 42: 504 against 503), so those rows are gathered and
drawn whole on every rank."""

from __future__ import annotations

import pytest
import torch

from draftsmith.contract import LogitsShard, SamplingKey, SingleRank
from draftsmith.kernels.gumbel_pair import gumbel_pair, gumbel_pair_reference
from draftsmith.parallel import RankPool, world_collectives
from draftsmith.selection.configs import SampleConfig
from draftsmith.selection.strategies import SampleSelector
from draftsmith.selection.vocab_parallel import sharded_gumbel_sample

TEMPERATURE = 0.6
STREAM = 1


def _borders(vocab: int) -> list[int]:
    """Every shard border of TP = 2 and TP = 4."""
    return sorted({vocab * k // 4 for k in range(1, 4)})


def _adversarial(vocab: int) -> tuple[torch.Tensor, torch.Tensor, SamplingKey]:
    """``(logits [rows, V] fp32, temperatures [rows], key)``: per border, equal values across
    it, ``+inf`` on one or both sides, NaN on one or both sides, a NaN against a ``+inf``, and
    ``-inf`` everywhere but the two ids at the border; then an all ``-inf`` row, an all NaN row
    and a greedy row with a tie across the middle border."""
    g = torch.Generator().manual_seed(42)
    rows: list[torch.Tensor] = []
    inf, nan = float("inf"), float("nan")
    for b in _borders(vocab):
        base = torch.randn(vocab, generator=g) * 2.0
        for lo, hi, value in ((b - 8, b + 8, 6.0), (b - 1, b + 1, inf), (b, b + 1, inf),
                              (b - 1, b, inf), (b - 1, b + 1, nan), (b, b + 1, nan)):
            row = base.clone()
            row[lo:hi] = value
            rows.append(row)
        row = base.clone()
        row[b - 1], row[b] = inf, nan
        rows.append(row)
        row = torch.full((vocab,), -inf)
        row[b - 1:b + 1] = 1.5
        rows.append(row)
    rows.append(torch.full((vocab,), -inf))
    rows.append(torch.full((vocab,), nan))
    row = torch.randn(vocab, generator=g)
    row[vocab // 2 - 1:vocab // 2 + 1] = 9.0
    rows.append(row)
    x = torch.stack(rows)
    temps = torch.full((x.shape[0],), TEMPERATURE)
    temps[-1] = 0.0
    n = x.shape[0]
    key = SamplingKey(torch.arange(n, dtype=torch.int64) * 7919 + 13,
                      torch.arange(n, dtype=torch.int64) + 100)
    return x, temps, key


def _one_rank(vocab: int, fn) -> torch.Tensor:
    x, temps, key = _adversarial(vocab)
    return fn(x, temps, key.seeds, key.offsets, STREAM)[:, 0].long()


def _even_shard(x: torch.Tensor, coll) -> LogitsShard:
    """This rank's even share of the columns of ``x: [rows, V]``."""
    vocab = x.shape[1]
    width = vocab // coll.world_size
    return LogitsShard(x[:, coll.rank * width:(coll.rank + 1) * width].contiguous(),
                       coll.rank * width, vocab)


def _rank_tokens(vocab: int, use_kernel: bool) -> torch.Tensor:
    """One rank: its even shard of the adversarial rows through the sharded sample."""
    torch.set_num_threads(1)
    coll = world_collectives()
    x, temps, key = _adversarial(vocab)
    return sharded_gumbel_sample(_even_shard(x, coll), temps, key, STREAM, coll,
                                 use_kernel=use_kernel)


def _selector_tokens(vocab: int, vocab_parallel: bool) -> torch.Tensor:
    """One rank: the sampling strategy itself (its route decides pairs or gather)."""
    torch.set_num_threads(1)
    coll = world_collectives()
    x, _temps, key = _adversarial(vocab)
    shard = _even_shard(x, coll)
    selector = SampleSelector(SampleConfig(temperature=TEMPERATURE,
                                           vocab_parallel=vocab_parallel), use_kernels=True)
    return selector.select(shard, key, STREAM, coll)


@pytest.fixture(scope="module")
def pools():
    """One pool of 2 and one of 4 gloo ranks, started once for the module."""
    with RankPool(2, timeout_s=300.0) as two, RankPool(4, timeout_s=300.0) as four:
        yield {2: two, 4: four}


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("vocab", [1024, 1008])
def test_kernel_and_reference_draw_the_one_rank_token_on_2_and_4_ranks(pools, vocab):
    want = _one_rank(vocab, gumbel_pair)
    assert torch.equal(want, _one_rank(vocab, gumbel_pair_reference))
    x, _, _ = _adversarial(vocab)
    assert torch.isnan(x[-2]).all() and want[-2] == 0 and want[-3] == 0  # NaN row, -inf row
    for tp, pool in pools.items():
        for use_kernel in (True, False):
            for rank, got in enumerate(pool.run(_rank_tokens, vocab, use_kernel)):
                assert torch.equal(got, want), (tp, rank, use_kernel,
                                                (got != want).nonzero()[:, 0].tolist())


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("vocab", [1024, 1008])
@pytest.mark.parametrize("vocab_parallel", [True, False])
def test_the_sampling_strategy_draws_the_one_rank_token(pools, vocab, vocab_parallel):
    """Through :class:`SampleSelector`: the pair route, the gather of a split that cuts groups,
    and ``vocab_parallel = false`` (the gather baseline) all draw one rank's token."""
    x, _temps, key = _adversarial(vocab)
    selector = SampleSelector(SampleConfig(temperature=TEMPERATURE), use_kernels=True)
    want = selector.select(LogitsShard(x, 0, vocab), key, STREAM, SingleRank())
    for rank, got in enumerate(pools[2].run(_selector_tokens, vocab, vocab_parallel)):
        assert torch.equal(got, want), (rank, (got != want).nonzero()[:, 0].tolist())


def test_the_route_gathers_where_a_border_cuts_a_group():
    selector = SampleSelector(SampleConfig(temperature=TEMPERATURE))
    assert selector.route(2, 1024).kind == "gumbel_pairs"
    route = selector.route(2, 1008)
    assert route.kind == "gather" and "S = 504 is not a multiple of the Gumbel group size 16" \
        in route.reason
