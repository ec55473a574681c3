"""The rank pool runs functions on every rank of a gloo group."""

from __future__ import annotations

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
