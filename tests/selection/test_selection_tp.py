"""Vocab-parallel selection on real gloo groups of 2 and 4 ranks: per-rank pairs, one SUM
exchange, greedy and Gumbel-max sampling over shards.

Every rank holds only its shard; the token must equal the TP = 1 answer (``torch.argmax`` of the
gathered row for greedy; the same keyed sample for sampling). TP = 8 is emulated with threads.
"""

from __future__ import annotations

import pytest
import torch
from selection_helpers import run_threaded, shard_of, tp_adversarial_logits

from draftsmith.contract import LogitsShard, SamplingKey, SingleRank
from draftsmith.kernels.argmax_pair import argmax_pair_reference
from draftsmith.parallel import RankPool, world_collectives
from draftsmith.selection.configs import GreedyConfig, SampleConfig
from draftsmith.selection.strategies import GreedySelector, SampleSelector
from draftsmith.selection.vocab_parallel import (
    ExchangeWorkspace,
    exchange_pairs,
    sharded_argmax,
)

V = 1024
ROWS = 10

# ---- rank workers (module level so that spawned ranks can unpickle them) -------------------


def _argmax_worker(full: torch.Tensor, method: str, use_kernel: bool, ws_rows: int) -> torch.Tensor:
    col = world_collectives()
    shard = shard_of(full, col.rank, col.world_size)
    ws = ExchangeWorkspace(ws_rows) if ws_rows else None
    return sharded_argmax(shard, col, workspace=ws, use_kernel=use_kernel, method=method)


def _exchange_worker(full: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    col = world_collectives()
    shard = shard_of(full, col.rank, col.world_size)
    staging = argmax_pair_reference(shard.logits, shard.vocab_start,
                                     torch.empty(full.shape[0], 128), col.rank)
    summed = exchange_pairs(staging.clone(), col, "sum")[:, :2 * col.world_size]
    gathered = exchange_pairs(staging.clone(), col, "gather")
    return summed, gathered


def _select_worker(full: torch.Tensor, config, seeds: torch.Tensor, offsets: torch.Tensor,
                   stream: int, with_probs: bool):
    col = world_collectives()
    return _select(col, full, config, seeds, offsets, stream, with_probs)


def _select(col, full, config, seeds, offsets, stream, with_probs):
    shard = shard_of(full, col.rank, col.world_size)
    if isinstance(config, GreedyConfig):
        sel = GreedySelector(config)
    else:
        sel = SampleSelector(config)
    key = SamplingKey(seeds, offsets)
    token = sel.select(shard, key, stream, col)
    route = sel.route(col.world_size, full.shape[1]).kind
    if not with_probs:
        return token, None, route, None
    return token, sel.probs(shard, col), route, sel.select_with_probs(shard, key, stream, col)


@pytest.fixture(scope="module", params=[2, 4], ids=["tp2", "tp4"])
def pool(request):
    """One gloo pool per TP size; pytest groups the tests by size, so only one pool is alive."""
    with RankPool(request.param) as p:
        yield p


def _key(rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2**62, (rows,), generator=g), torch.randint(0, 2**31, (rows,),
                                                                         generator=g)


# ---- greedy ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("method", ["sum", "gather"])
def test_sharded_argmax_equals_torch_argmax(pool: RankPool, dtype, method: str) -> None:
    full = tp_adversarial_logits(ROWS, V, seed=pool.world_size, dtype=dtype)
    want = torch.argmax(full, dim=1)
    for token in pool.run(_argmax_worker, full, method, False, 0):
        assert torch.equal(token, want)


def test_sharded_argmax_kernel_and_workspace_overflow(pool: RankPool) -> None:
    full = tp_adversarial_logits(ROWS, V, seed=7, dtype=torch.float32)
    want = torch.argmax(full, dim=1)
    # Triton kernel (interpreter on CPU); a 4-row workspace makes 10 rows use the gather path
    for token in pool.run(_argmax_worker, full, "auto", True, 4):
        assert torch.equal(token, want)


def test_sum_exchange_equals_all_gather(pool: RankPool) -> None:
    full = tp_adversarial_logits(ROWS, V, seed=11, dtype=torch.bfloat16)
    for summed, gathered in pool.run(_exchange_worker, full):
        torch.testing.assert_close(summed, gathered, rtol=0, atol=0, equal_nan=True)
        # -0.0 may come back as +0.0 and NaN canonicalised: neither changes the decision
        assert torch.equal(summed[:, 0::2], gathered[:, 0::2])


def test_greedy_selector_tokens_and_probs(pool: RankPool) -> None:
    full = tp_adversarial_logits(ROWS, V, seed=5, dtype=torch.float32)
    seeds, offsets = _key(ROWS)
    want = torch.argmax(full, dim=1)
    for token, probs, route, _ in pool.run(_select_worker, full, GreedyConfig(), seeds, offsets,
                                            0, True):
        assert route == "pair_argmax"
        assert torch.equal(token, want)
        assert torch.equal(probs, torch.nn.functional.one_hot(want, V).float())


# ---- sampling: same key -> same token for every TP ------------------------------------------

CONFIGS = [
    (SampleConfig(temperature=0.8), "gumbel_pairs"),
    (SampleConfig(temperature=1.3, top_k=7), "topk_candidates"),
    (SampleConfig(temperature=0.6, top_k=40, top_p=0.8), "topk_candidates"),
    (SampleConfig(temperature=1.0, top_p=0.7), "gather"),
    (SampleConfig(temperature=0.0, top_k=3), "pair_argmax"),
]


def _random_full(rows: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, V, generator=g) * 2).to(torch.bfloat16).float()


@pytest.mark.parametrize("config,route", CONFIGS, ids=[r for _, r in CONFIGS])
def test_sampled_token_independent_of_tp(pool: RankPool, config: SampleConfig, route: str) -> None:
    full = _random_full(ROWS, seed=21)
    seeds, offsets = _key(ROWS, seed=3)
    want, want_probs, local, _ = _select(SingleRank(), full, config, seeds, offsets, 1, True)
    assert local == "local"
    for token, probs, got_route, both in pool.run(_select_worker, full, config, seeds, offsets, 1,
                                                  True):
        assert got_route == route
        assert torch.equal(token, want)
        torch.testing.assert_close(probs, want_probs, rtol=0, atol=0)
        # the drafter chain's one-call form gives the same pair on every rank
        assert torch.equal(both[0], want) and torch.equal(both[1], want_probs)


@pytest.mark.parametrize("config,route", CONFIGS[:4], ids=[r for _, r in CONFIGS[:4]])
def test_sampled_token_tp8_emulated(config: SampleConfig, route: str) -> None:
    full = _random_full(ROWS, seed=22)
    seeds, offsets = _key(ROWS, seed=4)
    want = _select(SingleRank(), full, config, seeds, offsets, 0, False)[0]
    for token, _, got_route, _ in run_threaded(8, _select, full, config, seeds, offsets, 0, False):
        assert got_route == route
        assert torch.equal(token, want)


def test_greedy_tp8_emulated() -> None:
    full = tp_adversarial_logits(ROWS, V, seed=8, dtype=torch.bfloat16)
    want = torch.argmax(full, dim=1)
    for token, _, _, _ in run_threaded(8, _select, full, GreedyConfig(), *_key(ROWS), 0, False):
        assert torch.equal(token, want)


def _full_on_every_rank(col, full, config, seeds, offsets):
    sel = SampleSelector(config)
    return sel.select(LogitsShard.full(full), SamplingKey(seeds, offsets), 0, col)


def test_full_logits_on_every_rank_need_no_exchange() -> None:
    full = _random_full(ROWS, seed=23)
    seeds, offsets = _key(ROWS, seed=5)
    config = SampleConfig(temperature=0.9, top_k=9)
    want = _full_on_every_rank(SingleRank(), full, config, seeds, offsets)
    for token in run_threaded(2, _full_on_every_rank, full, config, seeds, offsets):
        assert torch.equal(token, want)


# ---- NCCL on two GPUs: eager and CUDA-graph replay equal an all-gather ---------------------


def _nccl_worker(full_cpu: torch.Tensor, dtype: torch.dtype):
    col = world_collectives()
    dev = torch.device("cuda", col.rank)
    full = full_cpu.to(dev, dtype)
    shard = shard_of(full, col.rank, col.world_size)
    ws = ExchangeWorkspace(full.shape[0], dev)
    eager = sharded_argmax(shard, col, ws, use_kernel=True)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(2):
            sharded_argmax(shard, col, ws, use_kernel=True)
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = sharded_argmax(shard, col, ws, use_kernel=True)
    fresh = torch.flip(full, dims=[1]).contiguous()
    shard.logits.copy_(shard_of(fresh, col.rank, col.world_size).logits)
    graph.replay()
    torch.cuda.synchronize(dev)
    return eager.cpu(), replayed.cpu(), torch.argmax(fresh, dim=1).cpu()


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for an NCCL group")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nccl_sum_exchange_eager_and_graph(dtype: torch.dtype) -> None:
    full = tp_adversarial_logits(64, 151936 // 8 * 8, seed=1, dtype=torch.float32)
    with RankPool(2, backend="nccl") as nccl:
        for eager, replayed, want_fresh in nccl.run(_nccl_worker, full, dtype):
            assert torch.equal(eager, torch.argmax(full.to(dtype), dim=1))
            assert torch.equal(replayed, want_fresh)
