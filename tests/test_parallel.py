"""The rank pool runs functions on every rank of a gloo group."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from draftsmith.parallel import RankPool, world_collectives


def _sum_and_gather(x: float) -> tuple[float, list[float]]:
    col = world_collectives()
    t = torch.tensor([x + col.rank])
    gathered = col.all_gather(t.clone(), dim=0).tolist()
    return float(col.all_reduce(t)[0]), gathered


def _boom() -> None:
    raise ValueError("rank failure")


def _reduce_a_column() -> list[list[float]]:
    col = world_collectives()
    base = torch.ones(4, 4)
    col.all_reduce(base[:, 1])  # a strided view: only its own elements may change
    return base.tolist()


def _unpicklable() -> threading.Lock:
    return threading.Lock()


def _rank1_dies() -> int:
    if world_collectives().rank == 1:
        os._exit(3)
    return 0


@pytest.fixture(scope="module")
def pool():
    with RankPool(2) as p:
        yield p


def test_all_reduce_and_gather(pool: RankPool) -> None:
    res = pool.run(_sum_and_gather, 1.0)
    assert res == [(3.0, [1.0, 2.0]), (3.0, [1.0, 2.0])]


def test_errors_propagate(pool: RankPool) -> None:
    with pytest.raises(RuntimeError, match="rank failure"):
        pool.run(_boom)
    assert pool.run(_sum_and_gather, 0.0)[0][0] == 1.0


def test_all_reduce_of_a_strided_view(pool: RankPool) -> None:
    want = torch.ones(4, 4)
    want[:, 1] = 2.0
    assert pool.run(_reduce_a_column) == [want.tolist()] * 2


def test_an_unpicklable_result_is_reported_at_once(pool: RankPool) -> None:
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="pickle"):
        pool.run(_unpicklable)
    assert time.monotonic() - start < pool.timeout_s / 2
    assert pool.run(_sum_and_gather, 0.0)[0][0] == 1.0  # the pool still works


def test_a_rank_that_dies_is_reported_without_waiting_out_the_timeout() -> None:
    with RankPool(2, timeout_s=120.0) as doomed:
        start = time.monotonic()
        with pytest.raises(RuntimeError, match=r"1 \(exit code 3\) died"):
            doomed.run(_rank1_dies)
        assert time.monotonic() - start < 30.0
