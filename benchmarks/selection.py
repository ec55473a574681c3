"""Token-selection kernels: per-shard pair reductions vs torch, against the memory floor.

One process, one GPU. For each logits dtype (bf16, fp32) and batch ``B`` in {1, 4, 32, 128, 256}
at ``V = 163840`` it prints, in microseconds and as ratios:

* ``torch.argmax`` (eager and in a CUDA graph);
* ``argmax_pair`` (spec 5.2, eager and in a CUDA graph);
* the memory floor: bytes read (``B * V * itemsize``) / measured device copy bandwidth;
* the launch floor: an empty Triton kernel replayed in a CUDA graph (``empty_gr``) and launched
  eagerly (``empty``); ``host``: CPU microseconds per ``argmax_pair`` call (launcher overhead);
* ``gumbel_pair`` (temperature sampling by a keyed two-level Gumbel-max: group log-sum-exp plus
  one draw per 16-token group, then a draw inside the winning group; eager and in a graph) vs its
  eager reference ``gumbel_pair_reference`` and ``torch.multinomial(softmax(x / T))``.

Targets (H200): ``argmax_pair`` >= 4x faster than ``torch.argmax`` at ``B <= 32``, and within
1.5x of the floor at ``B >= 128``; ``gumbel_pair`` in a graph within 3x of the floor at
``B = 32, 128, 256``. ``pair/launch`` shows how far a small-B pair is from one graph-replayed
empty launch (the best any one-launch kernel can do).

    python benchmarks/selection.py                          # the GPU tables
    python benchmarks/selection.py --sweep                  # + argmax_pair launch-layout sweep
    python benchmarks/selection.py --sweep --no-table       # only the sweep
    python benchmarks/selection.py --sweep --no-table --sweep-grid small  # B <= 32 variants only

``--sweep`` first prints the B = 1 probes (empty kernel / load-only / load + counter atomic over
P programs: where the latency goes), then compiles the grid in ``--jobs`` processes, then times
every layout (bit-checked before and after its graph replays, by patching
``argmax_pair._launch_sizes`` and the programs per SM) and prints the best per case.
    python benchmarks/selection.py --out benchmarks/results # also write the raw output there
    python benchmarks/selection.py --smoke                  # tiny sizes on the CPU (interpreter)
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

if "--smoke" in sys.argv and not os.environ.get("CUDA_VISIBLE_DEVICES", "x") == "":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from _timing import (  # noqa: E402
    copy_bandwidth,
    floor_us,
    graph_time_us,
    results_file,
    time_us,
)

from draftsmith.kernels import _pair  # noqa: E402
from draftsmith.kernels import argmax_pair as ap  # noqa: E402
from draftsmith.kernels.argmax_pair import (  # noqa: E402
    EXCHANGE_COLUMNS,
    argmax_pair,
    argmax_pair_reference,
)
from draftsmith.kernels.gumbel_pair import gumbel_pair, gumbel_pair_reference  # noqa: E402

LINES: list[str] = []
SINK: list = []  # the open results file, written line by line (a killed run keeps its lines)


@triton.jit
def _empty_kernel(x_ptr, n):
    pass


@triton.jit
def _probe_kernel(x_ptr, out_ptr, count_ptr, S, BLOCK: tl.constexpr, ATOMIC: tl.constexpr):
    """Diagnostic (wrong answers on purpose): program ``p`` loads columns ``p * BLOCK ..`` of one
    row and stores their max; with ``ATOMIC`` it also counts itself on ``count_ptr`` (acq_rel),
    and the last program resets the counter: the chain of ``argmax_pair`` without the merge."""
    pid = tl.program_id(0)
    cols = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + cols, mask=cols < S, other=float("-inf")).to(tl.float32)
    tl.store(out_ptr + pid, tl.max(x, 0))
    if ATOMIC:
        tl.debug_barrier()
        done = tl.atomic_add(count_ptr, 1, sem="acq_rel")
        if done == tl.num_programs(0) - 1:
            tl.store(count_ptr, 0)


def host_us(fn, iters: int) -> float:
    """CPU microseconds per call (no synchronisation inside the loop)."""
    fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t = (time.perf_counter() - t0) / iters * 1e6
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return t


def emit(line: str = "") -> None:
    print(line, flush=True)
    LINES.append(line)
    for f in SINK:
        f.write(line + "\n")
        f.flush()


def fmt(x: float | None, width: int = 9, digits: int = 1) -> str:
    return f"{'n/a':>{width}}" if x is None else f"{x:>{width}.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    return f"{'n/a':>7}" if a is None or b is None or b == 0 else f"{a / b:>6.2f}x"


def bench_one(batch: int, vocab: int, dtype: torch.dtype, device: torch.device, bandwidth: float,
              iters: int) -> tuple[str, str]:
    g = torch.Generator(device=device).manual_seed(batch)
    x = torch.randn(batch, vocab, device=device, generator=g).mul_(3).to(dtype)
    out = torch.zeros(batch, EXCHANGE_COLUMNS, device=device)
    temps = torch.full((batch,), 0.8, device=device)
    seeds = torch.arange(batch, device=device, dtype=torch.int64)
    offsets = torch.zeros(batch, device=device, dtype=torch.int64)
    floor = floor_us(batch * vocab * x.element_size(), bandwidth)

    def t_argmax():
        return torch.argmax(x, dim=-1)

    def pair():
        return argmax_pair(x, 0, out, 0)

    def gumbel():
        return gumbel_pair(x, temps, seeds, offsets, 0, 0, out, 0)

    def gumbel_ref():
        return gumbel_pair_reference(x, temps, seeds, offsets, 0, 0, out, 0)

    def multinomial():
        return torch.multinomial(torch.softmax(x.float() / 0.8, dim=-1), 1)

    def empty():
        _empty_kernel[(1,)](out, 0)

    kw = dict(iters=iters, warmup=max(2, iters // 10))
    ta, tag = time_us(t_argmax, device, **kw), graph_time_us(t_argmax, device, **kw)
    tp, tpg = time_us(pair, device, **kw), graph_time_us(pair, device, **kw)
    te, teg = time_us(empty, device, **kw), graph_time_us(empty, device, **kw)
    th = host_us(pair, iters)
    tg, tgg = time_us(gumbel, device, **kw), graph_time_us(gumbel, device, **kw)
    tr = time_us(gumbel_ref, device, iters=max(2, iters // 10), warmup=1)
    tm = time_us(multinomial, device, **kw)
    name = str(dtype).removeprefix("torch.")
    best_pair = tpg if tpg is not None else tp
    best_torch = tag if tag is not None else ta
    best_gumbel = tgg if tgg is not None else tg
    best_empty = teg if teg is not None else te
    argmax_row = (
        f"{name:>8} {batch:>4} | {fmt(ta)} {fmt(tag)} | {fmt(tp)} {fmt(tpg)} | {fmt(floor, 9, 2)}"
        f" | {ratio(best_torch, best_pair)} {ratio(best_pair, floor)}"
        f" | {fmt(te)} {fmt(teg)} {fmt(th)} | {ratio(best_pair, best_empty)}"
    )
    gumbel_row = (
        f"{name:>8} {batch:>4} | {fmt(tg)} {fmt(tgg)} | {fmt(tr)} {fmt(tm)}"
        f" | {fmt(floor, 9, 2)} | {ratio(tr, best_gumbel)} {ratio(tm, best_gumbel)}"
        f" {ratio(best_gumbel, floor)}"
    )
    return argmax_row, gumbel_row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU interpreter")
    parser.add_argument("--out", default=None, help="directory for the raw output file")
    parser.add_argument("--vocab", type=int, default=None, help="override V")
    parser.add_argument("--batches", default=None, help="comma-separated B values")
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--sweep", action="store_true",
                        help="also time argmax_pair over a grid of launch layouts")
    parser.add_argument("--gumbel-sweep", action="store_true",
                        help="also time gumbel_pair over tile sizes, warps and programs per SM")
    parser.add_argument("--gumbel-grid", choices=("all", "wide"), default="all")
    parser.add_argument("--no-table", action="store_true", help="skip the main tables")
    parser.add_argument("--sweep-iters", type=int, default=None,
                        help="graph replays per sweep point (default 30)")
    parser.add_argument("--sweep-grid", choices=("all", "base", "small", "deep"),
                        default="all",
                        help="sweep layouts: base = 4-16 KiB in flight per trip, small = small "
                             "programs / few warps (B <= 32 ideas), deep = 8 tiles in flight per "
                             "trip, all = every one")
    parser.add_argument("--jobs", type=int, default=None,
                        help="processes that compile the sweep's kernels into Triton's cache "
                             "before timing (default: min(16, CPUs) on a GPU, 0 = compile inline)")
    args = parser.parse_args(argv)

    if args.smoke:
        device = torch.device("cpu")
        vocab, batches, iters = args.vocab or 4096, [1, 4], args.iters or 2
    else:
        if not torch.cuda.is_available():
            parser.error("needs a CUDA GPU; use --smoke for a CPU check")
        device = torch.device("cuda")
        vocab, batches, iters = args.vocab or 163840, [1, 4, 32, 128, 256], args.iters or 100
    if args.batches:
        batches = [int(b) for b in args.batches.split(",")]

    if args.out:
        path = results_file(args.out, "selection" + ("-smoke" if args.smoke else ""), device)
        SINK.append(path.open("w", encoding="utf-8"))
    bandwidth = copy_bandwidth(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)"
    emit(f"# selection benchmark: {gpu}, V = {vocab}, torch {torch.__version__}")
    emit(f"# measured copy bandwidth: {bandwidth / 1e9:.1f} GB/s (read + write); times in us")
    emit("# floor = B * V * itemsize / bandwidth; graph columns: per call inside a CUDA graph")
    if not args.no_table:
        main_tables(batches, vocab, device, bandwidth, iters)
    if args.sweep:
        probes(vocab, device, args.sweep_iters or (2 if args.smoke else 30), args.smoke)
        jobs = args.jobs if args.jobs is not None else (0 if args.smoke else
                                                          min(16, os.cpu_count() or 1))
        sweep(batches, vocab, device, bandwidth, args.sweep_iters or (2 if args.smoke else 30),
              args.sweep_grid, jobs)
    if args.gumbel_sweep:
        gumbel_sweep(batches, vocab, device, bandwidth,
                     args.sweep_iters or (2 if args.smoke else 30), args.gumbel_grid)
    if args.out:
        emit(f"# wrote {path}")
        SINK.pop().close()
    return 0


def main_tables(batches: list[int], vocab: int, device: torch.device, bandwidth: float,
                iters: int) -> None:
    emit()
    emit("argmax:     dtype    B |    torch  torch_gr |     pair   pair_gr |     floor |"
         " torch/pair pair/floor |     empty  empty_gr      host | pair/launch")
    gumbel_rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for batch in batches:
            a_row, g_row = bench_one(batch, vocab, dtype, device, bandwidth, iters)
            emit("         " + a_row)
            gumbel_rows.append(g_row)
    emit()
    emit("gumbel:     dtype    B |   gumbel gumbel_gr |      ref  multin. |     floor |"
         " ref/gumbel multin/gumbel gumbel/floor   (ratios: best of eager / graph)")
    for row in gumbel_rows:
        emit("         " + row)


SWEEP_SHAPES = [(2048, 2), (4096, 1), (4096, 2), (4096, 4), (8192, 1), (8192, 2)]
"""``(block_bytes, unroll)`` pairs of the base sweep: 4-16 KiB in flight per program and loop
trip."""
SMALL_SHAPES = [(512, 1), (1024, 1), (1024, 2), (2048, 1)]
"""``(block_bytes, unroll)`` of the small-program variants: 0.5-2 KiB per program, one trip, so
that one row spreads over every SM and each program issues all its loads at once."""


def sweep_grid(smoke: bool, which: str = "all") -> list[tuple[int, int, int, bool, int]]:
    """The launch layouts ``(block_bytes, unroll, num_warps, tree, programs_per_sm)`` that
    ``--sweep`` times:

    * ``base``: 4-16 KiB in flight per trip, tree lane reduction, 4-16 programs per SM;
    * ``small``: B <= 32 ideas: 8-32 programs per SM of 0.5-2 KiB, 1-2 warps;
    * ``deep``: 8 tiles (8-32 KiB) in flight per loop trip;
    * ``all``: every group, without duplicates (the current picks first).
    """
    if smoke:
        return [(4096, 2, 4, False, 4), (2048, 4, 4, True, 2), (512, 1, 1, False, 8)]
    current = [(1024, 8, 4, True, 4), (2048, 8, 4, True, 4), (2048, 8, 8, True, 4)]
    base = [(bb, un, nw, True, pps)
            for pps, (bb, un), nw in itertools.product((4, 6, 8, 16), SWEEP_SHAPES, (4, 8))]
    small = [(bb, un, nw, True, pps)
             for pps, (bb, un), nw in itertools.product((8, 16, 32), SMALL_SHAPES, (1, 2))]
    deep = [(bb, 8, nw, True, pps)
            for pps, bb, nw in itertools.product((4, 8), (1024, 2048, 4096), (4, 8))]
    parts = {"base": base, "small": small, "deep": deep}
    chosen = list(parts.values()) if which == "all" else [parts[which]]
    return list(dict.fromkeys(current + [t for part in chosen for t in part]))


class use_layout:
    """``with use_layout(cfg):`` pins argmax_pair's launch layout (``None``: the defaults)."""

    def __init__(self, cfg: tuple[int, int, int, bool, int] | None) -> None:
        self.cfg = cfg

    def __enter__(self) -> None:
        self.saved = (ap._launch_sizes, _pair.PROGRAMS_PER_SM)
        if self.cfg is not None:
            block_bytes, unroll, num_warps, tree, per_sm = self.cfg

            def sizes(rows, width, itemsize, device):
                block = min(max(16, block_bytes // itemsize),
                            max(16, triton.next_power_of_2(width)))
                return block, min(unroll, triton.next_power_of_2(triton.cdiv(width, block))), \
                    num_warps, tree

            ap._launch_sizes, _pair.PROGRAMS_PER_SM = sizes, per_sm

    def __exit__(self, *exc) -> None:
        ap._launch_sizes, _pair.PROGRAMS_PER_SM = self.saved


GUMBEL_GRID = [(groups, warps, per_sm) for groups in (64, 128, 256) for warps in (4, 8)
               for per_sm in (4, 8, 16)] + [
    (256, 2, 8), (256, 2, 16), (512, 4, 4), (512, 4, 8), (512, 8, 4), (512, 8, 8), (128, 2, 8)]
"""``(GROUPS, num_warps, programs_per_sm)`` that ``--gumbel-sweep`` times (a tile holds
``GROUPS * 16`` tokens); ``--gumbel-grid wide`` times only the last seven (fewer warps or
wider tiles) beside the default."""


def gumbel_sweep(batches: list[int], vocab: int, device: torch.device, bandwidth: float,
                 iters: int, which: str = "all") -> None:
    """Time ``gumbel_pair`` in a CUDA graph per launch layout of :data:`GUMBEL_GRID` (patching
    ``gumbel_pair._launch_sizes`` and its programs per SM), each checked bit for bit against
    the default layout's pair (the draw does not depend on the tiling). Prints us per call and
    the ratio to the memory floor; the best layout per case last."""
    from draftsmith.kernels import gumbel_pair as gp

    grid = [(64, 4, 8), (16, 4, 8)] if device.type != "cuda" else (
        GUMBEL_GRID if which == "all" else [(256, 4, 8)] + GUMBEL_GRID[-7:])
    timer = graph_time_us if device.type == "cuda" else time_us
    emit()
    emit("# gumbel sweep: gumbel_pair in a CUDA graph, us per call (x floor); layout = "
         "(GROUPS, num_warps, programs per SM); '!' = pair differs from the default layout's")
    best: dict[tuple, tuple[float, tuple]] = {}
    for dtype in (torch.bfloat16, torch.float32):
        for b in batches:
            g = torch.Generator(device=device).manual_seed(b)
            x = torch.randn(b, vocab, device=device, generator=g).mul_(3).to(dtype)
            temps = torch.full((b,), 0.8, device=device)
            seeds = torch.arange(b, device=device, dtype=torch.int64)
            offsets = torch.zeros(b, device=device, dtype=torch.int64)
            ref = gumbel_pair(x, temps, seeds, offsets, 0, 0,
                              torch.zeros(b, EXCHANGE_COLUMNS, device=device), 0).clone()
            floor = floor_us(b * vocab * x.element_size(), bandwidth)
            cells = []
            for cfg in grid:
                saved = (gp._launch_sizes, gp.PROGRAMS_PER_SM)
                gp._launch_sizes = lambda *_a, cfg=cfg: cfg[:2]
                gp.PROGRAMS_PER_SM = cfg[2]
                try:
                    out = torch.zeros(b, EXCHANGE_COLUMNS, device=device)
                    gumbel_pair(x, temps, seeds, offsets, 0, 0, out, 0)
                    same = torch.equal(out.view(torch.int32), ref.view(torch.int32))
                    args = (x, temps, seeds, offsets, 0, 0, out, 0)
                    t = timer(lambda args=args: gumbel_pair(*args), device, iters=iters,
                              warmup=2)
                except Exception as exc:  # noqa: BLE001 - a layout that fails is reported
                    emit(f"# {cfg} {dtype} B={b}: {type(exc).__name__}: {exc}")
                    continue
                finally:
                    gp._launch_sizes, gp.PROGRAMS_PER_SM = saved
                cells.append(f"{cfg}: {t:.2f} ({t / floor:.2f}x){'' if same else ' !'}")
                key = (str(dtype).removeprefix("torch."), b)
                if same and (key not in best or t < best[key][0]):
                    best[key] = (t, cfg)
            emit(f"{str(dtype).removeprefix('torch.'):>8} B={b:<4} floor {floor:.2f} | "
                 + "  ".join(cells))
    for (name, b), (t, cfg) in best.items():
        floor = floor_us(b * vocab * (2 if name == "bfloat16" else 4), bandwidth)
        emit(f"# best {name} B={b}: {cfg} {t:.2f} us, {t / floor:.2f}x floor")


def _state_is_clean(device: torch.device) -> bool:
    """Every row counter is 0 (ready for a replay)."""
    bufs = ap._SCRATCH._by_device.get(device)
    return bufs is None or not bool(bufs[0].any())


def probes(vocab: int, device: torch.device, iters: int, smoke: bool) -> None:
    """Where the B = 1 time goes: graph-replayed microseconds of an empty kernel over ``P``
    programs, of ``P`` programs each loading ``V / P`` columns of one bf16 row and storing their
    max (``load``), and of the same plus the per-row counter atomic (``+atomic``). A full
    ``argmax_pair`` adds the merge to ``+atomic``; ``load - empty`` is the load and lane-reduce
    round trip, ``+atomic - load`` the counter round trip."""
    timer = graph_time_us if device.type == "cuda" else time_us
    x = torch.randn(1, vocab, device=device).to(torch.bfloat16)
    count = torch.zeros(1, dtype=torch.int32, device=device)
    emit()
    emit(f"# probes: one bf16 row of V = {vocab}, P programs of BLOCK columns, us per call"
         " (diagnostic kernels: no merge, not bit-checked)")
    emit(f"{'P':>6} {'BLOCK':>6} {'nw':>3} | {'empty':>8} {'load':>8} {'+atomic':>8}")
    shapes = [(2048, 1), (1024, 1)] if smoke else [
        (8192, 8), (8192, 4), (4096, 4), (2048, 4), (2048, 2), (1024, 2), (1024, 1), (512, 1),
        (256, 1)]
    for block, nw in shapes:
        p = triton.cdiv(vocab, block)
        out = torch.empty(p, device=device)
        cells = [timer(lambda p=p, nw=nw, out=out: _empty_kernel[(p,)](out, 0, num_warps=nw),
                       device, iters=iters, warmup=2)]
        for atomic in (False, True):
            cells.append(timer(
                lambda p=p, out=out, block=block, nw=nw, atomic=atomic: _probe_kernel[(p,)](
                    x, out, count, vocab, BLOCK=block, ATOMIC=atomic, num_warps=nw),
                device, iters=iters, warmup=2))
        emit(f"{p:>6} {block:>6} {nw:>3} | " + " ".join(fmt(c, 8, 2) for c in cells))
    if bool(count.any()):
        emit("# probes: the counter was left non-zero (atomic probe broken)")


def _compile_worker(job: tuple) -> int:
    """Pool worker of :func:`precompile`: run ``argmax_pair`` once per ``(layout, dtype, B)``
    (garbage inputs) so that Triton writes every specialization to its on-disk cache."""
    layouts, cases, vocab, device = job
    done = 0
    for cfg in layouts:
        try:
            with use_layout(cfg):
                for dtype, b in cases:
                    x = torch.zeros(b, vocab, device=device, dtype=dtype)
                    argmax_pair(x, 0, torch.zeros(b, EXCHANGE_COLUMNS, device=device), 0)
            if device.type == "cuda":
                torch.cuda.synchronize()
            done += 1
        except Exception:  # noqa: BLE001 - the timing process reports it
            pass
    return done


def precompile(grid: list[tuple], cases: list, vocab: int, jobs: int,
               device: torch.device) -> None:
    """Compile the sweep's kernels in ``jobs`` spawned processes (one GPU context each) into
    Triton's on-disk cache; the timing process then loads them instead of compiling ~2 per
    configuration one after the other. Any failure only costs the time: the sweep compiles
    what is missing itself. (On the CPU it only exercises the pool: nothing is cached.)"""
    import multiprocessing

    t0 = time.perf_counter()
    chunks = [grid[i::jobs] for i in range(jobs)]
    work = [(c, cases, vocab, device) for c in chunks if c]
    try:
        with multiprocessing.get_context("spawn").Pool(len(work)) as pool:
            done = sum(pool.map(_compile_worker, work))
        emit(f"# precompiled {done} configurations in {len(work)} processes,"
             f" {time.perf_counter() - t0:.1f} s")
    except Exception as exc:  # noqa: BLE001 - the sweep compiles inline instead
        emit(f"# precompile failed ({type(exc).__name__}: {exc}); compiling inline")


def _time_checked(i: int, tuning: tuple, case: tuple, dtype: torch.dtype, b: int,
                  device: torch.device, timer, iters: int, bad: list[str]) -> float | None:
    """One sweep point: bit check, graph-replay timing, bit check and workspace check after the
    replays (problems appended to ``bad`` as ``"cfg <i> ..."``); the time, or ``None``."""
    x, ref = case
    out = torch.full((b, EXCHANGE_COLUMNS), float("nan"), device=device)
    argmax_pair(x, 0, out, 0)
    if not torch.equal(out.view(torch.int32), ref.view(torch.int32)):
        bad.append(f"cfg {i} {tuning} {dtype} B={b}")
    t = timer(lambda: argmax_pair(x, 0, out, 0), device, iters=iters, warmup=2)
    out.fill_(float("nan"))  # the replays must have left a clean state
    argmax_pair(x, 0, out, 0)
    if not torch.equal(out.view(torch.int32), ref.view(torch.int32)):
        bad.append(f"cfg {i} {tuning} {dtype} B={b} (after graph replays)")
    if not _state_is_clean(device):
        bad.append(f"cfg {i} {tuning} {dtype} B={b}: workspace left dirty")
    return t


def sweep(batches: list[int], vocab: int, device: torch.device, bandwidth: float,
          iters: int, which: str = "all", jobs: int = 0) -> None:
    """Time ``argmax_pair`` in a CUDA graph for every :func:`sweep_grid` layout.

    Prints one row per layout (us per call), then per case the best layout and its target
    check, and the layout with the best mean time relative to each case's best. Every point is
    checked bit for bit against the reference before and after its timed graph replays, and the
    row counters must be clean. A better pick goes into ``argmax_pair._launch_sizes`` by hand.
    """
    t_start = time.perf_counter()
    grid = sweep_grid(device.type != "cuda", which)
    cases = [(dtype, b) for dtype in (torch.bfloat16, torch.float32) for b in batches]
    timer = graph_time_us if device.type == "cuda" else time_us
    table: dict[tuple, dict[int, float]] = {}
    targets: dict[tuple, float] = {}
    bad: list[str] = []
    failed: set[int] = set()
    if jobs > 0:
        precompile(grid, cases, vocab, jobs, device)
    emit()
    emit(f"# sweep: argmax_pair in a CUDA graph, us per call; {len(grid)} layouts; columns"
         f" dtype/B; bb = block bytes, un = unroll, nw = num_warps, tr = tree reduction,"
         f" pps = programs per SM")
    head = " ".join(f"{str(d).removeprefix('torch.')[:4] + '/' + str(b):>10}" for d, b in cases)
    emit(f"{'cfg':>4} {'bb':>5} {'un':>2} {'nw':>2} {'tr':>2} {'pps':>4} | {head}")
    data = {}
    for dtype, b in cases:
        g = torch.Generator(device=device).manual_seed(b)
        x = torch.randn(b, vocab, device=device, generator=g).mul_(3).to(dtype)
        ref = argmax_pair_reference(x, 0, torch.zeros(b, EXCHANGE_COLUMNS, device=device), 0)
        floor = floor_us(b * vocab * x.element_size(), bandwidth)
        t_torch = timer(lambda x=x: torch.argmax(x, dim=-1), device, iters=iters, warmup=2)
        targets[(dtype, b)] = t_torch / 4 if b <= 32 else 1.5 * floor
        data[(dtype, b)] = (x, ref)
    emit(f"{'target':>24} | " + " ".join(fmt(targets[c], 10, 2) for c in cases))
    for i, cfg in enumerate(grid):
        cells = []
        with use_layout(cfg):
            for dtype, b in cases:
                try:
                    t = _time_checked(i, cfg, data[(dtype, b)], dtype, b, device, timer, iters,
                                      bad)
                except Exception as exc:  # noqa: BLE001 - one broken variant must not end the run
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    bad.append(f"cfg {i} {cfg} {dtype} B={b}: {type(exc).__name__}: {exc}")
                    t = None
                if t is None:
                    failed.add(i)
                    cells.append(f"{'fail':>10}")
                    continue
                table.setdefault((dtype, b), {})[i] = t
                cells.append(fmt(t, 10, 2))
        bb, un, nw, tr, pps = cfg
        emit(f"{i:>4} {bb:>5} {un:>2} {nw:>2} {int(tr):>2} {pps:>4} | {' '.join(cells)}")
    for i in {int(m.split()[1]) for m in bad}:  # a wrong or dirty layout is never picked
        failed.add(i)
    table = {case: {i: t for i, t in times.items() if i not in failed}
             for case, times in table.items()}
    table = {case: times for case, times in table.items() if times}
    emit()
    emit("# best per case (target: B <= 32 torch_gr / 4, B >= 128 1.5 x floor; on a GPU cfg 0-2"
         " are the current picks)")
    for (dtype, b), times in table.items():
        i = min(times, key=times.get)
        tgt = targets[(dtype, b)]
        emit(f"  {str(dtype).removeprefix('torch.'):>8} B={b:<4} cfg {i:>3} {grid[i]}:"
             f" {times[i]:.2f} us, target {tgt:.2f} us -> {'MET' if times[i] <= tgt else 'missed'}")
    score = {i: sum(times[i] / min(times.values()) for times in table.values()) / len(table)
             for i in range(len(grid)) if i not in failed and all(i in t for t in table.values())}
    if score:
        i = min(score, key=score.get)
        emit(f"# best overall (mean time / per-case best = {score[i]:.3f}): cfg {i} {grid[i]}")
    emit(f"# sweep: {len(bad)} bit mismatches / failures ({len(failed)} layouts left out of the"
         f" picks)" + ("".join("\n#   " + m for m in bad)))
    emit(f"# sweep took {time.perf_counter() - t_start:.1f} s")


if __name__ == "__main__":
    raise SystemExit(main())
