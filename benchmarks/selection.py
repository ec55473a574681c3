"""Token-selection kernels: per-shard pair reductions vs torch, against the memory floor.

One process, one GPU. For each logits dtype (bf16, fp32) and batch ``B`` in {1, 4, 32, 128, 256}
at ``V = 163840`` it prints, in microseconds and as ratios:

* ``torch.argmax`` (eager and in a CUDA graph);
* ``argmax_pair`` (spec 5.2, eager and in a CUDA graph);
* the memory floor: bytes read (``B * V * itemsize``) / measured device copy bandwidth;
* ``gumbel_pair`` (temperature sampling by keyed Gumbel-max, spec 5.5; eager and graph) vs
  ``torch.multinomial(softmax(x / T))``.

Targets (H200): ``argmax_pair`` >= 4x faster than ``torch.argmax`` at ``B <= 32``, and within
1.5x of the floor at ``B >= 128``.

    python benchmarks/selection.py                          # the GPU table
    python benchmarks/selection.py --out benchmarks/results # also write the raw output there
    python benchmarks/selection.py --smoke                  # tiny sizes on the CPU (interpreter)
"""

from __future__ import annotations

import argparse
import os
import sys

if "--smoke" in sys.argv and not os.environ.get("CUDA_VISIBLE_DEVICES", "x") == "":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from _timing import (  # noqa: E402
    copy_bandwidth,
    floor_us,
    graph_time_us,
    results_file,
    time_us,
)

from draftsmith.kernels.argmax_pair import EXCHANGE_COLUMNS, argmax_pair  # noqa: E402
from draftsmith.kernels.gumbel_pair import gumbel_pair  # noqa: E402

LINES: list[str] = []


def emit(line: str = "") -> None:
    print(line, flush=True)
    LINES.append(line)


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

    kw = dict(iters=iters, warmup=max(2, iters // 10))
    ta, tag = time_us(t_argmax, device, **kw), graph_time_us(t_argmax, device, **kw)
    tp, tpg = time_us(pair, device, **kw), graph_time_us(pair, device, **kw)
    tg, tgg = time_us(gumbel, device, **kw), graph_time_us(gumbel, device, **kw)
    tm = time_us(multinomial, device, **kw)
    name = str(dtype).removeprefix("torch.")
    best_pair = tpg if tpg is not None else tp
    best_torch = tag if tag is not None else ta
    best_gumbel = tgg if tgg is not None else tg
    argmax_row = (
        f"{name:>8} {batch:>4} | {fmt(ta)} {fmt(tag)} | {fmt(tp)} {fmt(tpg)} | {fmt(floor, 9, 2)}"
        f" | {ratio(best_torch, best_pair)} {ratio(best_pair, floor)}"
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

    bandwidth = copy_bandwidth(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)"
    emit(f"# selection benchmark: {gpu}, V = {vocab}, torch {torch.__version__}")
    emit(f"# measured copy bandwidth: {bandwidth / 1e9:.1f} GB/s (read + write); times in us")
    emit("# floor = B * V * itemsize / bandwidth; graph columns: per call inside a CUDA graph")
    emit()
    emit("argmax:     dtype    B |    torch  torch_gr |     pair   pair_gr |     floor |"
         " torch/pair pair/floor")
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
    if args.out:
        path = results_file(args.out, "selection" + ("-smoke" if args.smoke else ""), device)
        path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
        emit(f"# wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
