"""Spec-tail, Markov-chain and target-attention kernels: eager vs fused, plain and in a CUDA graph,
against a floor.

For each op and shape it prints: eager time, eager in a CUDA graph, fused time, fused in a CUDA
graph, the floor (bytes the op must move / measured device copy bandwidth), and the ratios
``eager_graph / fused_graph`` (speed-up) and ``fused_graph / floor`` (distance to the floor).

    python benchmarks/tail_kernels.py                 # the full GPU table (one process, one GPU)
    python benchmarks/tail_kernels.py --ops markov --sweep   # also sweep Markov tile configurations
    python benchmarks/tail_kernels.py --ops markov --sweep --ranks 256 --batches 4,128   # targets only
    python benchmarks/tail_kernels.py --sweep --ranks 256 --batches 4,128 --out benchmarks/results
    python benchmarks/tail_kernels.py --smoke         # tiny shapes on the CPU (TRITON_INTERPRET=1)
    python benchmarks/tail_kernels.py --smoke --sweep # the sweep code path on the CPU

``--sweep`` times every ``STRICT_SWEEP`` entry (``(BLOCK_V, programs, num_warps)``; bit-identity
to the reference checked first, a mismatch is never ranked) at each strict_accept shape, and every
``MARKOV_SWEEP`` entry (``(BLOCK_G, BLOCK_S, BLOCK_R, num_warps, num_stages)``) that fits each
Markov batch, by patching the op's launch-size helper; the end of the run prints the best per
op/shape next to the default (carry a better pick into the helper by hand).
    python benchmarks/tail_kernels.py --out benchmarks/results   # also write the raw output there
    python benchmarks/tail_kernels.py --ops markov --steps  # also time a step launch a position
    python benchmarks/tail_kernels.py --ops markov --steps --vocab 49152 --ranks 16 --batches 1,8,32

The Markov chain is timed as the runtime runs it: ``markov_chain``, every position in one launch
where it takes the chain (up to 16 rows in bf16, a rank up to 128), else a step launch a
position. ``--steps`` also times it as one ``markov_step`` launch a position (odd positions
walking ``w2`` backwards), ``markov_chain``'s fallback, and checks the two give the same bits.

Every time is the median of ``--repeats`` windows (5 on the GPU) of ``--iters`` calls.

Targets (H200, V = 163840, r = 256, bf16 w2, fp32 logits, K = 6): at B = 4 the fused chain in a
graph within 1.3x of the floor; at B = 128 at least 3x faster than the eager chain in a graph and
within 1.6x of the floor. Spec-tail ops (strict_accept, prepare_placement, forced_accept,
store_context): fused at least 5x faster than the eager chain, both launched eagerly (column
``eag/fus``), in one launch (column ``launches``). ``strict_accept`` at B = 32 and 128 reads 19
and 78 MB of logits:
the eager chain there is itself within 3.7-3.9x and 1.35-1.4x of the floor (the H200 runs of
2026-11-30 and 12-01), so no kernel can be 5x faster than it, and those rows measure the
distance to the floor instead.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from draftsmith.kernels import cache_attention as ca  # noqa: E402
from draftsmith.kernels import context_store as cs  # noqa: E402
from draftsmith.kernels import forced_accept as fa  # noqa: E402
from draftsmith.kernels import markov_chain as mc  # noqa: E402
from draftsmith.kernels import paging as pg  # noqa: E402
from draftsmith.kernels import strict_accept as sa  # noqa: E402

LINES: list[str] = []


def emit(line: str = "") -> None:
    print(line, flush=True)
    LINES.append(line)


# ------------------------------------------------------------------------------------- timing


class Timer:
    """CUDA-event timing of eager calls and of CUDA-graph replays (or wall clock on the CPU).

    Each figure is the median over ``repeats`` windows of ``iters`` calls (mean per call within
    a window): the small spec-tail ops are bound by host time, and one window can catch a
    scheduling hiccup of the host that would decide a ratio on its own.
    """

    def __init__(self, device: str, iters: int, warmup: int, repeats: int = 1) -> None:
        self.device, self.iters, self.warmup = device, iters, warmup
        self.repeats = max(1, repeats)
        self.cuda = device == "cuda"

    def eager(self, fn: Callable[[], object]) -> float:
        """Median over the windows of the mean microseconds per call."""
        for _ in range(self.warmup):
            fn()
        return statistics.median(self._eager_window(fn) for _ in range(self.repeats))

    def _eager_window(self, fn: Callable[[], object]) -> float:
        if not self.cuda:
            t0 = time.perf_counter()
            for _ in range(self.iters):
                fn()
            return (time.perf_counter() - t0) / self.iters * 1e6
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(self.iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / self.iters * 1e3

    def graph(self, fn: Callable[[], object], replays_per_graph: int = 1) -> float | None:
        """Mean microseconds per call inside a captured graph; ``None`` when not capturable
        (e.g. a reference with data-dependent shapes) or on the CPU."""
        if not self.cuda:
            return None
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(replays_per_graph):
                    fn()
        except Exception as exc:  # noqa: BLE001 - a reference may not be capturable
            torch.cuda.synchronize()
            emit(f"    (graph capture failed: {type(exc).__name__}: {str(exc).splitlines()[0]})")
            return None
        for _ in range(self.warmup):
            graph.replay()
        windows = []
        for _ in range(self.repeats):
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(self.iters):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            windows.append(start.elapsed_time(end) / self.iters / replays_per_graph * 1e3)
        return statistics.median(windows)

    def copy_bandwidth(self) -> float:
        """Device copy bandwidth in bytes/s: (read + write bytes) / time of a large copy."""
        if not self.cuda:
            n = 1 << 24
            a, b = torch.empty(n, dtype=torch.uint8), torch.empty(n, dtype=torch.uint8)
            us = self.eager(lambda: b.copy_(a))
            return 2 * n / (us * 1e-6)
        n = 1 << 30
        a = torch.empty(n, dtype=torch.uint8, device="cuda")
        b = torch.empty_like(a)
        us = self.eager(lambda: b.copy_(a))
        return 2 * n / (us * 1e-6)


@dataclass
class Row:
    op: str
    shape: str
    eager: float
    eager_graph: float | None
    fused: float
    fused_graph: float | None
    floor: float
    launches: int | None = None

    def line(self) -> str:
        def f(x):
            return "     n/a" if x is None else f"{x:8.1f}"

        best_eager = self.eager_graph if self.eager_graph is not None else self.eager
        best_fused = self.fused_graph if self.fused_graph is not None else self.fused
        launches = "n/a" if self.launches is None else str(self.launches)
        return (
            f"{self.op:<18} {self.shape:<34} {f(self.eager)} {f(self.eager_graph)} "
            f"{f(self.fused)} {f(self.fused_graph)} {self.floor:8.1f} "
            f"{best_eager / best_fused:7.2f}x {best_fused / max(self.floor, 1e-9):7.2f}x "
            f"{self.eager / self.fused:7.2f}x {launches:>8}"
        )


HEADER = (
    f"{'op':<18} {'shape':<34} {'eager':>8} {'eager_g':>8} {'fused':>8} {'fused_g':>8} "
    f"{'floor':>8} {'speedup':>8} {'vs_floor':>8} {'eag/fus':>8} {'launches':>8}"
    "   (microseconds)"
)
LEGEND = (
    "# speedup = eager_g / fused_g (graphs where capturable); vs_floor = fused_g / floor;\n"
    "# eag/fus = eager / fused, both launched eagerly from Python (the spec-tail target: >= 5x);\n"
    "# launches = device kernels (incl. memcpy/memset) of one fused call, from torch.profiler"
)


def count_launches(fn: Callable[[], object]) -> int | None:
    """Device activities (kernels, memcpy, memset) of one call of ``fn``; ``None`` on the CPU
    or when the profiler cannot count them."""
    if not torch.cuda.is_available():
        return None
    try:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)
    except Exception:  # noqa: BLE001 - a profiler without CUPTI: report n/a
        return None


def measure(timer: Timer, op: str, shape: str, eager, fused, nbytes: float, bw: float,
            eager_capturable: bool = True, launched=None) -> Row:
    """Time one op; ``eager_capturable=False`` skips capturing a reference that syncs with the
    host (boolean-mask indexing), which would only invalidate the capture. ``launched``: the
    fused call alone, when ``fused`` also resets its inputs (launches are counted on it)."""
    eager_graph = timer.graph(eager) if eager_capturable else None
    counted = fused if launched is None else launched
    row = Row(op, shape, timer.eager(eager), eager_graph, timer.eager(fused),
              timer.graph(fused), nbytes / bw * 1e6,
              count_launches(counted) if timer.cuda else None)
    emit(row.line())
    return row


# ---------------------------------------------------------------------------------------- ops


def markov_chain(base: torch.Tensor, anchor: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                 one_launch: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy chain as ``runtime.markov.DraftChain`` runs it in fused mode
    (``mc.markov_chain``: every position in one launch); ``one_launch=False``: one
    ``markov_step`` launch a position, odd positions walking ``w2`` backwards (``markov_chain``'s
    fallback)."""
    if one_launch:
        return mc.markov_chain(base, anchor, w1, w2)
    rows, k, vocab = base.shape
    drafts = torch.empty((rows, k), dtype=torch.int64, device=base.device)
    corrected = torch.empty((rows, k, vocab), dtype=torch.float32, device=base.device)
    prev = anchor
    for j in range(k):
        _, prev = mc.markov_step(base[:, j], prev, w1, w2, 0, corrected[:, j],
                                 reverse=j % 2 == 1, out_idx=drafts[:, j])
    return drafts, corrected


class patched:
    """``with patched(module, "name", value):`` sets a module attribute for the block."""

    def __init__(self, module, name: str, value) -> None:
        self.module, self.name, self.value = module, name, value

    def __enter__(self) -> None:
        self.saved = getattr(self.module, self.name)
        setattr(self.module, self.name, self.value)

    def __exit__(self, *exc) -> None:
        setattr(self.module, self.name, self.saved)


def bench_markov(timer: Timer, bw: float, dev: str, smoke: bool, sweep: bool,
                 ranks: list[int] | None = None, batches: list[int] | None = None,
                 steps: bool = False, vocab: int | None = None) -> None:
    vocab = 1024 if smoke else (vocab or 163840)
    k = 2 if smoke else 6
    ranks = [16] if smoke else (ranks or [64, 128, 256])
    batches = [4] if smoke else (batches or [1, 4, 32, 128])
    wdtype = torch.float32 if smoke else torch.bfloat16
    g = torch.Generator().manual_seed(0)
    for rank in ranks:
        w1 = (torch.randn(vocab, rank, generator=g) * 0.1).to(dev, wdtype)
        w2 = (torch.randn(vocab, rank, generator=g) * 0.1).to(dev, wdtype)
        for rows in batches:
            base = torch.randn(rows, k, vocab, generator=g).to(dev)
            anchor = torch.randint(0, vocab, (rows,), generator=g).to(dev)
            esize = w2.element_size()
            nbytes = k * (vocab * rank * esize + 2 * rows * vocab * 4)  # w2, base, corrected
            shape = f"B={rows} K={k} V={vocab} r={rank} {str(wdtype)[6:]}"
            measure(timer, "markov_chain", shape,
                    lambda b=base, a=anchor, x=w1, y=w2: mc.markov_chain_reference(b, a, x, y),
                    lambda b=base, a=anchor, x=w1, y=w2: markov_chain(b, a, x, y),
                    nbytes, bw)
            if sweep:
                sweep_markov(timer, base, anchor, w1, w2, nbytes, bw, smoke)
            if steps:
                markov_launches(timer, base, anchor, w1, w2, nbytes, bw)


@dataclass
class SweepRun:
    op: str
    shape: str
    rows: int
    graph: float | None
    eager: float
    floor: float
    cfg: tuple
    default: bool
    note: str = ""

    @property
    def us(self) -> float:
        """The ranking time: in a graph (device time) where capturable, else eager."""
        return self.graph if self.graph is not None else self.eager


SWEEP_RESULTS: list[SweepRun] = []


def _sweep_line(run: SweepRun) -> str:
    graph = "     n/a" if run.graph is None else f"{run.graph:8.1f}"
    mark = "  (default)" if run.default else ""
    return (f"    sweep {run.cfg}: fused_g {graph} us  fused {run.eager:8.1f} us  "
            f"vs_floor {run.us / max(run.floor, 1e-9):5.2f}x{mark}{run.note}")


MARKOV_SWEEP: tuple[tuple[int, int, int, int, int], ...] = (
    (16, 128, 64, 4, 3), (32, 128, 32, 4, 3), (64, 128, 64, 8, 3),  # the defaults
    (64, 64, 32, 4, 3), (16, 128, 64, 4, 4), (16, 256, 32, 4, 3), (16, 64, 64, 4, 3),
    (32, 128, 32, 8, 3), (32, 128, 64, 8, 3), (64, 128, 32, 8, 3), (64, 256, 32, 8, 3),
    (128, 64, 64, 4, 3), (128, 128, 32, 8, 3), (128, 128, 64, 8, 3), (128, 256, 32, 8, 3),
)
"""``(BLOCK_G, BLOCK_S, BLOCK_R, num_warps, num_stages)`` tilings of ``markov_step`` to time."""

STRICT_SWEEP: tuple[tuple[int, int, int], ...] = (
    (2048, 528, 4), (1024, 1056, 8),  # the defaults (up to 32 rows, beyond)
    (1024, 1056, 4), (2048, 1056, 4), (2048, 2112, 4), (1024, 2112, 4), (1024, 4224, 4),
    (4096, 1056, 8), (4096, 2112, 8), (512, 2112, 2), (512, 4224, 2), (2048, 4224, 8),
)
"""``(max BLOCK_V, programs, num_warps)`` launch layouts of ``strict_accept`` to time."""


def strict_layout(rows: int, k1: int, vocab: int, cfg: tuple[int, int, int]) -> tuple:
    """``strict_accept._launch_sizes``'s tuple for the layout ``cfg`` (the same chunk split)."""
    max_block_v, programs, num_warps = cfg
    want_chunks = max(1, round(programs / max(rows, 1)))
    chunk = cdiv(cdiv(vocab, want_chunks), 64) * 64
    num_chunks = cdiv(vocab, chunk)
    block_v = max(16, min(max_block_v, triton_next_pow2(chunk)))
    return (block_v, chunk, num_chunks, triton_next_pow2(k1),
            max(2, triton_next_pow2(num_chunks)), num_warps)


def sweep_markov(timer: Timer, base, anchor, w1, w2, nbytes: float, bw: float,
                 smoke: bool = False) -> None:
    """Time every ``MARKOV_SWEEP`` tiling that fits the batch (``BLOCK_G`` at most twice the
    padded batch) in a graph; ``diff`` counts drafts that differ from the default tiling's (bf16
    near-ties may flip: tolerance-level parity, spec 9.20). The summary is printed at the end."""
    rows, k, vocab = base.shape
    shape = f"B={rows} r={w1.shape[1]}"
    floor = nbytes / bw * 1e6
    default = mc._markov_launch_sizes(rows, vocab, w1.shape[1], w1.dtype)
    want = markov_chain(base, anchor, w1, w2)[0]
    configs = MARKOV_SWEEP[:2] if smoke else MARKOV_SWEEP  # the CPU interpreter: two tilings
    for cfg in configs:
        if cfg[0] > max(16, 2 * triton_next_pow2(rows)):
            continue
        with patched(mc, "_markov_launch_sizes", lambda *_, cfg=cfg: cfg):
            def fused():
                return markov_chain(base, anchor, w1, w2)

            try:
                diff = int((fused()[0] != want).sum())
                graph = timer.graph(fused)
                eager = timer.eager(fused)
            except Exception as exc:  # noqa: BLE001 - a config may not fit the device
                emit(f"    sweep {cfg}: failed ({type(exc).__name__}: {str(exc)[:80]})")
                continue
        run = SweepRun("markov_chain", shape, rows, graph, eager, floor, cfg, cfg == default,
                       f"  diff={diff}" if diff else "")
        emit(_sweep_line(run))
        SWEEP_RESULTS.append(run)


def markov_launches(timer: Timer, base, anchor, w1, w2, nbytes: float, bw: float) -> None:
    """Time the chain in one launch and as a step launch a position (in a graph, with and
    without the corrected store); ``same`` checks the drafts and corrected rows against the
    steps' with ``torch.equal``."""
    rows, k, vocab = base.shape
    floor = nbytes / bw * 1e6
    want = markov_chain(base, anchor, w1, w2, one_launch=False)
    for store in (True, False):
        times = {}
        for one in (False, True):
            def fused(one=one, store=store):
                if store:
                    return markov_chain(base, anchor, w1, w2, one)
                if one:
                    return mc.markov_chain(base, anchor, w1, w2, store_corrected=False)
                return markov_chain(base, anchor, w1, w2, False)[0]

            got = fused()
            same = (torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) if store
                    else torch.equal(got[0] if one else got, want[0]))
            graph = timer.graph(fused)
            times[one] = graph if graph is not None else timer.eager(fused)
            emit(f"    launches B={rows} r={w1.shape[1]} V={vocab} store={store!s:<5} "
                 f"{'one launch' if one else 'a step a position':<17}: fused_g "
                 f"{times[one]:8.1f} us  vs_floor {times[one] / max(floor, 1e-9):5.2f}x  "
                 f"same={same}")
        emit(f"    launches B={rows} r={w1.shape[1]} V={vocab} store={store!s:<5} steps / one "
             f"launch: {times[False] / max(times[True], 1e-9):5.2f}x")


def sweep_strict(timer: Timer, logits, drafts, verify_len, nbytes: float, bw: float,
                 smoke: bool = False) -> None:
    """Time every ``STRICT_SWEEP`` layout (eager and in a graph); a layout whose outputs are not
    bit-identical to the reference is reported and never ranked."""
    g, k1, vocab = logits.shape
    shape = f"B={g} K+1={k1} V={vocab}"
    floor = nbytes / bw * 1e6
    want = sa.strict_accept_reference(logits, drafts, verify_len)
    default = sa._launch_sizes(g * k1, k1, vocab, logits.device)
    configs = STRICT_SWEEP[:2] if smoke else STRICT_SWEEP
    for cfg in configs:
        layout = strict_layout(g * k1, k1, vocab, cfg)
        with patched(sa, "_launch_sizes", lambda *_, layout=layout: layout):
            def fused():
                return sa.strict_accept(logits, drafts, verify_len)

            try:
                got = fused()
                again = fused()
                same = all(torch.equal(a, w) for a, w in zip((*got, *again), want * 2, strict=True))
                graph = timer.graph(fused)
                eager = timer.eager(fused)
            except Exception as exc:  # noqa: BLE001 - a config may not fit the device
                emit(f"    sweep {cfg}: failed ({type(exc).__name__}: {str(exc)[:80]})")
                continue
        note = f"  chunks={layout[2]} BLOCK_V={layout[0]} programs={g * k1 * layout[2]}"
        run = SweepRun("strict_accept", shape, g * k1, graph, eager, floor, cfg,
                       layout == default, note if same else note + "  MISMATCH")
        emit(_sweep_line(run))
        if same:
            SWEEP_RESULTS.append(run)


def print_sweep_summary() -> None:
    """Best configuration per op and shape, the 2nd best and the default."""
    if not SWEEP_RESULTS:
        return
    emit("")
    emit("# Sweep: best per op/shape: time (us, in a graph where capturable), vs_floor, config;"
         " then the 2nd best and the default")
    keys = list(dict.fromkeys((r.op, r.shape) for r in SWEEP_RESULTS))
    for op, shape in keys:
        runs = sorted((r for r in SWEEP_RESULTS if (r.op, r.shape) == (op, shape)),
                      key=lambda r: r.us)
        top = runs[0]
        line = (f"{op:<14} {shape:<26} {top.us:8.1f} {top.us / max(top.floor, 1e-9):5.2f}x "
                f"{top.cfg}")
        if len(runs) > 1:
            line += f"   | 2nd {runs[1].us:8.1f} {runs[1].cfg}"
        ref = next((r for r in runs if r.default), None)
        if ref is not None:
            line += f"   | default {ref.us:8.1f} ({ref.us / top.us:4.2f}x the best)"
        emit(line)


def triton_next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def bench_strict_accept(timer: Timer, bw: float, dev: str, smoke: bool,
                        sweep: bool = False) -> None:
    vocab = 111 if smoke else 151936
    g = torch.Generator().manual_seed(1)
    for rows in ([3] if smoke else [4, 32, 128]):
        logits = torch.randn(rows, 8, vocab, generator=g).to(dev)
        drafts = torch.argmax(logits[:, :7], dim=-1)
        verify_len = torch.full((rows,), 7, dtype=torch.int64, device=dev)
        measure(timer, "strict_accept", f"B={rows} K+1=8 V={vocab} fp32",
                partial(sa.strict_accept_reference, logits, drafts, verify_len),
                partial(sa.strict_accept, logits, drafts, verify_len),
                logits.numel() * 4, bw)
        if sweep:
            sweep_strict(timer, logits, drafts, verify_len, logits.numel() * 4, bw, smoke)


def page_table(num_slots: int, max_ctx: int, width: int, page: int, dev: str) -> torch.Tensor:
    """The private pool's static page table (spec 4.2), as ``DecoderBuffers`` builds it."""
    pages = -(-(max_ctx + width) // page)
    return torch.arange(num_slots * pages, dtype=torch.int64, device=dev).view(num_slots, pages)


def bench_paging(timer: Timer, bw: float, dev: str, smoke: bool) -> None:
    rows = 5 if smoke else 128
    k1, width, page, max_ctx = 8, 7, 32, 8192
    table = page_table(rows + 1, max_ctx, width, page, dev)
    g = torch.Generator().manual_seed(2)
    ctx = torch.randint(0, max_ctx // 2, (rows + 1,), generator=g).to(dev)
    slots = torch.arange(rows, device=dev)
    accepted = torch.randint(0, 1000, (rows, k1), generator=g).to(dev)
    n = torch.randint(1, k1 + 1, (rows,), generator=g).to(dev)
    args = (slots, accepted, n, table, max_ctx, width, page, rows)
    saved = ctx.clone()

    def eager():
        ctx.copy_(saved)
        return pg.prepare_placement_reference(ctx, *args)

    def fused():
        ctx.copy_(saved)
        return pg.prepare_placement(ctx, *args)

    nbytes = rows * (k1 * 8 * 8 + table.shape[1] * 16)
    measure(timer, "prepare_placement", f"G={rows} K+1={k1} W={width}", eager, fused, nbytes, bw,
            eager_capturable=False, launched=lambda: pg.prepare_placement(ctx, *args))

    pool = fa.forced_accept_pool(dev)
    counter = torch.zeros(1, dtype=torch.int64, device=dev)
    out = torch.empty(rows, dtype=torch.int64, device=dev)
    measure(timer, "forced_accept", f"G={rows} f=3.5 K=7",
            lambda: fa.forced_accept_reference(out, None, pool, counter, 3.5, 7),
            lambda: fa.forced_accept(out, None, pool, counter, 3.5, 7), rows * 16, bw)


def bench_store(timer: Timer, bw: float, dev: str, smoke: bool) -> None:
    rows, k1 = (3, 4) if smoke else (128, 8)
    shapes = [(2, 2, 2, 8)] if smoke else [(5, 2, 8, 128), (5, 1, 1, 576)]
    dtype = torch.float32 if smoke else torch.bfloat16
    g = torch.Generator().manual_seed(3)
    for layers, planes, heads, width in shapes:
        page, max_ctx = 32, 2048
        table = page_table(rows + 1, max_ctx, k1, page, dev)
        pool = torch.zeros(layers, table.numel(), planes, heads, page, width, dtype=dtype,
                           device=dev)
        ctx = torch.randint(0, max_ctx - k1, (rows + 1,), generator=g).to(dev)
        slots = torch.arange(rows, device=dev)
        n = torch.randint(1, k1 + 1, (rows,), generator=g).to(dev)
        p = pg.prepare_placement_reference(
            ctx, slots, torch.zeros(rows, k1, dtype=torch.int64, device=dev), n, table, max_ctx,
            k1, page, rows)
        entries = torch.randn(rows * k1, layers, planes, heads, width, generator=g).to(dev, dtype)
        nbytes = 2 * entries.numel() * entries.element_size()
        measure(timer, "store_context",
                f"G={rows} K+1={k1} L={layers} {planes}x{heads}x{width} {str(dtype)[6:]}",
                partial(cs.store_context_reference, pool, entries, p.dest_pages,
                        p.dest_offsets, p.write_mask),
                partial(cs.store_context, pool, entries, p.dest_pages, p.dest_offsets,
                        p.write_mask),
                nbytes, bw, eager_capturable=False)


def _sdpa_block(q, keys, values, rows, positions, columns, scale, q_per_row):
    """The best alternative a user has: torch's attention of each row's ``Q`` tokens over its
    slot's first ``columns`` cache columns under a causal position mask (the fused target loop's
    path before ``cache_attention``)."""
    g = rows.shape[0] // q_per_row
    nq, hd = q.shape[1], q.shape[2]
    nkv = keys.shape[1]
    group = nq // nkv
    slots = rows.view(g, q_per_row)[:, 0]
    k, v = keys[slots, :, :columns], values[slots, :, :columns]
    pos = positions.view(g, q_per_row)
    hidden = torch.arange(columns, device=q.device) > pos[:, :, None]
    mask = (hidden.to(q.dtype) * torch.finfo(q.dtype).min)[:, None]
    mask = mask.expand(g, group, q_per_row, columns).reshape(g, 1, group * q_per_row, columns)
    query = (q.view(g, q_per_row, nkv, group, hd).permute(0, 2, 3, 1, 4)
             .reshape(g, nkv, group * q_per_row, hd))
    return torch.nn.functional.scaled_dot_product_attention(query, k, v, attn_mask=mask,
                                                            scale=scale)


def bench_cache_attention(timer: Timer, bw: float, dev: str, smoke: bool) -> None:
    """The target's decoding attention (SmolLM2-135M heads: 9 query, 3 key/value, 64 wide):
    fused vs its reference, and vs torch's masked attention over the row's block (the
    alternative), at one token a row (plain decoding) and eight (a verification of K = 7);
    at eight, also a row's tokens sharing a program (``tokens_per_row``, what the target
    passes) against one program a token (``cache_attn/shared``). The floor reads each row's
    keys and values up to its tokens once."""
    nq, nkv, hd = (4, 2, 16) if smoke else (9, 3, 64)
    cases = [(2, 1, 40, 64), (2, 3, 40, 64)] if smoke else [
        (g, q, ctx, 1024) for g in (8, 32, 128) for q in (1, 8) for ctx in (200, 700)]
    dtypes = [torch.float32] if smoke else [torch.bfloat16, torch.float32]
    gen = torch.Generator().manual_seed(5)
    for dtype in dtypes:
        for g, q_per_row, ctx, length in cases:
            keys = torch.randn(g, nkv, length, hd, generator=gen).to(dev, dtype)
            values = torch.randn(g, nkv, length, hd, generator=gen).to(dev, dtype)
            q = torch.randn(g * q_per_row, nq, hd, generator=gen).to(dev, dtype)
            rows = torch.arange(g, device=dev).repeat_interleave(q_per_row)
            positions = (ctx + torch.arange(q_per_row, device=dev)).repeat(g)
            columns = min(length, 1 << (ctx + q_per_row - 1).bit_length())
            scale = hd ** -0.5
            args = (q, keys, values, rows, positions, columns, scale)
            nbytes = 2 * g * nkv * (ctx + q_per_row) * hd * dtype.itemsize
            shape = f"G={g} Q={q_per_row} ctx={ctx} W={columns} {str(dtype)[6:]}"
            fused = partial(ca.cache_attention, *args, tokens_per_row=q_per_row)
            measure(timer, "cache_attn", shape,
                    partial(ca.cache_attention_reference, *args), fused, nbytes, bw)
            measure(timer, "cache_attn/sdpa", shape,
                    partial(_sdpa_block, *args, q_per_row), fused, nbytes, bw)
            if q_per_row > 1:
                measure(timer, "cache_attn/shared", shape,
                        partial(ca.cache_attention, *args), fused, nbytes, bw)


def host_breakdown(dev: str) -> None:
    """Host microseconds per call (no synchronisation in the loop) of the spec-tail launchers
    against their eager chains: what an op costs when it is not replayed in a graph."""
    emit("")
    emit("# host time per call (us, perf_counter over 2000 calls, no sync in the loop)")

    def host(label: str, fn: Callable[[], object], n: int = 2000) -> None:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        emit(f"  {label:<46} {(t1 - t0) / n * 1e6:8.2f}")

    logits = torch.randn(4, 8, 151936, device=dev)
    drafts = torch.randint(0, 151936, (4, 7), device=dev)
    host("strict_accept G=4 (fused)", lambda: sa.strict_accept(logits, drafts))
    host("strict_accept_reference G=4 (eager chain)",
         lambda: sa.strict_accept_reference(logits, drafts))
    pool = fa.forced_accept_pool(dev)
    counter = torch.zeros(1, dtype=torch.int64, device=dev)
    out = torch.empty(128, dtype=torch.int64, device=dev)
    host("forced_accept G=128 (fused)",
         lambda: fa.forced_accept(out, None, pool, counter, 3.5, 7))
    host("forced_accept_reference G=128 (eager chain)",
         lambda: fa.forced_accept_reference(out, None, pool, counter, 3.5, 7))


OPS = {
    "attention": bench_cache_attention,
    "markov": bench_markov,
    "strict": bench_strict_accept,
    "paging": bench_paging,
    "store": bench_store,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    parser.add_argument("--out", default=None, help="directory for the raw output file")
    parser.add_argument("--ops", default=",".join(OPS), help=f"comma list of {sorted(OPS)}")
    parser.add_argument("--sweep", action="store_true",
                        help="sweep the strict_accept and Markov launch configurations")
    parser.add_argument("--iters", type=int, default=None, help="calls per timing window")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timing windows per figure; the median is reported (GPU default 5)")
    parser.add_argument("--ranks", default=None, help="Markov ranks, comma list (64,128,256)")
    parser.add_argument("--batches", default=None, help="Markov batches, comma list (1,4,32,128)")
    parser.add_argument("--steps", action="store_true",
                        help="also time the Markov chain as a step launch a position")
    parser.add_argument("--vocab", type=int, default=None,
                        help="Markov vocabulary (default 163840)")
    parser.add_argument("--host", action="store_true",
                        help="also print the host time per call of the spec-tail launch paths")
    args = parser.parse_args(argv)

    dev = "cpu" if args.smoke or not torch.cuda.is_available() else "cuda"
    if dev == "cpu" and not args.smoke:
        parser.error("no CUDA device; use --smoke for the CPU run")
    iters = args.iters or (2 if args.smoke else 50)
    repeats = args.repeats or (1 if args.smoke else 5)
    timer = Timer(dev, iters=iters, warmup=1 if args.smoke else 5, repeats=repeats)
    machine = torch.cuda.get_device_name() if dev == "cuda" else platform.processor() or "cpu"
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H%M%SZ")
    bw = timer.copy_bandwidth()
    emit(f"# draftsmith kernels benchmark on {machine} ({platform.node()}), {stamp}")
    emit(f"# torch {torch.__version__}; copy bandwidth {bw / 1e9:.1f} GB/s (read+write); "
         f"each time: median of {repeats} windows of {iters} calls")
    emit(LEGEND)
    emit(HEADER)
    for name in args.ops.split(","):
        if name not in OPS:
            parser.error(f"unknown op {name!r}; choose from {sorted(OPS)}")
        with torch.no_grad():
            if name == "markov":
                bench_markov(timer, bw, dev, args.smoke, args.sweep,
                             [int(x) for x in args.ranks.split(",")] if args.ranks else None,
                             [int(x) for x in args.batches.split(",")] if args.batches else None,
                             args.steps, args.vocab)
            elif name == "strict":
                bench_strict_accept(timer, bw, dev, args.smoke, args.sweep)
            else:
                OPS[name](timer, bw, dev, args.smoke)
    print_sweep_summary()
    if args.host and dev == "cuda":
        host_breakdown(dev)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        slug = "".join(c if c.isalnum() else "-" for c in machine).strip("-").lower()
        path = os.path.join(args.out, f"kernels_{slug}_{stamp}.txt")
        with open(path, "w") as fh:
            fh.write("\n".join(LINES) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
