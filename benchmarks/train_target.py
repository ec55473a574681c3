"""The frozen target's forward in a training step (``TargetRunner``): eager against one CUDA
graph per batch shape, and against the compute floor.

A random Llama of SmolLM2-135M's shape (30 layers, hidden 576, 9 / 3 heads, V = 49152, bf16)
runs the training batch (``B = 32`` sequences of width ``T``) with the captured layers
``(1, 14, 27)``. Each figure is the mean of 20 calls after 3 warm-up calls; ``host`` is the time
to queue 20 calls without waiting, which shows how much of the eager forward is Python
launching kernels. ``floor`` is the forward's matmul FLOPs (``2 * params * tokens``, the head
excluded: training never computes the target's logits here) at the bf16 GEMM rate measured in
the same run on one large square product.

    python benchmarks/train_target.py --out $OUT     # on a GPU
    python benchmarks/train_target.py --smoke        # the CPU: eager only, tiny sizes
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from _timing import machine_tag, results_file


def _model(smoke: bool, device: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=512) if smoke else
             dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                  num_attention_heads=9, num_key_value_heads=3, vocab_size=49152))
    cfg = LlamaConfig(**shape, tie_word_embeddings=True, attn_implementation="sdpa")
    dtype = torch.float32 if smoke else torch.bfloat16
    return LlamaForCausalLM(cfg).to(device, dtype).eval()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(runner, tokens: torch.Tensor, device: str, iters: int = 20) -> tuple[float, float]:
    """``(ms per call, host ms per call)``."""
    for _ in range(3):
        runner(tokens)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        runner(tokens)
    _sync(device)
    total = (time.perf_counter() - t0) / iters * 1e3
    t0 = time.perf_counter()
    for _ in range(iters):
        runner(tokens)
    host = (time.perf_counter() - t0) / iters * 1e3
    _sync(device)
    return total, host


def _gemm_rate(device: str, dtype: torch.dtype) -> float:
    """Measured FLOP/s of one ``n x n x n`` product."""
    n = 8192 if device == "cuda" else 512
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    _sync(device)
    return 2 * n ** 3 * 10 / (time.perf_counter() - t0)


def main() -> int:
    from draftsmith.training.trainer import TargetRunner

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--widths", nargs="+", type=int, default=[256, 512, 1024])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if args.smoke:
        args.widths, args.batch = [32], 2
    model = _model(args.smoke, device)
    dtype = next(model.parameters()).dtype
    body = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n)
    rate = _gemm_rate(device, dtype)
    lines = [f"# train_target on {machine_tag(device)}, torch {torch.__version__}, "
             f"{time.strftime('%Y-%m-%dT%H%MZ', time.gmtime())}; {body / 1e6:.1f}M matmul "
             f"parameters, {str(dtype).removeprefix('torch.')}, GEMM rate {rate / 1e12:.2f} "
             "TFLOP/s measured",
             "| B | T | eager ms | eager host ms | graphs ms | graphs host ms | graphs vs eager "
             "| floor ms | graphs vs floor | same bits |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    print("\n".join(lines), flush=True)
    for width in args.widths:
        tokens = torch.randint(0, model.config.vocab_size - 1, (args.batch, width), device=device)
        eager = TargetRunner(model, (1, 2, 3) if args.smoke else (1, 14, 27))
        graphed = TargetRunner(model, eager.layer_ids, graphs=True)
        e_ms, e_host = _timed(eager, tokens, device)
        g_ms, g_host = _timed(graphed, tokens, device)
        same = all(torch.equal(a, b) for a, b in zip(eager(tokens), graphed(tokens), strict=True))
        floor = 2 * body * args.batch * width / rate * 1e3
        line = (f"| {args.batch} | {width} | {e_ms:.2f} | {e_host:.2f} | {g_ms:.2f} | "
                f"{g_host:.2f} | {e_ms / g_ms:.2f}x | {floor:.2f} | {g_ms / floor:.1f}x | "
                f"{same} |")
        lines.append(line)
        print(line, flush=True)
        del graphed
    if device != "cuda":
        lines.append("(the CPU has no CUDA graphs: both rows run eagerly)")
        print(lines[-1])
    if args.out is not None:
        results_file(args.out, "train-target", device).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
