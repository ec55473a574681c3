"""torch.distributed behind the :class:`~draftsmith.contract.Collectives` Protocol, and a pool of
rank processes for multi-rank tests and benchmarks.

Drafters and selection never import this module: the runtime (or a test) builds a
:class:`ProcessGroupCollectives` and injects it. May import ``contract`` only.

:class:`RankPool` starts ``world_size`` processes once (gloo on the CPU, NCCL on GPUs), each in a
process group, and runs picklable module-level functions on every rank, returning each rank's
result. Starting processes costs seconds, so tests keep one pool per module.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import socket
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from draftsmith.contract import ConfigError, PlanError


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
        if tensor.is_contiguous():
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self._group)
            return tensor
        # gloo reduces a strided view as if it were dense (it wrote past the view's elements)
        dense = tensor.contiguous()
        dist.all_reduce(dense, op=dist.ReduceOp.SUM, group=self._group)
        return tensor.copy_(dense)

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


NCCL_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
"""Set in every NCCL rank before the process group starts: NVLink multicast (NVLS) stays off."""


def init_rank(rank: int, world_size: int, backend: str) -> None:
    """Start this process's rank of the default group, ready for CUDA-graph capture.

    For ``nccl``: forces :data:`NCCL_ENV`, selects ``cuda:rank`` *before* the group starts (so the
    communicator binds to that device), starts it eagerly (``device_id``) and warms it up with
    one all-reduce, so a later ``torch.cuda.graph`` capture of collectives finds the communicator
    built. ``MASTER_ADDR`` / ``MASTER_PORT`` must already be in the environment.
    """
    if backend == "nccl":
        os.environ.update(NCCL_ENV)
        if rank >= torch.cuda.device_count():
            raise PlanError(
                f"NCCL rank {rank} needs GPU {rank}, but only {torch.cuda.device_count()} are "
                "visible; use world_size <= the GPU count or backend='gloo'"
            )
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        dist.init_process_group(backend, rank=rank, world_size=world_size, device_id=device)
        warm = torch.ones(1, device=device)
        dist.all_reduce(warm)
        torch.cuda.synchronize(device)
        if int(warm.item()) != world_size:
            raise PlanError(f"NCCL warm-up all-reduce gave {warm.item()}, not {world_size}")
    else:
        dist.init_process_group(backend, rank=rank, world_size=world_size)


def rank_device() -> torch.device:
    """The device of this rank's tensors: ``cuda:<rank>`` under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _worker(rank: int, world_size: int, backend: str, port: int, tasks: Any, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        init_rank(rank, world_size, backend)
    except BaseException:  # noqa: BLE001 - reported to the parent with its traceback
        results.put((rank, False, "process group start failed:\n" + traceback.format_exc()))
        return
    try:
        while True:
            try:
                task = tasks.get()
            except Exception:  # noqa: BLE001 - e.g. the task's module failed to import here
                results.put((rank, False, "could not unpickle the task:\n" + traceback.format_exc()))
                continue
            if task is None:
                break
            fn, args, kwargs = task
            try:
                value = fn(*args, **kwargs)
                # pickled here first: the queue pickles in a feeder thread, where a failure is
                # only printed and the parent would wait for an answer that never comes (plain
                # pickle: torch's ForkingPickler would move tensors to shared memory and leave
                # a file descriptor registered for a receiver that never comes)
                pickle.dumps(value)
                results.put((rank, True, value))
            except BaseException:  # noqa: BLE001 - reported to the parent with its traceback
                results.put((rank, False, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class RankPool:
    """``world_size`` processes in one process group, reused across calls.

    Use as a context manager; ``run(fn, *args)`` calls ``fn(*args)`` on every rank (``fn`` must be
    a module-level function) and returns the per-rank results in rank order. ``backend="nccl"``
    gives rank ``r`` the device ``cuda:r`` (see :func:`init_rank`; :func:`rank_device` inside a
    task). When a rank raises, the others get ``error_grace_s`` to answer; ranks that stay silent
    are taken to be blocked in a collective, the pool is stopped and every later ``run`` raises at
    once instead of hanging.
    """

    def __init__(self, world_size: int, backend: str = "gloo", timeout_s: float = 300.0,
                 error_grace_s: float = 60.0) -> None:
        if world_size < 1:
            raise ConfigError(f"world_size must be >= 1, got {world_size}")
        if backend not in ("gloo", "nccl"):
            raise ConfigError(f"RankPool backend must be 'gloo' or 'nccl', got {backend!r}")
        self.world_size = world_size
        self.backend = backend
        self.timeout_s = timeout_s
        self.error_grace_s = error_grace_s
        self._ctx = mp.get_context("spawn")
        self._tasks = [self._ctx.Queue() for _ in range(world_size)]
        self._results = self._ctx.Queue()
        self._procs: list[Any] = []
        self._broken: str | None = None

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
        """Run ``fn(*args, **kwargs)`` on every rank; raise if any rank raised or hung."""
        if self._broken is not None:
            raise RuntimeError(f"RankPool({self.world_size}, {self.backend!r}) is stopped: "
                               f"{self._broken}")
        for q in self._tasks:
            q.put((fn, args, kwargs))
        out: dict[int, Any] = {}
        errors: list[str] = []
        deadline = time.monotonic() + self.timeout_s
        answered: set[int] = set()
        while len(answered) < self.world_size:
            remaining = deadline - time.monotonic()
            try:
                rank, ok, value = self._results.get(timeout=max(0.0, min(remaining, 1.0)))
            except queue.Empty:
                silent = sorted(set(range(self.world_size)) - answered)
                dead = [(r, self._procs[r].exitcode) for r in silent
                        if self._procs[r].exitcode is not None]
                if dead:  # a rank process died (killed, os._exit, a crash): do not wait it out
                    why = (f"rank process(es) {', '.join(f'{r} (exit code {c})' for r, c in dead)}"
                           f" died running {getattr(fn, '__name__', fn)!r}")
                elif remaining > 1.0:
                    continue
                else:
                    why = (f"ranks {silent} did not answer {getattr(fn, '__name__', fn)!r} within "
                           f"{'the error grace period' if errors else f'{self.timeout_s:.0f} s'}")
                self._stop(why)
                raise RuntimeError("\n".join([why, *errors])) from None
            answered.add(rank)
            if ok:
                out[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
                deadline = min(deadline, time.monotonic() + self.error_grace_s)
        if errors:
            raise RuntimeError("\n".join(errors))
        return [out[r] for r in range(self.world_size)]

    def _stop(self, why: str) -> None:
        self._broken = why
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(timeout=10)

    def __exit__(self, *exc: object) -> None:
        if self._broken is None:
            for q in self._tasks:
                q.put(None)
        for p in self._procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)


def world_collectives() -> ProcessGroupCollectives:
    """The default process group (inside a :class:`RankPool` task or a ``torchrun`` process)."""
    if not dist.is_initialized():
        raise PlanError("torch.distributed is not initialised; start under torchrun or RankPool")
    return ProcessGroupCollectives()


def active_collectives() -> ProcessGroupCollectives | None:
    """The default process group when torch.distributed is initialised with more than one rank
    (the tensor-parallel group of ``load_decoder``), else ``None`` (one process)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return ProcessGroupCollectives()
    return None


def launched_ranks() -> tuple[int, int]:
    """``(processes, this one's rank)`` as ``torchrun`` set them (``WORLD_SIZE``, ``RANK``);
    ``(1, 0)`` for a process started without it.

    :raises ConfigError: when either is not an integer.
    """
    try:
        return int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    except ValueError as exc:
        raise ConfigError(f"WORLD_SIZE / RANK must be integers (set by torchrun): {exc}") from None


def init_from_environment(device: str = "auto") -> ProcessGroupCollectives | None:
    """Start the default process group from ``torchrun``'s environment (``WORLD_SIZE`` > 1,
    ``RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) unless it is started already; ``None`` when this
    is a single process.

    The backend is ``nccl`` when ``device`` asks for CUDA (``cuda``, ``cuda:N``, or ``auto`` with
    a GPU), else ``gloo``. Under NCCL rank ``r`` uses ``cuda:r`` (:func:`init_rank`; one host).
    """
    if dist.is_initialized():
        return active_collectives()
    world, rank = launched_ranks()
    if world <= 1:
        return None
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    init_rank(rank, world, "nccl" if cuda else "gloo")
    return ProcessGroupCollectives()


@contextlib.contextmanager
def torchrun_group(device: str = "auto") -> Iterator[ProcessGroupCollectives | None]:
    """:func:`init_from_environment` for the length of a command: yields the group (``None`` for
    one process) and destroys it at the end if it was started here."""
    started = not dist.is_initialized()
    collectives = init_from_environment(device)
    try:
        yield collectives
    finally:
        if started and dist.is_initialized():
            dist.destroy_process_group()


__all__ = ["NCCL_ENV", "ProcessGroupCollectives", "RankPool", "active_collectives",
           "init_from_environment", "init_rank", "launched_ranks", "rank_device", "torchrun_group",
           "world_collectives"]
