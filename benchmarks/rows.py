"""What a plain step and a speculative round cost as rows grow, on one GPU: where the time that
scales with the batch goes.

On a random-weight target of a published shape (``scale.py``'s shapes, SmolLM2-135M by
default; acceptance forced, as there), for each batch ``B`` of ``--batches``: a generation of
``B`` random prompts at batch ``B``, plain (``K = 0``) and speculative (``K = --k``, accepted
length forced to ``--accepted``), and per step:

* ``step``: the median of the decoder's round records (launch to commit; with
  ``runtime.overlap``, commit to commit), once per ``--overlap`` value (default ``auto`` and
  ``off``: the host's share of a step is their difference);
* before the twelfth round, on the live state (restored after): the round's graph replayed alone
  (``replay``), the target's forward of one token a row alone (``fwd1``), and one eager round
  under the torch profiler, its kernels by total time (``--top`` of them).

    python benchmarks/rows.py --out $OUT                       # batches 1 8 32 64 128
    python benchmarks/rows.py --shapes llama-1b --batches 1 32
    python benchmarks/rows.py --smoke                          # the tiny shape on the CPU

Writes ``rows.txt`` and ``rows.json`` to ``--out`` as it goes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _timing import RunLog
from round import _graph_ms
from scale import SHAPES, VOCAB, _tokenizer, build


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _probe(sd: Any, active: Any, top: int) -> dict[str, Any]:
    """Replay, forward and eager kernels of the round that serves ``active``, on live state."""
    b = sd.buffers
    names = ("ctx_len", "target_len", "accepted", "num_accepted", "features", "block_ids")
    saved = {n: getattr(b, n).clone() for n in names}
    g, width = sd.bucket(active)
    view = b.view(g)
    tokens = view.accepted.clamp(min=0)[:, :1].contiguous()
    starts = view.target_len.clone()
    out: dict[str, Any] = {"rows": g, "width": width}
    cuda = torch.cuda.is_available()
    if cuda:
        out["replay_ms"] = _graph_ms(lambda: sd.round_core(g, width))
        out["fwd1_ms"] = _graph_ms(lambda: sd.target.forward_rows(tokens, starts, width))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            sd.round_core(g, width)
            torch.cuda.synchronize()
        events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
        out["kernels"] = sum(e.count for e in events)
        out["kernel_ms"] = sum(e.self_device_time_total for e in events) / 1e3
        out["top"] = [(e.key[:90], e.count, e.self_device_time_total / 1e3)
                      for e in sorted(events, key=lambda e: -e.self_device_time_total)[:top]]
    for n, v in saved.items():
        getattr(b, n).copy_(v)
    return out


def measure(sd: Any, ids: list[list[int]], new_tokens: int, top: int) -> dict[str, Any]:
    """One generation of ``ids`` by ``sd``; its rounds' records; the probe before round 12."""
    probe: dict[str, Any] = {}
    real = sd.launch

    def launch(active: Any, *args: Any, **kwargs: Any) -> Any:
        launches.append(1)
        if not probe and len(launches) == 12:
            probe.update(_probe(sd, active, top))
        return real(active, *args, **kwargs)

    launches: list[int] = []
    sd.launch = launch
    t0 = time.perf_counter()
    try:
        results = sd.generate(ids, new_tokens, [], None)
    finally:
        del sd.launch
    seconds = time.perf_counter() - t0
    tokens = sum(len(r.tokens) for r in results)
    return {"steps": len(sd.rounds), "tokens": tokens, "tok_s": tokens / seconds,
            "step_ms": _median([r.seconds * 1e3 for r in sd.rounds]), **probe}


def _config(family: str, k: int, accepted: int, batch: int, device: str, overlap: str) -> Any:
    from draftsmith.runtime.config import SpecConfig

    return SpecConfig.from_dict({
        "drafter": {"family": family}, "num_draft_tokens": k, "selection": {"kind": "greedy"},
        "target": {"model": "random", "dtype": "bfloat16", "device": device},
        "runtime": {"max_batch": batch, "max_context": 1024, "overlap": overlap,
                    "force_accepted": float(accepted - 1) if k else 0.0},
    })


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["smollm2-135m"], choices=list(SHAPES))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32, 64, 128])
    parser.add_argument("--family", default="dspark-gqa")
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--accepted", type=int, default=4,
                        help="forced accepted length (drafts + bonus) of every round")
    parser.add_argument("--prompt-len", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--overlap", nargs="+", default=["auto", "off"],
                        choices=["auto", "on", "off"], help="runtime.overlap values to run")
    parser.add_argument("--top", type=int, default=12, help="kernels listed per probe")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--smoke", action="store_true", help="the tiny shape on the CPU")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.smoke:
        args.shapes, args.batches, args.new_tokens, args.prompt_len = ["tiny"], [1, 2], 16, 12
    log = RunLog(args.out, "rows", device)
    say, rows = log.say, log.rows

    from draftsmith.runtime.api import load_decoder
    from draftsmith.runtime.targets.hf import HFTarget

    say(f"# rows on {log.machine}, {log.stamp}, commit {log.commit}, torch {torch.__version__}; "
        f"{' '.join(sys.argv)}")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    for shape in args.shapes:
        model = build(shape, dtype, device)
        target = HFTarget(model, max_slots=max(args.batches) + 2)
        g = torch.Generator().manual_seed(1)
        for batch in args.batches:
            ids = [torch.randint(0, VOCAB, (args.prompt_len,), generator=g).tolist()
                   for _ in range(batch)]
            for overlap in args.overlap:
                dec = load_decoder(_config(args.family, args.k, args.accepted, batch, device,
                                           overlap), target=target, tokenizer=_tokenizer())
                for sd in (dec.spec, dec.plain):
                    sd.prepare_for(ids, args.new_tokens)
                dec.generate_ids(ids, 16, compare_plain=True)  # warm: kernels compiled
                for name, sd in (("plain", dec.plain), ("spec", dec.spec)):
                    row = {"shape": shape, "batch": batch, "loop": name,
                           "overlap": sd.plan.overlap,
                           **measure(sd, ids, args.new_tokens, args.top)}
                    rows.append(row)
                    say(f"## {shape} batch {batch} {name}, overlap {sd.plan.overlap}: "
                        f"{row['steps']} steps, {row['tok_s']:.0f} tok/s; step "
                        f"{row['step_ms']:.3f} ms; replay {row.get('replay_ms', 0):.3f} ms, "
                        f"fwd1 {row.get('fwd1_ms', 0):.3f} ms (rows {row.get('rows')}, width "
                        f"{row.get('width')}); {row.get('kernels', 0)} kernels, "
                        f"{row.get('kernel_ms', 0):.3f} ms")
                    for key, count, ms in row.get("top", []):
                        say(f"    {ms:8.3f} ms {count:5d}x  {key}")
                del dec
        del model, target
        if device == "cuda":
            torch.cuda.empty_cache()
    say("| shape | batch | loop | overlap | step ms | replay ms | fwd1 ms | tok/s |")
    say("| --- " * 8 + "|")
    for r in rows:
        say(f"| {r['shape']} | {r['batch']} | {r['loop']} | {r['overlap']} | "
            f"{r['step_ms']:.3f} | {r.get('replay_ms', 0):.3f} | {r.get('fwd1_ms', 0):.3f} | "
            f"{r['tok_s']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
