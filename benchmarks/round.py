"""Where one speculative round's time goes, on one GPU (SmolLM2-135M, the shipped drafter).

During a real generation: per round, the wall time of a decoding step (replay, the one read,
emitting) and the GPU time between events around it; then one round run eagerly under the torch
profiler, its kernels counted and timed per component (target forward, placement, context
projection and store, block forward, head, chain, acceptance), and the top kernels; last, one
eager prefill (an admission) for scale.

    python benchmarks/round.py --dtype bf16 --batch 1 --out $OUT
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from e2e import DATA, _decoder, _prompts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
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
    ids = [dec.encode(t) for _, t in _prompts(Path(args.data), 4)][: max(args.batch, 4)]
    dec.generate_ids(ids, 64, compare_plain=True)
    spec = dec.spec
    say(f"# round profile, {args.dtype}, batch {args.batch}, K = {spec.plan.num_draft_tokens}, "
        f"torch {torch.__version__}")
    labels = {"target.forward_rows": (spec.target, "forward_rows"),
              "pager.place": (spec.pager, "place"),
              "drafter.project_context": (spec.drafter, "project_context"),
              "pager.store": (spec.pager, "store"),
              "drafter.embed_block": (spec.drafter, "embed_block"),
              "drafter.forward_block": (spec.drafter, "forward_block"),
              "drafter.block_logits": (spec.drafter, "block_logits"),
              "chain.run": (spec.chain, "run"),
              "acceptance.accept": (spec.acceptance, "accept")}
    for label, (obj, name) in labels.items():
        setattr(obj, name, _labelled(getattr(obj, name), label))
    rounds: list[tuple[object, object]] = []
    walls: list[float] = []
    state = {"n": 0, "prof": None}
    real_step, real_core = spec.step, spec.round_core

    def step(active):
        state["n"] += 1
        t0 = time.perf_counter()
        if state["n"] == 12:  # one eager round under the profiler, on live state
            with torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                _eager_step(spec, active, real_core)
                torch.cuda.synchronize()
            state["prof"] = prof
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        real_step(active)
        end.record()
        walls.append(time.perf_counter() - t0)
        rounds.append((start, end))

    spec.step = step
    t0 = time.perf_counter()
    report = dec.generate_ids(ids, 160, compare_plain=False)
    total = time.perf_counter() - t0
    torch.cuda.synchronize()
    gpu = sorted(s.elapsed_time(e) for s, e in rounds)
    walls.sort()
    say(f"rounds {len(rounds)}, tau {report.mean_accepted_length:.2f}; per round: step wall "
        f"median {walls[len(walls) // 2] * 1e3:.3f} ms, GPU (replay + read) median "
        f"{gpu[len(gpu) // 2]:.3f} ms; generate wall {total:.2f} s")
    prof = state["prof"]
    by_label: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        label = "other"
        parent = e.cpu_parent
        while parent is not None:
            if parent.name in labels:
                label = parent.name
            parent = parent.cpu_parent
        by_label.setdefault(label, []).append(e.device_time)
    say(f"{'eager round, by component':<34}{'kernels':>8}{'GPU ms':>9}")
    for label, times in sorted(by_label.items(), key=lambda kv: -sum(kv[1])):
        say(f"  {label:<32}{len(times):>8}{sum(times) / 1e3:>9.3f}")
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    say("top kernels:")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:20]:
        say(f"  {e.self_device_time_total / 1e3:8.3f} ms {e.count:5d}x  {e.key[:90]}")
    # an eager prefill of one prompt (admission), for scale
    prompt = torch.tensor(ids[0])
    for _ in range(2):
        target.prefill([0], [prompt])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    target.prefill([0], [prompt])
    torch.cuda.synchronize()
    say(f"eager prefill of {prompt.numel()} tokens: {(time.perf_counter() - t0) * 1e3:.1f} ms")
    return 0


def _labelled(fn, label: str):
    def call(*args, **kwargs):
        with torch.profiler.record_function(label):
            return fn(*args, **kwargs)
    return call


def _eager_step(spec, active, core) -> None:
    """One step with the round run eagerly (same state, same outputs as its replay)."""
    g, width = spec.bucket(active)
    core(g, width)
    spec.emit_round(active, g)


if __name__ == "__main__":
    sys.exit(main())
