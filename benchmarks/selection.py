"""Token-selection kernels: per-shard pair reductions vs torch, against the memory floor.

One process, one GPU. For each logits dtype (bf16, fp32) and batch ``B`` in {1, 4, 32, 128, 256}
at ``V = 163840`` it prints, in microseconds and as ratios:

* ``torch.argmax`` (eager and in a CUDA graph);
* ``argmax_pair`` (spec 5.2, eager and in a CUDA graph);
* the memory floor: bytes read (``B * V * itemsize``) / measured device copy bandwidth;
* the launch floor: an empty Triton kernel replayed in a CUDA graph (``empty_gr``) and launched
  eagerly (``empty``); ``host``: CPU microseconds per ``argmax_pair`` call (launcher overhead);
* ``gumbel_pair`` (temperature sampling by keyed Gumbel-max, spec 5.5; eager and graph) vs
  ``torch.multinomial(softmax(x / T))``.

Targets (H200): ``argmax_pair`` >= 4x faster than ``torch.argmax`` at ``B <= 32``, and within
1.5x of the floor at ``B >= 128``. ``pair/launch`` shows how far a small-B pair is from one
graph-replayed empty launch (the best any one-launch kernel can do).

    python benchmarks/selection.py                          # the GPU table
    python benchmarks/selection.py --sweep                  # + argmax_pair launch-config sweep
    python benchmarks/selection.py --sweep --no-table       # only the sweep
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
from _timing import (  # noqa: E402
    copy_bandwidth,
    floor_us,
    graph_time_us,
    results_file,
    time_us,
)

from draftsmith.kernels import argmax_pair as ap  # noqa: E402
from draftsmith.kernels.argmax_pair import (  # noqa: E402
    EXCHANGE_COLUMNS,
    LATENCY_BYTES,
    PairTuning,
    argmax_pair,
    argmax_pair_reference,
    set_pair_tuning,
)
from draftsmith.kernels.gumbel_pair import gumbel_pair  # noqa: E402

LINES: list[str] = []
SINK: list = []  # the open results file, written line by line (a killed run keeps its lines)


@triton.jit
def _empty_kernel(x_ptr, n):
    pass


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
        f"{name:>8} {batch:>4} | {fmt(tg)} {fmt(tgg)} | {fmt(tm)} | {fmt(floor, 9, 2)}"
        f" | {ratio(tm, best_gumbel)} {ratio(best_gumbel, floor)}"
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
                        help="also time argmax_pair over a grid of launch configurations")
    parser.add_argument("--no-table", action="store_true", help="skip the main tables")
    parser.add_argument("--sweep-iters", type=int, default=None,
                        help="graph replays per sweep point (default 30)")
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
        sweep(batches, vocab, device, bandwidth, args.sweep_iters or (2 if args.smoke else 30))
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
    emit("gumbel:     dtype    B |   gumbel gumbel_gr |  multin. |     floor |"
         " multin/gumbel gumbel/floor")
    for row in gumbel_rows:
        emit("         " + row)


SWEEP_SHAPES = [(2048, 2), (4096, 1), (4096, 2), (4096, 4), (8192, 1), (8192, 2)]
"""``(block_bytes, unroll)`` pairs of the sweep: 4-16 KiB in flight per program and loop trip."""


def sweep_grid(smoke: bool) -> list[PairTuning]:
    """The launch configurations that ``--sweep`` times (``num_stages`` 1: on sm_90 the pair
    loop compiles to the same PTX for 1 and 3, no cp.async; tree reduction on, plus the two
    defaults with the four-reduction form)."""
    if smoke:
        return [PairTuning(4, 4096, 2, 4, 1, False), PairTuning(2, 2048, 4, 4, 1, True)]
    grid = [PairTuning(pps, bb, un, nw, 1, True)
            for pps, (bb, un), nw in itertools.product((4, 6, 8, 16), SWEEP_SHAPES, (4, 8))]
    grid += [t._replace(tree_reduce=False) for t in ap.ARGMAX_TUNING.values()]
    return grid


def sweep(batches: list[int], vocab: int, device: torch.device, bandwidth: float,
          iters: int) -> None:
    """Time ``argmax_pair`` in a CUDA graph for every :func:`sweep_grid` configuration.

    Prints one row per configuration (us per call), then per case the best configuration and
    its target check, then the best configuration per regime of ``pick_pair_launch`` (the sum
    of each configuration's time relative to the per-case best), ready to paste into
    ``ARGMAX_TUNING``. Every point is also checked bit for bit against the reference.
    """
    t_start = time.perf_counter()
    grid = sweep_grid(device.type != "cuda")
    cases = [(dtype, b) for dtype in (torch.bfloat16, torch.float32) for b in batches]
    timer = graph_time_us if device.type == "cuda" else time_us
    table: dict[tuple, dict[int, float]] = {}
    targets: dict[tuple, float] = {}
    bad: list[str] = []
    emit()
    emit(f"# sweep: argmax_pair in a CUDA graph, us per call; {len(grid)} configurations;"
         f" columns dtype/B; pps = programs per SM, bb = block bytes, un = unroll,"
         f" nw = num_warps, ns = num_stages, tr = tree reduction")
    head = " ".join(f"{str(d).removeprefix('torch.')[:4] + '/' + str(b):>10}" for d, b in cases)
    emit(f"{'cfg':>4} {'pps':>4} {'bb':>5} {'un':>2} {'nw':>2} {'ns':>2} {'tr':>2} | {head}")
    data = {}
    for dtype, b in cases:
        g = torch.Generator(device=device).manual_seed(b)
        x = torch.randn(b, vocab, device=device, generator=g).mul_(3).to(dtype)
        ref = argmax_pair_reference(x, 0, torch.zeros(b, EXCHANGE_COLUMNS, device=device), 0)
        floor = floor_us(b * vocab * x.element_size(), bandwidth)
        t_torch = timer(lambda x=x: torch.argmax(x, dim=-1), device, iters=iters, warmup=2)
        targets[(dtype, b)] = t_torch / 4 if b <= 32 else 1.5 * floor
        data[(dtype, b)] = (x, ref)
    emit(f"{'target':>23} | " + " ".join(fmt(targets[c], 10, 2) for c in cases))
    try:
        for i, tuning in enumerate(grid):
            set_pair_tuning(tuning)
            cells = []
            for dtype, b in cases:
                x, ref = data[(dtype, b)]
                out = torch.full((b, EXCHANGE_COLUMNS), float("nan"), device=device)
                argmax_pair(x, 0, out, 0)
                if not torch.equal(out.view(torch.int32), ref.view(torch.int32)):
                    bad.append(f"cfg {i} {tuning} {dtype} B={b}")
                t = timer(lambda x=x, out=out: argmax_pair(x, 0, out, 0), device, iters=iters,
                          warmup=2)
                table.setdefault((dtype, b), {})[i] = t
                cells.append(fmt(t, 10, 2))
            emit(f"{i:>4} {tuning.programs_per_sm:>4} {tuning.block_bytes:>5} {tuning.unroll:>2}"
                 f" {tuning.num_warps:>2} {tuning.num_stages:>2} {int(tuning.tree_reduce):>2}"
                 f" | {' '.join(cells)}")
    finally:
        set_pair_tuning(None)
        ap.pair_launch_sizes.cache_clear()
    emit()
    emit("# best per case (target: B <= 32 torch_gr / 4, B >= 128 1.5 x floor)")
    for (dtype, b), times in table.items():
        i = min(times, key=times.get)
        tgt = targets[(dtype, b)]
        emit(f"  {str(dtype).removeprefix('torch.'):>8} B={b:<4} cfg {i:>3} {grid[i]}:"
             f" {times[i]:.2f} us, target {tgt:.2f} us -> {'MET' if times[i] <= tgt else 'missed'}")
    emit()
    picks = {}
    for regime in ("latency", "bandwidth"):
        keys = [k for k in table
                if (k[1] * vocab * torch.empty(0, dtype=k[0]).element_size() < LATENCY_BYTES)
                == (regime == "latency")]
        if not keys:
            continue
        score = {i: sum(table[k][i] / min(table[k].values()) for k in keys) / len(keys)
                 for i in range(len(grid))}
        i = min(score, key=score.get)
        picks[regime] = grid[i]
        emit(f"# best {regime} config (mean time / per-case best = {score[i]:.3f}): cfg {i}")
    emit("# paste into draftsmith/kernels/argmax_pair.py:")
    emit("ARGMAX_TUNING = {")
    for regime, t in picks.items():
        emit(f'    "{regime}": {t!r},')
    emit("}")
    emit(f"# sweep: {len(bad)} bit mismatches" + ("".join("\n#   " + m for m in bad)))
    emit(f"# sweep took {time.perf_counter() - t_start:.1f} s")


if __name__ == "__main__":
    raise SystemExit(main())
