"""Few-row GEMMs as a decoding step runs them: ``kernels.linear`` vs cuBLAS vs the memory floor.

For each weight shape of the target (SmolLM2-135M's by default) and each row count ``M``, one
CUDA graph multiplies ``M`` rows by ``--layers`` distinct copies of the weight (so weights stream
from HBM as a model's layers do, not from L2) and is timed by replay. Columns: cuBLAS (torch's
default), cuBLASLt (``preferred_blas_library``), the Triton kernel, the floor (weight + rows bytes
at the measured copy bandwidth), the ratios ``cublas / triton`` and ``triton / floor``, and
whether each backend's row 0 at ``M`` rows is bit-identical to its one-row result.

    python benchmarks/linear.py --dtype fp32 --out benchmarks/results
    python benchmarks/linear.py --dtype fp32 --sweep      # also time BLOCK_N/BLOCK_K choices
    python benchmarks/linear.py --smoke                   # tiny shapes on the CPU (interpreter)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from _timing import copy_bandwidth, floor_us, graph_time_us, results_file, time_us  # noqa: E402

from draftsmith.kernels import linear as lin  # noqa: E402

SMOLLM2 = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
           "head": (49152, 576)}
"""SmolLM2-135M's products as the fused layer loop runs them (q, k, v packed; gate, up packed)."""
LLAMA8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
           "down": (4096, 14336)}
SWEEP = [  # (BLOCK_N, num_warps, MIN_PROGRAMS); the K tiles stay the shape's own
    (bn, nw, mp) for bn, nw in ((1, 1), (2, 1), (2, 2), (4, 2), (4, 4), (8, 4))
    for mp in (256, 1024, 4096)]


def _timer(fn, device, smoke: bool) -> float:
    if smoke:
        return time_us(fn, device, iters=1, warmup=0)
    t = graph_time_us(fn, device, iters=20, warmup=2, calls_per_graph=1)
    return float("nan") if t is None else t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--rows", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--model", default="smollm2", choices=["smollm2", "llama8b"])
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = "cpu" if args.smoke else "cuda"
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    shapes = {"tiny": (40, 24)} if args.smoke else (SMOLLM2 if args.model == "smollm2"
                                                     else LLAMA8B)
    rows_list = [1, 3] if args.smoke else args.rows
    layers = 2 if args.smoke else args.layers
    if args.model == "llama8b":
        layers = min(layers, 4)
    bw = copy_bandwidth(device)
    out_path = results_file(args.out, f"linear-{args.dtype}", device) if args.out else None
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)
        if out_path is not None:
            out_path.write_text("\n".join(lines) + "\n")

    say(f"# few-row GEMM, {args.dtype}, {layers} weight copies per graph, copy bandwidth "
        f"{bw / 1e12:.2f} TB/s, torch {torch.__version__}")
    say(f"{'shape':>8} {'N':>6} {'K':>6} {'M':>4} {'cublas':>8} {'lt':>8} {'triton':>8} "
        f"{'floor':>7} {'cub/tri':>8} {'tri/flr':>8}  row-invariant (cublas lt triton)")
    gen = torch.Generator(device="cpu").manual_seed(0)
    for name, (n, k) in shapes.items():
        weights = [(torch.randn(n, k, generator=gen) / k ** 0.5).to(device, dtype)
                   for _ in range(layers)]
        x_all = torch.randn(max(rows_list), k, generator=gen).to(device, dtype)
        for m in rows_list:
            x = x_all[:m].contiguous()
            outs = [torch.empty(m, n, device=device, dtype=dtype) for _ in weights]

            def run_cublas(x=x, outs=outs, weights=weights):
                for w, o in zip(weights, outs, strict=True):
                    torch.mm(x, w.t(), out=o)

            def run_triton(x=x, outs=outs, weights=weights):
                for w, o in zip(weights, outs, strict=True):
                    lin.linear(x, w, out=o)

            t_cublas = _timer(run_cublas, device, args.smoke) / layers
            row_cublas = torch.equal(outs[0][:1], x[:1] @ weights[0].t())
            t_lt, row_lt = float("nan"), None
            if not args.smoke:
                torch.backends.cuda.preferred_blas_library("cublaslt")
                try:
                    t_lt = _timer(run_cublas, device, False) / layers
                    row_lt = torch.equal(outs[0][:1], x[:1] @ weights[0].t())
                finally:
                    torch.backends.cuda.preferred_blas_library("cublas")
            t_tri = _timer(run_triton, device, args.smoke) / layers
            row_tri = torch.equal(outs[0][:1], lin.linear(x[:1], weights[0]))
            floor = floor_us((n * k + m * k + m * n) * weights[0].element_size(), bw)
            say(f"{name:>8} {n:>6} {k:>6} {m:>4} {t_cublas:8.2f} {t_lt:8.2f} {t_tri:8.2f} "
                f"{floor:7.2f} {t_cublas / t_tri:7.2f}x {t_tri / floor:7.2f}x  "
                f"{row_cublas} {row_lt} {row_tri}")
            if args.sweep and not args.smoke:
                chosen, min_programs = lin._blocks, lin.MIN_PROGRAMS
                tiles, _, block_k, block_k2, _ = chosen(n, k)
                best = []
                for bn, nw, mp in SWEEP:
                    lin._blocks = (lambda n_, k_, cfg=(tiles, bn, block_k, block_k2, nw): cfg)
                    lin.MIN_PROGRAMS = mp
                    try:
                        best.append((_timer(run_triton, device, False) / layers, (bn, nw, mp)))
                    finally:
                        lin._blocks, lin.MIN_PROGRAMS = chosen, min_programs
                best.sort()
                say("         sweep (us, (BLOCK_N, warps, MIN_PROGRAMS)): "
                    + "  ".join(f"{t:.2f} {cfg}" for t, cfg in best[:5]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
