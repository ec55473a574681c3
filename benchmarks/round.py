"""Where one speculative round's time goes, on one GPU (SmolLM2-135M, the shipped drafter).

Times, in CUDA graphs replayed back to back: the whole captured round; the target forward of
``K + 1`` tokens and of one token (the plain step); the drafting part (placement, context store,
block forward, head and Markov chain); the block forward alone; the chain alone. Then the host:
wall time of one decoding step (replay, the one read, emitting) against the replay alone. Last,
the kernels of one eager round by total GPU time (torch profiler), with their count.

    python benchmarks/round.py --dtype bf16 --batch 1 --out $OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch
from e2e import DATA, _decoder, _prompts


def graph_ms(fn, iters: int = 100) -> float:
    """Milliseconds per call of ``fn`` captured alone in a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return replay_ms(graph.replay, iters)


def replay_ms(fn, iters: int = 100) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from draftsmith.contract import SamplingKey
    from draftsmith.runtime.config import TargetConfig
    from draftsmith.runtime.targets.smollm2 import load_target

    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"round-{args.dtype}-b{args.batch}.txt").write_text("\n".join(lines))

    target, tokenizer = load_target(TargetConfig(
        model="smollm2-135m", dtype={"bf16": "bfloat16"}.get(args.dtype, "float32"),
        device="cuda"), max_slots=args.batch + 2)
    dec = _decoder(target, tokenizer, args.dtype, args.batch, args.k)
    ids = [dec.encode(t) for _, t in _prompts(Path(args.data), 4)][: max(args.batch, 1)]
    dec.generate_ids(ids, 64, compare_plain=True)
    spec, b = dec.spec, dec.spec.buffers
    g = max(k for k in spec._rows if k <= args.batch)
    width = spec._widths[min(1, len(spec._widths) - 1)]
    k = spec.plan.num_draft_tokens
    say(f"# round profile, {args.dtype}, rows {g}, context width {width}, K = {k}, "
        f"torch {torch.__version__}")
    # live-looking state: every row a real request at position 200
    b.batch_to_slot[:g] = torch.arange(g, device="cuda")
    b.target_len[:g] = 200
    b.ctx_len[:g] = 199
    graph = spec.graphs[(g, width)]
    t_round = replay_ms(graph.replay)
    view = b.view(g)
    starts = view.target_len.clone()
    tok8 = torch.randint(0, 1000, (g, k + 1), device="cuda")
    t_v8 = graph_ms(lambda: target.forward_rows(tok8, starts, width))
    t_v1 = graph_ms(lambda: target.forward_rows(tok8[:, :1], starts, width))

    def drafting():
        placement = spec.pager.place(view.batch_to_slot, view.accepted, view.num_accepted)
        placement = dataclasses.replace(placement, context_width=width)
        entries = spec.drafter.project_context(view.features.reshape(g * (k + 1), -1),
                                               placement.ctx_positions.reshape(-1))
        spec.pager.store(placement, entries)
        return spec.draft_core(placement, None)

    t_draft = graph_ms(drafting)
    placement = dataclasses.replace(
        spec.pager.place(view.batch_to_slot, view.accepted, view.num_accepted),
        context_width=width)
    t_core = graph_ms(lambda: spec.draft_core(placement, None))
    ids_block = b.block_ids[:g]
    from draftsmith.contract import DraftBlockInputs

    emb = spec.drafter.embed_block(ids_block, spec.target_embedding)
    inputs = DraftBlockInputs(token_ids=ids_block, positions=placement.query_positions,
                              embeddings=emb)
    t_block = graph_ms(lambda: spec.drafter.forward_block(inputs, placement, b.cache))
    hidden = spec.drafter.forward_block(inputs, placement, b.cache)
    first = spec.plan.first_draft_slot
    dh = hidden[:, first : first + k]
    logits = spec.drafter.block_logits(dh.reshape(g * k, -1), spec.head)
    base = logits.logits.view(g, k, -1)
    t_head = graph_ms(lambda: spec.drafter.block_logits(dh.reshape(g * k, -1), spec.head))
    t_chain = graph_ms(lambda: spec.chain.run(base, 0, placement.bonus, None, hidden=dh))
    key = SamplingKey(seeds=view.seeds, offsets=starts)
    out = target.forward_rows(tok8, starts, width)
    drafts = tok8[:, 1:].contiguous()
    t_acc = graph_ms(lambda: spec.acceptance.accept(out.logits, drafts, None))
    del key
    say(f"{'part':<34}{'ms':>8}")
    for name, t in [("whole round (replay)", t_round), ("target forward, K+1 tokens", t_v8),
                    ("target forward, 1 token", t_v1),
                    ("drafting (place..chain)", t_draft), ("  draft_core", t_core),
                    ("    block forward", t_block), ("    head logits", t_head),
                    ("    Markov chain + select", t_chain), ("acceptance", t_acc)]:
        say(f"{name:<34}{t:>8.3f}")
    # the host: one decoding step against its replay
    dec.generate_ids(ids, 64, compare_plain=False)
    steps: list[float] = []
    real = spec.step

    def timed(active):
        t0 = time.perf_counter()
        real(active)
        steps.append(time.perf_counter() - t0)

    spec.step = timed
    dec.generate_ids(ids, 128, compare_plain=False)
    spec.__dict__.pop("step", None)
    steps.sort()
    say(f"host step wall time: median {steps[len(steps) // 2] * 1e3:.3f} ms over {len(steps)}"
        f" steps (replay alone {t_round:.3f} ms)")
    # kernels of one eager round
    b.batch_to_slot[:g] = torch.arange(g, device="cuda")
    spec.round_core(g, width)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        spec.round_core(g, width)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    total = sum(e.self_device_time_total for e in events)
    count = sum(e.count for e in events)
    say(f"eager round: {count} kernels, {total / 1e3:.3f} ms of kernel time")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:25]:
        say(f"  {e.self_device_time_total / 1e3:8.3f} ms {e.count:5d}x  {e.key[:90]}")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        target.forward_rows(tok8[:, :1], starts, width)
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    say(f"eager target forward of 1 token: {sum(e.count for e in events)} kernels, "
        f"{sum(e.self_device_time_total for e in events) / 1e3:.3f} ms of kernel time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
