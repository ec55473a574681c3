"""RankPool failure handling: a rank that raises while its peers wait in a collective stops the
pool within the grace period instead of hanging the suite (matters most for NCCL, whose
collectives never time out on their own within a test run)."""

from __future__ import annotations

import time

import pytest
import torch

from draftsmith.contract import DraftsmithError
from draftsmith.parallel import RankPool, rank_device, world_collectives


def _rank_and_device() -> tuple[int, str]:
    return world_collectives().rank, str(rank_device())


def _rank0_raises_others_block() -> None:
    col = world_collectives()
    if col.rank == 0:
        raise ValueError("rank 0 failed on purpose")
    col.all_reduce(torch.ones(1))  # never completes: rank 0 does not join


def test_failed_rank_stops_the_pool_instead_of_hanging() -> None:
    with RankPool(2, error_grace_s=2.0) as pool:
        assert pool.run(_rank_and_device) == [(0, "cpu"), (1, "cpu")]
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=r"(?s)ranks \[1\] did not answer.*on purpose"):
            pool.run(_rank0_raises_others_block)
        assert time.monotonic() - t0 < 30
        with pytest.raises(RuntimeError, match="is stopped"):
            pool.run(_rank_and_device)


def test_bad_arguments() -> None:
    with pytest.raises(DraftsmithError, match="world_size"):
        RankPool(0)
    with pytest.raises(DraftsmithError, match="backend"):
        RankPool(2, backend="mpi")
