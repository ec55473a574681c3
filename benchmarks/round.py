"""Where one speculative round's time goes, on one GPU (SmolLM2-135M, the shipped drafter).

During a real generation (the e2e prompts, 256 new tokens): per round, the wall time of a
decoding step (replay, the one read, emitting) and the GPU time between events around it; at one
round, each part of it (target forward of K + 1 and of one token, drafting, context projection,
draft core, block forward, head, chain, acceptance) captured and replayed alone on the live
state, which is restored; then one round run eagerly under the torch profiler, its kernels
counted and the top ones listed; last, one eager prefill (an admission) for scale.

    python benchmarks/round.py --dtype bf16 --batch 1 --out $OUT
    python benchmarks/round.py --dtype fp32 --batch 8 --temperature 0.7   # sampled rounds
    python benchmarks/round.py --batch 8 --k 1 --temperature 0.7 --top-p 0.95   # nucleus rounds
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch
from e2e import DATA, _decoder, _prompts

from draftsmith.contract import DraftBlockInputs, SamplingKey


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--limit", type=int, default=2, help="prompts per set")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sample at this temperature (rejection acceptance); 0: greedy")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus filter when sampling")
    parser.add_argument("--breakdown", type=int, default=0, metavar="N",
                        help="first time a whole generation of N prompts per set, split into "
                             "admissions, steps by context width, and the rest")
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
    # each round committed before the next (runtime.overlap off): a step here is one round's
    # replay, read and commit, which the hooks below time and profile one by one
    dec = _decoder(target, tokenizer, args.dtype, args.batch, args.k,
                   temperature=args.temperature, top_p=args.top_p, overlap="off")
    ids = [dec.encode(t) for _, t in _prompts(Path(args.data), args.limit)]
    dec.generate_ids(ids, 64, compare_plain=True)
    spec = dec.spec
    if args.breakdown:
        _breakdown(dec, [dec.encode(t) for _, t in _prompts(Path(args.data), args.breakdown)],
                   args.max_new_tokens, say)
    say(f"# round profile, {args.dtype}, batch {args.batch}, K = {spec.plan.num_draft_tokens}, "
        f"temperature {args.temperature}, top-p {args.top_p}, torch {torch.__version__}")
    rounds: list[tuple[object, object]] = []
    walls: list[float] = []
    state = {"n": 0, "parts": None, "prof": None}
    real_step, real_core = spec.step, spec.round_core

    def step(active):
        state["n"] += 1
        if state["n"] == 12:  # components timed on live state, which is then restored
            state["parts"] = _time_parts(spec, *spec.bucket(active))
        if state["n"] == 13:  # one eager round under the profiler
            with torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                _eager_step(spec, active, real_core)
                torch.cuda.synchronize()
            state["prof"] = prof
            return
        t0 = time.perf_counter()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        real_step(active)
        end.record()
        walls.append(time.perf_counter() - t0)
        rounds.append((start, end))

    spec.step = step
    t0 = time.perf_counter()
    report = dec.generate_ids(ids, args.max_new_tokens, compare_plain=False)
    total = time.perf_counter() - t0
    torch.cuda.synchronize()
    gpu = sorted(s.elapsed_time(e) for s, e in rounds)
    walls.sort()
    say(f"rounds {len(rounds)}, tau {report.mean_accepted_length:.2f}; per round: step wall "
        f"median {walls[len(walls) // 2] * 1e3:.3f} ms, GPU (replay + read) median "
        f"{gpu[len(gpu) // 2]:.3f} ms; generate wall {total:.2f} s")
    say(f"{'component, replayed alone (round 12)':<44}{'ms':>8}{'kernels':>9}")
    for name, ms, count in state["parts"]:
        say(f"  {name:<42}{ms:>8.3f}{count:>9d}")
    prof = state["prof"]
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    say(f"eager round: {sum(e.count for e in events)} kernels, "
        f"{sum(e.self_device_time_total for e in events) / 1e3:.3f} ms of kernel time")
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


def _breakdown(dec, ids: list[list[int]], max_new: int, say) -> None:
    """Wall time of a whole generation (speculative, then plain) split into admissions (prefill),
    steps per context-width bucket, and what remains (the host loop)."""
    for name, sd in (("spec", dec.spec), ("plain", dec.plain)):
        sd.prepare_for(ids, max_new)
        admit, steps = [], {}
        real_admit, real_step = sd._admit_all, sd.step

        def timed_admit(reqs, real_admit=real_admit, admit=admit, **kw):
            t0 = time.perf_counter()
            out = real_admit(reqs, **kw)
            torch.cuda.synchronize()
            admit.append(time.perf_counter() - t0)
            return out

        def timed_step(active, sd=sd, real_step=real_step, steps=steps):
            width = sd.bucket(active)[1]
            t0 = time.perf_counter()
            real_step(active)
            steps.setdefault(width, []).append(time.perf_counter() - t0)

        sd._admit_all, sd.step = timed_admit, timed_step
        t0 = time.perf_counter()
        results = sd.generate(ids, max_new)
        torch.cuda.synchronize()
        total = time.perf_counter() - t0
        sd._admit_all, sd.step = real_admit, real_step
        tokens = sum(len(r.tokens) for r in results)
        n_steps = sum(len(v) for v in steps.values())
        step_s = sum(sum(v) for v in steps.values())
        say(f"{name}: {len(ids)} prompts, {tokens} tokens in {total:.2f} s "
            f"({tokens / total:.1f} tok/s); admissions {len(admit)} = {sum(admit):.2f} s "
            f"({sum(admit) / max(len(admit), 1) * 1e3:.1f} ms each); steps {n_steps} = "
            f"{step_s:.2f} s; rest {total - sum(admit) - step_s:.2f} s")
        for width in sorted(steps):
            v = sorted(steps[width])
            say(f"  width {width:>5}: {len(v):>6} steps, median {v[len(v) // 2] * 1e3:.3f} ms, "
                f"mean {sum(v) / len(v) * 1e3:.3f} ms")


def _captured(fn) -> torch.cuda.CUDAGraph:
    """``fn`` run once on a side stream (warm), then captured alone in a CUDA graph and
    replayed once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    return graph


def alone_us(spans: list[tuple[str, float, float]], iters: int) -> dict[str, tuple[int, float]]:
    """Per name: launches and microseconds per call during which that kernel alone kept the
    stream busy, from ``spans`` ``(name, start_us, end_us)`` of one stream over ``iters`` calls.

    Spans are walked in start order and each is charged only past the end of every span before
    it: a kernel that starts under its predecessor (programmatic dependent launch) is not
    counted for the time they overlap, so the charges add up to the stream's busy time, where
    the kernels' own durations add up to more."""
    out: dict[str, tuple[int, float]] = {}
    covered = float("-inf")
    for name, start, end in sorted(spans, key=lambda s: (s[1], s[2])):
        n, us = out.get(name, (0, 0.0))
        out[name] = (n + 1, us + max(0.0, end - max(start, covered)))
        covered = max(covered, end)
    return {name: (n // iters, us / iters) for name, (n, us) in out.items()}


def _spans(prof, device: str = "CUDA") -> list[tuple[str, float, float]]:
    """``(name, start_us, end_us)`` of the profiled events on ``device``."""
    return [(e.key, e.time_range.start, e.time_range.end) for e in prof.events()
            if e.device_type.name == device]


def _graph_kernel_us(fn, iters: int = 20) -> dict[str, tuple[int, float, float]]:
    """Per kernel name: launches, device microseconds, and microseconds alone
    (:func:`alone_us`) per call of ``fn``, captured in a CUDA graph and profiled over ``iters``
    replays (the kernels' own time, not the gaps between them)."""
    graph = _captured(fn)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            graph.replay()
        torch.cuda.synchronize()
    alone = alone_us(_spans(prof), iters)
    return {e.key: (e.count // iters, e.self_device_time_total / iters,
                    alone.get(e.key, (0, 0.0))[1])
            for e in prof.key_averages() if e.device_type.name == "CUDA"}


def _graph_ms(fn, iters: int = 50) -> float:
    """Milliseconds per replay of ``fn`` captured alone in a CUDA graph."""
    graph = _captured(fn)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _kernels(fn) -> dict[str, int]:
    """CUDA kernels one eager call of ``fn`` launches, by name."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.key: e.count for e in prof.key_averages() if e.device_type.name == "CUDA"}


def _kernel_count(fn) -> int:
    """CUDA kernels one eager call of ``fn`` launches."""
    return sum(_kernels(fn).values())


def _time_parts(spec, g: int, width: int) -> list[tuple[str, float, int]]:
    """Each part of the round for ``g`` rows, captured and replayed alone on the live state;
    the round state is restored afterwards (replays only write past the live positions)."""
    b = spec.buffers
    saved = [t.clone() for t in (b.ctx_len, b.target_len, b.accepted, b.num_accepted,
                                 b.features, b.block_ids)]
    view, k = b.view(g), spec.plan.num_draft_tokens
    starts = view.target_len.clone()
    # rejection sampling writes -1 after a row's bonus: any id in range times the same forward
    tokens = view.accepted.clamp(min=0)
    placement = dataclasses.replace(
        spec.pager.place(view.batch_to_slot, view.accepted, view.num_accepted),
        context_width=width)
    b.ctx_len.copy_(saved[0])

    def drafting():
        p = dataclasses.replace(
            spec.pager.place(view.batch_to_slot, view.accepted, view.num_accepted),
            context_width=width)
        entries = spec.drafter.project_context(view.features.reshape(g * (k + 1), -1),
                                               p.ctx_positions.reshape(-1))
        spec.pager.store(p, entries)
        return spec.round.draft(p, draft_key)

    # sampled rounds: the keys the round itself uses (drafts after the context, target rows
    # after the anchor) and the drafts' distributions q
    draft_key = None if spec.plan.greedy else SamplingKey(view.seeds, placement.new_ctx_len + 1)
    target_key = None if spec.plan.greedy else SamplingKey(view.seeds, starts)
    _, probs, _ = spec.round.draft(placement, draft_key)
    ids = b.block_ids[:g]
    emb = spec.drafter.embed_block(ids, spec.round.target_embedding)
    inputs = DraftBlockInputs(token_ids=ids, positions=placement.query_positions, embeddings=emb)
    hidden = spec.drafter.forward_block(inputs, placement, b.cache)
    first = spec.plan.first_draft_slot
    dh = hidden[:, first : first + k].reshape(g * k, -1)
    base = spec.drafter.block_logits(dh, spec.round.head).logits.view(g, k, -1)
    out = spec.target.forward_rows(tokens, starts, width)
    drafts = tokens[:, 1:].contiguous()
    fns = [
        ("whole round", lambda: spec.round_core(g, width)),
        (f"target forward, {k + 1} tokens a row",
         lambda: spec.target.forward_rows(tokens, starts, width)),
        ("target forward, 1 token a row",
         lambda: spec.target.forward_rows(tokens[:, :1], starts, width)),
        ("drafting: place, project, store, draft", drafting),
        ("  context projection", lambda: spec.drafter.project_context(
            view.features.reshape(g * (k + 1), -1), placement.ctx_positions.reshape(-1))),
        ("  Round.draft", lambda: spec.round.draft(placement, draft_key)),
        ("    block forward", lambda: spec.drafter.forward_block(inputs, placement, b.cache)),
        ("    head logits", lambda: spec.drafter.block_logits(dh, spec.round.head)),
        ("    chain and selection", lambda: spec.chain.run(
            base, 0, placement.bonus, draft_key, hidden=dh.view(g, k, -1),
            probs_out=None if probs is None else torch.empty_like(probs))),
        ("acceptance", lambda: spec.acceptance.accept(out.logits, drafts, target_key,
                                                      draft_probs=probs)),
    ]
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def backend(which, q):
        def run():
            with sdpa_kernel([which]):
                spec.target.forward_rows(tokens[:, :q], starts, width)
        return run

    fns += [
        (f"target {q} token(s), {which.name.lower()} attention", backend(which, q))
        for q in (k + 1, 1) for which in (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
    ]
    parts = [(name, _graph_ms(fn), _kernel_count(fn)) for name, fn in fns]
    # where the verification's forward spends more than the one-token forward: launches and
    # device time per kernel name, from profiled replays of each captured alone
    wide = _graph_kernel_us(lambda: spec.target.forward_rows(tokens, starts, width))
    narrow = _graph_kernel_us(lambda: spec.target.forward_rows(tokens[:, :1], starts, width))
    none = (0, 0.0, 0.0)
    extra = {name: (wide.get(name, none)[0] - narrow.get(name, none)[0],
                    wide.get(name, none)[1] - narrow.get(name, none)[1])
             for name in {*wide, *narrow}}
    parts += [(f"  target {k + 1} vs 1: {n:+d}x {us:+.1f} us {name[:60]}", 0.0, 0)
              for name, (n, us) in sorted(extra.items(), key=lambda kv: -abs(kv[1][1]))
              if n or abs(us) >= 0.5][:12]
    # the whole round's kernels by the time each alone kept the stream busy (``round kernel:``
    # rows; these add up to the round's busy time), beside their own durations, which count
    # the time a kernel overlaps the one before it (programmatic dependent launch) twice
    whole = _graph_kernel_us(lambda: spec.round_core(g, width))
    parts += [(f"  round kernel: {alone:7.1f} us alone ({us:7.1f} us own) {n:3d}x {name[:70]}",
               0.0, 0)
              for name, (n, us, alone) in sorted(whole.items(), key=lambda kv: -kv[1][2])[:20]]
    parts += [(f"whole round at width {w}", _graph_ms(lambda w=w: spec.round_core(g, w)), 0)
              for w in spec._widths if w >= width]
    for t, v in zip((b.ctx_len, b.target_len, b.accepted, b.num_accepted, b.features,
                     b.block_ids), saved, strict=True):
        t.copy_(v)
    return parts


def _eager_step(spec, active, core) -> None:
    """One step with the round run eagerly (same state, same outputs as its replay)."""
    g, width = spec.bucket(active)
    core(g, width)
    spec.emit_round(active, g)


if __name__ == "__main__":
    sys.exit(main())
