"""Tensor parallelism end to end: TP = 2 speculative decoding with the vocab-sharded LM head and
vocab-parallel selection, against TP = 1 and against TP = 2 with the gathered-logits path, in one
run.

On SmolLM2-135M-Instruct with the shipped DSpark drafter, greedy, fixed ``K``, chat template,
stop at EOS, for each batch size ``B`` (``B`` requests in flight, continuous batching):

* ``tp2-spec``: every rank runs the loop; rank ``r`` holds LM head rows ``r*V/2 ..`` and selects
  through one ``[rows, 128]`` pair exchange (no rank holds ``[rows, V]`` logits);
* ``tp2-spec-gather``: the same with ``selection.vocab_parallel = false``: every selection
  all-gathers the logits first (what an engine that gathers the head's output does);
* ``tp2-plain``: TP = 2 plain decoding (``K = 0``), vocab-parallel;
* ``tp1-spec`` / ``tp1-plain``: rank 0 alone after the group is gone, one GPU, rounds captured
  in CUDA graphs where the plan allows (``runtime.cuda_graphs = auto``). ``tp1-plain`` is the
  best plain decoding a user of one GPU has here; every ``vs plain`` ratio is against it.

TP = 2 runs ask for CUDA-graph capture (``--tp-graphs on``, the default on GPUs); where the
plan refuses it, the refusal is printed and the run falls back to eager rounds, said in the
row's note. ``exact`` compares tokens with ``tp1-plain`` (greedy; fp32 is the exact claim, bf16
may part at near-ties). ``floor`` is the plain decoding bound of reading every target weight
once per step at the measured copy bandwidth (``B`` tokens per step), per GPU.

    python benchmarks/tp_e2e.py --out $OUT          # two GPUs: NCCL, rank r on cuda:r
    python benchmarks/tp_e2e.py --smoke             # gloo on the CPU, tiny sizes

The script starts its own ranks (``torch.distributed.run --nproc-per-node N``); under
``torchrun`` already, it runs as the rank it is.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _timing import copy_bandwidth, machine_tag, results_file
from e2e import DATA, _exact, _prompts, _warm_up  # the single-GPU benchmark's helpers


def _config(dtype: str, batch: int, k: int, device: str, vocab_parallel: bool = True,
            graphs: str = "auto") -> Any:
    from draftsmith.cli.common import SHIPPED_DRAFTER
    from draftsmith.runtime.config import SpecConfig

    return SpecConfig.from_dict({
        "drafter": {"family": "dspark-gqa", "checkpoint": str(SHIPPED_DRAFTER)},
        "num_draft_tokens": k,
        "selection": {"kind": "greedy", "vocab_parallel": vocab_parallel},
        "target": {"model": "smollm2-135m", "dtype": dtype, "device": device},
        "runtime": {"max_batch": batch, "max_context": 2048, "cuda_graphs": graphs},
    })


def _load(config_args: tuple, graphs: str, collectives=None, say=print) -> tuple[Any, str]:
    """The decoder for ``config_args`` with ``graphs``; where the plan refuses capture, the
    eager decoder and the refusal (one line) for the row's note."""
    from draftsmith.contract import DraftsmithError
    from draftsmith.runtime.api import load_decoder

    try:
        return load_decoder(_config(*config_args, graphs=graphs), collectives=collectives), ""
    except DraftsmithError as exc:
        if graphs != "on":
            raise
        note = f"graph capture refused ({str(exc).splitlines()[0][:160]}); eager rounds"
        say(f"# {note}")
        return load_decoder(_config(*config_args, graphs="off"), collectives=collectives), note


def _timed(dec, ids: list[list[int]], batch: int, max_new: int) -> Any:
    """One warmed-up call timing the speculative path and then plain decoding (``K = 0``) of
    the same decoder on the same prompts: ``report.spec_tokens_per_s`` / ``plain_tokens_per_s``."""
    _warm_up(dec, ids, batch, max_new, compare_plain=True)
    return dec.generate_ids(ids, max_new, compare_plain=True)


def _tau(report) -> float:
    lengths = [n for r in report.results for n in r.accepted_lengths]
    return sum(lengths) / max(len(lengths), 1)


def _rank_main(args: argparse.Namespace) -> None:
    from draftsmith.contract import SingleRank
    from draftsmith.parallel import init_from_environment
    from draftsmith.runtime.plan import format_plan

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    init_from_environment(device)
    rank, world = dist.get_rank(), dist.get_world_size()
    if device == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dtype = {"bf16": "bfloat16", "fp32": "float32"}[args.dtype]
    lines: list[str] = []
    dev = f"cuda:{rank}" if device == "cuda" else "cpu"
    # a new, time-stamped file per run: nothing already in --out is overwritten
    out_file = (results_file(args.out, "tp_e2e", dev) if args.out is not None and rank == 0
                else None)

    def say(line: str) -> None:
        if rank == 0:
            print(line, flush=True)
            lines.append(line)
            if out_file is not None:  # as it goes: a timeout still leaves the rows so far
                out_file.write_text("\n".join(lines) + "\n")

    say(f"# tp_e2e on {machine_tag(dev)} x{world}, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%dT%H%MZ', time.gmtime())}, {args.dtype}, K = {args.k}, "
        f"{args.max_new_tokens} new tokens, greedy")
    prompts = _prompts(Path(args.data), args.limit)
    rows: list[dict] = []
    tokens: dict[tuple[str, int], list[list[int]]] = {}

    def add(name: str, batch: int, report, note: str = "") -> None:
        plain = name.endswith("plain")
        rate = report.plain_tokens_per_s if plain else report.spec_tokens_per_s
        got = [list(r.plain_tokens if plain else r.tokens) for r in report.results]
        tokens[(name, batch)] = got
        rows.append({"decoding": name, "batch": batch, "tokens_per_s": rate,
                     "tau": _tau(report) if "spec" in name else None, "note": note})
        say(f"  {name:16s} B={batch:<3d} {rate:9.1f} tok/s"
            + (f"  tau {_tau(report):.2f}" if "spec" in name else "") + (f"  {note}" if note
                                                                         else ""))

    # ---- TP = 2: every rank runs these; the tokens are checked equal on every rank ----
    for batch in args.batches:
        base = (dtype, batch, args.k, device)
        dec, note = _load(base, args.tp_graphs, say=say)
        ids = [dec.encode(text) for _, text in prompts]
        if batch == args.batches[0]:
            say("## the TP = 2 plan (rank 0)")
            for line in format_plan(dec.spec.plan).splitlines():
                if any(key in line for key in ("target_head", "vocab_parallel", "selection",
                                               "gather", "markov_vocab", "cuda_graphs")):
                    say("  " + line[:200])
        report = _timed(dec, ids, batch, args.max_new_tokens)
        add("tp2-spec", batch, report, note)
        add("tp2-plain", batch, report, note)
        del dec
        dec, note = _load((dtype, batch, args.k, device, False), args.tp_graphs, say=say)
        report = _timed(dec, ids, batch, args.max_new_tokens)
        gathers = dec.spec.plan.decision("gather_fallbacks").value
        add("tp2-spec-gather", batch, report, (note + "; " if note else "") + "; ".join(gathers))
        del dec
    dist.destroy_process_group()
    if rank != 0:
        return

    # ---- TP = 1 on rank 0's device, after the group is gone ----
    bandwidth = copy_bandwidth(dev)
    for batch in args.batches:
        dec, _ = _load((dtype, batch, args.k, device), "auto", collectives=SingleRank())
        ids = [dec.encode(text) for _, text in prompts]
        report = _timed(dec, ids, batch, args.max_new_tokens)
        add("tp1-spec", batch, report)
        add("tp1-plain", batch, report)
        weights = sum(p.numel() * p.element_size() for p in dec.target.model.parameters())
        floor = batch * bandwidth / weights
        rows.append({"decoding": "floor", "batch": batch, "tokens_per_s": floor, "tau": None,
                     "note": f"{weights / 1e6:.0f} MB of weights read once per step at "
                             f"{bandwidth / 1e9:.0f} GB/s"})
        tokens[("floor", batch)] = tokens[("tp1-plain", batch)]
        del dec

    say("")
    say("| decoding | B | tok/s | tau | vs tp1-plain | vs tp2-spec-gather | vs floor | exact |")
    say("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        b = row["batch"]
        rate = {r["decoding"]: r["tokens_per_s"] for r in rows if r["batch"] == b}
        want = tokens[("tp1-plain", b)]
        got = tokens[(row["decoding"], b)]
        tau = "-" if row["tau"] is None else f"{row['tau']:.2f}"
        say(f"| {row['decoding']} | {b} | {row['tokens_per_s']:.1f} | {tau} | "
            f"{row['tokens_per_s'] / rate['tp1-plain']:.2f}x | "
            f"{row['tokens_per_s'] / rate['tp2-spec-gather']:.2f}x | "
            f"{row['tokens_per_s'] / rate['floor']:.2f} | "
            f"{'-' if row['decoding'] == 'floor' else _exact(got, want)} |")
    for row in rows:
        if row["note"]:
            say(f"- {row['decoding']} B={row['batch']}: {row['note']}")
    if out_file is not None:
        out_file.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="directory for the raw output (tp_e2e_<machine>_<time>.txt/.json)")
    parser.add_argument("--nproc", type=int, default=2, help="ranks (GPUs under NCCL)")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--limit", type=int, default=8, help="prompts per set")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=5, help="drafts per round")
    parser.add_argument("--tp-graphs", default=None, choices=["on", "auto", "off"],
                        help="runtime.cuda_graphs of the TP = 2 runs (default: on with GPUs)")
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--smoke", action="store_true", help="gloo on the CPU, tiny sizes")
    args = parser.parse_args()
    if args.smoke:
        args.batches, args.limit, args.max_new_tokens, args.k = [2], 1, 8, 3
    if args.tp_graphs is None:
        args.tp_graphs = "on" if torch.cuda.is_available() and not args.smoke else "off"
    if "WORLD_SIZE" in os.environ:
        _rank_main(args)
        return 0
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={args.nproc}", str(Path(__file__).resolve()), *sys.argv[1:]]
    return subprocess.run(cmd, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
