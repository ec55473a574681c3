"""torch.distributed behind the :class:`~draftsmith.contract.Collectives` Protocol, and a pool of
rank processes for multi-rank tests and benchmarks.

Drafters and selection never import this module: the runtime (or a test) builds a
:class:`ProcessGroupCollectives` and injects it. May import ``contract`` only.

:class:`RankPool` starts ``world_size`` processes once (gloo on the CPU, NCCL on GPUs), each in a
process group, and runs picklable module-level functions on every rank, returning each rank's
result. Starting processes costs seconds, so tests keep one pool per module.
"""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from draftsmith.contract import DraftsmithError


class ProcessGroupCollectives:
    """A torch.distributed process group seen as :class:`Collectives`."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self._group = group

    @property
    def rank(self) -> int:
        """This rank's index in the group."""
        return dist.get_rank(self._group)

    @property
    def world_size(self) -> int:
        """Ranks in the group."""
        return dist.get_world_size(self._group)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum over the group, in place; returns ``tensor``."""
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self._group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Concatenate every rank's ``tensor`` along ``dim`` in rank order."""
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor, group=self._group)
        return torch.cat(parts, dim=dim)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world_size: int, backend: str, port: int, tasks: Any, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if backend == "nccl":
        torch.cuda.set_device(rank)
    torch.set_num_threads(1)
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    try:
        while True:
            task = tasks.get()
            if task is None:
                break
            fn, args, kwargs = task
            try:
                results.put((rank, True, fn(*args, **kwargs)))
            except BaseException:  # noqa: BLE001 - reported to the parent with its traceback
                results.put((rank, False, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class RankPool:
    """``world_size`` processes in one process group, reused across calls.

    Use as a context manager; ``run(fn, *args)`` calls ``fn(*args)`` on every rank (``fn`` must be
    a module-level function) and returns the per-rank results in rank order.
    """

    def __init__(self, world_size: int, backend: str = "gloo", timeout_s: float = 300.0) -> None:
        if world_size < 1:
            raise DraftsmithError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.backend = backend
        self.timeout_s = timeout_s
        self._ctx = mp.get_context("spawn")
        self._tasks = [self._ctx.Queue() for _ in range(world_size)]
        self._results = self._ctx.Queue()
        self._procs: list[Any] = []

    def __enter__(self) -> RankPool:
        port = _free_port()
        for rank in range(self.world_size):
            p = self._ctx.Process(
                target=_worker,
                args=(rank, self.world_size, self.backend, port, self._tasks[rank], self._results),
                daemon=True,
            )
            p.start()
            self._procs.append(p)
        return self

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank; raise if any rank raised."""
        for q in self._tasks:
            q.put((fn, args, kwargs))
        out: dict[int, Any] = {}
        errors = []
        for _ in range(self.world_size):
            rank, ok, value = self._results.get(timeout=self.timeout_s)
            if ok:
                out[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
        if errors:
            raise RuntimeError("\n".join(errors))
        return [out[r] for r in range(self.world_size)]

    def __exit__(self, *exc: object) -> None:
        for q in self._tasks:
            q.put(None)
        for p in self._procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def world_collectives() -> ProcessGroupCollectives:
    """The default process group (inside a :class:`RankPool` task or a ``torchrun`` process)."""
    if not dist.is_initialized():
        raise DraftsmithError("torch.distributed is not initialised; start under torchrun or RankPool")
    return ProcessGroupCollectives()


__all__ = ["ProcessGroupCollectives", "RankPool", "world_collectives"]
