"""Tensor-parallel emulation with threads: one process, one thread per rank.

:class:`ThreadCollectives` implements the ``Collectives`` Protocol through a shared barrier, so
multi-rank logic (vocab-parallel selection, sharded Markov chains, TP drafters) can be tested at
TP = 8 on a small CPU box without starting processes. ``all_reduce`` sums in rank order from
rank 0, a deterministic reduction. For real process groups use :class:`draftsmith.parallel.RankPool`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch


class _ThreadGroup:
    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size)
        self.slots: list[Any] = [None] * size


class ThreadCollectives:
    """One emulated rank of a thread group, seen as ``Collectives``."""

    def __init__(self, group: _ThreadGroup, rank: int) -> None:
        self._group, self.rank, self.world_size = group, rank, group.size

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the group in rank order, in place; returns ``tensor``."""
        parts = self._exchange(tensor)
        total = parts[0].clone()
        for p in parts[1:]:
            total += p
        return tensor.copy_(total)

    def all_gather(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Concatenate every rank's ``tensor`` along ``dim`` in rank order."""
        return torch.cat(self._exchange(tensor), dim=dim)

    def _exchange(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        g = self._group
        g.slots[self.rank] = tensor.clone()
        g.barrier.wait()
        parts = list(g.slots)
        g.barrier.wait()
        return parts


def run_threaded(tp: int, fn: Callable[..., Any], *args: Any) -> list[Any]:
    """Run ``fn(collectives, *args)`` on ``tp`` emulated ranks; results in rank order. The first
    rank's exception is re-raised after the others are released."""
    group = _ThreadGroup(tp)
    out: list[Any] = [None] * tp
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        try:
            out[rank] = fn(ThreadCollectives(group, rank), *args)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
            group.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(tp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


__all__ = ["ThreadCollectives", "run_threaded"]
