"""Small timing helpers shared by the benchmark scripts (not a test dependency).

* :func:`time_us`: mean microseconds per eager call, CUDA events on a GPU, wall clock on the CPU.
* :func:`graph_time_us`: the same call captured once in a CUDA graph and timed by replay
  (``None`` on the CPU or when the call cannot be captured).
* :func:`copy_bandwidth`: measured device copy bandwidth in bytes/s (read + write counted), the
  denominator of a memory floor; :func:`floor_us` turns bytes moved into that floor.
* :func:`machine_tag` / :func:`results_file`: name raw outputs ``<name>_<machine>_<date>.txt``.
* :class:`RunLog`: a run's printed lines and result rows, rewritten under ``--out`` as it goes.

Typical use::

    from _timing import copy_bandwidth, floor_us, graph_time_us, time_us
    bw = copy_bandwidth(device)
    t = time_us(lambda: op(x), device)
    print(t / floor_us(x.numel() * x.element_size(), bw))
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch


def _sync(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_us(fn: Callable[[], object], device: torch.device | str, iters: int = 50,
            warmup: int = 5) -> float:
    """Mean microseconds per call of ``fn`` (``warmup`` untimed calls first)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    if torch.device(device).type != "cuda":
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters * 1e6
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / iters * 1e3


def graph_time_us(fn: Callable[[], object], device: torch.device | str, iters: int = 50,
                  warmup: int = 3, calls_per_graph: int = 10) -> float | None:
    """Mean microseconds per call when ``calls_per_graph`` calls are captured in one CUDA graph.

    ``fn`` is warmed up eagerly on a side stream (compiles kernels, allocates) before capture,
    as CUDA-graph capture requires. Returns ``None`` on the CPU or if capture fails.
    """
    if torch.device(device).type != "cuda":
        return None
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls_per_graph):
                fn()
    except Exception:  # noqa: BLE001 - an uncapturable call is reported as "n/a"
        torch.cuda.synchronize(device)
        return None
    per_replay = time_us(graph.replay, device, iters=iters, warmup=2)
    return per_replay / calls_per_graph


def copy_bandwidth(device: torch.device | str, nbytes: int = 1 << 30, iters: int = 10) -> float:
    """Measured copy bandwidth in bytes/s: ``2 * nbytes`` (read + write) per ``dst.copy_(src)``.

    On the CPU a smaller buffer is used (64 MiB) so that smoke runs stay quick.
    """
    if torch.device(device).type != "cuda":
        nbytes = min(nbytes, 64 << 20)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    us = time_us(lambda: dst.copy_(src), device, iters=iters, warmup=2)
    return 2 * src.numel() * 4 / (us * 1e-6)


def floor_us(bytes_moved: float, bandwidth: float) -> float:
    """Microseconds to move ``bytes_moved`` at ``bandwidth`` bytes/s (the memory floor)."""
    return bytes_moved / bandwidth * 1e6


def machine_tag(device: torch.device | str) -> str:
    """A file-name-safe tag: the GPU name (or the CPU architecture) and the host name."""
    if torch.device(device).type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"cpu-{platform.machine()}"
    raw = f"{name}-{platform.node()}".lower()
    return re.sub(r"[^a-z0-9]+", "-", raw).strip("-")


def results_file(out_dir: str | Path, name: str, device: torch.device | str) -> Path:
    """``out_dir/<name>_<machine>_<UTC date-time>.txt`` (directories created)."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
    path = Path(out_dir) / f"{name}_{machine_tag(device)}_{stamp}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


class RunLog:
    """A benchmark run's lines and result rows. :meth:`say` prints a line and, with ``out``,
    rewrites ``out/<name>.txt`` (every line so far) and ``out/<name>.json`` (machine, date,
    commit, command and :attr:`rows`), so a run cut short keeps what it measured."""

    def __init__(self, out: Path | None, name: str, device: torch.device | str) -> None:
        self.out, self.name, self.machine = out, name, machine_tag(device)
        # a copy of the tree on another machine may carry a stale .git: the commit given to it wins
        self.commit = os.environ.get("DRAFTSMITH_COMMIT", "")[:7] or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
            cwd=Path(__file__).parent).stdout.strip()
        self.stamp = time.strftime("%Y-%m-%dT%H%MZ", time.gmtime())
        self.lines: list[str] = []
        self.rows: list[dict] = []

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.lines.append(text)
        if self.out is None:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"{self.name}.txt").write_text("\n".join(self.lines) + "\n")
        (self.out / f"{self.name}.json").write_text(json.dumps(
            {"machine": self.machine, "date": self.stamp, "commit": self.commit,
             "command": " ".join(sys.argv), "rows": self.rows}, indent=1))


__all__ = ["RunLog", "copy_bandwidth", "floor_us", "graph_time_us", "machine_tag", "results_file",
           "time_us"]
