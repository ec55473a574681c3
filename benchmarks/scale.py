"""Plain and speculative decoding on random-weight targets of real model shapes, 135M to 8B, on
one GPU, against the weight-read floor and transformers with a StaticCache and a CUDA graph.

No real weights of these sizes reach the GPU machine, so each shape is a transformers model
built from its own config class (the published shape of that model) with random weights, SmolLM2's
vocabulary size (49152) and bf16; acceptance is forced (``runtime.force_accepted``), so the
speculative figures are the cost of a round at a known accepted length, not a claim about a
drafter. For each shape, in one run:

* ``floor``: the bytes of every weight, read once, at the copy bandwidth measured in the run
  (read + write counted, so this is half a device copy of the weights); ``read floor``: the
  same for the bytes a plain step reads, which leaves out an untied input embedding table (a
  step reads one row of it a token; tied, the table is the head and read whole);
* ``plain``: draftsmith's plain decoding (``K = 0``), its step captured in a CUDA graph: the
  median time of a step (the decoder's round records: commit to commit where
  ``runtime.overlap`` runs a round ahead, the default with graphs) during a generation of
  ``--prompts`` random prompts of ``--prompt-len`` tokens and ``--new-tokens`` new tokens at batch ``--batch``;
  then the same prompts without graphs, whose tokens should equal the graphed run's (a replay
  runs the eager forward's kernels at the same positions): how many prompts do is printed, and
  a difference is flagged in the shape's summary line;
* ``spec <family>``: speculative decoding with a random drafter of that family's default shape
  for the target, ``K = 7``, accepted length forced to ``--accepted`` (drafts + bonus): the
  median round and tokens/s of the same generation, and the round's cost against a plain step;
* ``recipe``: transformers' own forward with a ``StaticCache``, the one-token step captured in
  one CUDA graph (``benchmarks/e2e.py``'s ``StaticGraphRecipe``);
* ``--gemms``: each of a layer's products alone (cuBLAS against draftsmith's few-row product
  with its norm, add or gate) at 1 to 64 rows against the weights' read floor; with
  ``--sweep``, the few-row product's launch sizes (``block_n`` 16/32/64 x ``block_k`` 256/512 x
  ``split_k`` 1/2/4/8, about 25 launches a product) at ``--sweep-rows`` (1 and 8), the best per
  product and row count against the floor and the default, then a table of them all
  (compile-bound: a few minutes a shape on an H200 with a cold Triton cache);
* ``--profile``: the kernels of one eager plain step, by name;
* ``--few-rows launches persistent step``: the decoding runs under each ``target.few_rows`` in
  turn (the table shows the first; the others print after it, fields ``few_rows_<value>``;
  ``step`` also prints the persistent step's forwards issued, field ``step_forwards``);
  ``--pdl auto off`` the same for ``target.pdl`` (fields ``pdl_<value>``), ``--round-pdl auto
  off`` for ``runtime.pdl`` (the Markov chain's launches; fields ``round_pdl_<value>``).

    python benchmarks/scale.py --out $OUT                         # every shape
    python benchmarks/scale.py --shapes llama-1b --gemms --profile
    python benchmarks/scale.py --shapes llama-1b llama-8b --gemms --sweep --families dflash
    python benchmarks/scale.py --shapes llama-1b llama-8b --few-rows launches persistent
    python benchmarks/scale.py --smoke                            # a tiny shape on the CPU

Writes ``scale.json`` (``rows``: shape, params_b, weight_gb, floor_ms, floor_read_ms, plain_ms,
plain_vs_floor, plain_vs_read_floor, spec_round_ms and spec_round_vs_plain per family, spec_tok_s, recipe_ms, ...) and
``scale.txt`` to ``--out``.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from _timing import RunLog, copy_bandwidth, graph_time_us

VOCAB = 49152
"""SmolLM2's vocabulary, for every shape (the tokenizer the project has)."""


def _rope(theta: float, **scaling: Any) -> dict[str, Any]:
    return {"rope_type": scaling.pop("rope_type", "default"), "rope_theta": theta, **scaling}


_LLAMA3_1B = _rope(500000.0, rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=8192)
_LLAMA3_8B = _rope(500000.0, rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=8192)

SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "smollm2-135m": ("llama", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3,
                                   tie_word_embeddings=True, rope_parameters=_rope(100000.0))),
    "llama-1b": ("llama", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                               num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                               tie_word_embeddings=True, rope_parameters=_LLAMA3_1B)),
    "qwen2-1.5b": ("qwen2", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                 num_attention_heads=12, num_key_value_heads=2,
                                 tie_word_embeddings=True, rope_parameters=_rope(1e6),
                                 use_sliding_window=False)),
    "qwen3-1.7b": ("qwen3", dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                 tie_word_embeddings=True, rope_parameters=_rope(1e6),
                                 use_sliding_window=False)),
    "llama-8b": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                               num_attention_heads=32, num_key_value_heads=8,
                               tie_word_embeddings=False, rope_parameters=_LLAMA3_8B)),
    "qwen3-8b": ("qwen3", dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                               num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                               tie_word_embeddings=False, rope_parameters=_rope(1e6),
                               use_sliding_window=False)),
    "mistral-7b": ("mistral", dict(hidden_size=4096, intermediate_size=14336,
                                   num_hidden_layers=32, num_attention_heads=32,
                                   num_key_value_heads=8, tie_word_embeddings=False,
                                   rope_parameters=_rope(1e6), sliding_window=None)),
    "tiny": ("llama", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2,
                           tie_word_embeddings=False, rope_parameters=_rope(10000.0))),
}
"""Published shapes (hidden, MLP, layers, heads, head width, tied head, RoPE): SmolLM2-135M,
Llama-3.2-1B, Qwen2-1.5B, Qwen3-1.7B, Llama-3.1-8B, Qwen3-8B, Mistral-7B-v0.3; ``tiny`` for
``--smoke``."""

FAMILIES = ("dspark-gqa", "dspark-mla", "dflash")


def build(shape: str, dtype: torch.dtype, device: str, vocab: int = VOCAB) -> torch.nn.Module:
    """A random-weight causal LM of ``shape`` (its transformers config class), on ``device``."""
    import transformers

    arch, kwargs = SHAPES[shape]
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[arch]
    config = config_cls(vocab_size=vocab, max_position_embeddings=8192, bos_token_id=None,
                        eos_token_id=None, pad_token_id=None, **kwargs)
    config._attn_implementation = "sdpa"
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            torch.manual_seed(0)
            model = model_cls(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter, a tied head counted once."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def read_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights a plain step reads: every parameter once, except an untied input
    embedding table, of which a step reads one row a token."""
    table = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    if head is not None and head.weight.data_ptr() == table.data_ptr():
        return weight_bytes(model)
    return weight_bytes(model) - (table.shape[0] - 1) * table.shape[1] * table.element_size()


def _tokenizer() -> Any:
    """What the decoder reads of a tokenizer: no end-of-sequence id (decoding runs to the
    budget) and a ``decode`` for its report."""
    return SimpleNamespace(eos_token_id=None, chat_template=None,
                           decode=lambda ids, skip_special_tokens=True: "")


def _config(family: str, k: int, accepted: int, batch: int, device: str,
            round_pdl: str = "auto", graphs: str = "auto") -> Any:
    from draftsmith.runtime.config import SpecConfig

    return SpecConfig.from_dict({
        "drafter": {"family": family},
        "num_draft_tokens": k,
        "selection": {"kind": "greedy"},
        "target": {"model": "random", "dtype": "bfloat16", "device": device},
        "runtime": {"max_batch": batch, "max_context": 1024, "pdl": round_pdl,
                    "cuda_graphs": graphs,
                    "force_accepted": float(accepted - 1) if k else 0.0},
    })


def _step_times(sd: Any, run: Any, at_step: Any = None) -> tuple[Any, list[float]]:
    """``run()``'s result and the milliseconds of each round ``sd`` took during it, from its
    records (``sd.rounds``: from launch to commit, or with ``runtime.overlap`` from the commit
    before, so the host's work hidden behind the device is not counted twice).
    ``at_step(active)`` runs once, before the twelfth round is launched (on live state)."""
    real = sd.launch
    launches = [0]

    def launch(active: Any, *args: Any, **kwargs: Any) -> Any:
        launches[0] += 1
        if at_step is not None and launches[0] == 12:
            at_step(active)
        return real(active, *args, **kwargs)

    sd.launch = launch
    try:
        out = run()
    finally:
        del sd.launch
    return out, [r.seconds * 1e3 for r in sd.rounds]


def decode(model: torch.nn.Module, args: argparse.Namespace, say: Any,
           few_rows: str = "auto", pdl: str = "auto", round_pdl: str = "auto") -> dict[str, Any]:
    """Plain and speculative generations per drafter family on ``model`` with ``target.few_rows
    = few_rows``, ``target.pdl = pdl`` and ``runtime.pdl = round_pdl``; step figures."""
    from draftsmith.runtime.api import load_decoder
    from draftsmith.runtime.targets.hf import HFTarget

    target = HFTarget(model, max_slots=args.batch + 2, few_rows=few_rows, pdl=pdl)
    say(f"  target path: {target.layer_path}: {target.layer_path_reason}")
    g = torch.Generator().manual_seed(1)
    ids = [torch.randint(0, VOCAB, (args.prompt_len,), generator=g).tolist()
           for _ in range(args.prompts)]
    row: dict[str, Any] = {}
    for family in args.families:
        dec = load_decoder(_config(family, args.k, args.accepted, args.batch, args.device,
                                   round_pdl),
                           target=target, tokenizer=_tokenizer())
        for sd in (dec.spec, dec.plain):  # one cache size for both: no graph goes stale
            sd.prepare_for(ids, args.new_tokens)
        dec.generate_ids(ids[:1], 16, compare_plain=True)  # warm: kernels compiled
        if "plain_ms" not in row:
            report, steps = _step_times(dec.plain, lambda d=dec: d.plain.generate(
                ids, args.new_tokens, [], None))
            tokens = sum(len(r.tokens) for r in report)
            graph_tokens = [list(r.tokens) for r in report]
            row["plain_ms"] = statistics.median(steps)
            row["plain_steps"] = len(steps)
            say(f"  plain: {len(steps)} steps, median {row['plain_ms']:.3f} ms, {tokens} tokens")
        parts: list[Any] = []
        t0 = time.perf_counter()
        results, rounds = _step_times(
            dec.spec, lambda d=dec: d.spec.generate(ids, args.new_tokens, [], None),
            (lambda active, d=dec, parts=parts: parts.extend(_round_parts(d.spec, active)))
            if args.device == "cuda" else None)
        seconds = time.perf_counter() - t0
        tokens = sum(len(r.tokens) for r in results)
        lengths = [n for r in results for n in r.accepted_lengths]
        tau = sum(lengths) / max(len(lengths), 1)
        round_ms = statistics.median(rounds)
        row[f"spec_round_ms_{family}"] = round_ms
        row[f"spec_round_vs_plain_{family}"] = round_ms / row["plain_ms"]
        row[f"spec_tok_s_{family}"] = tokens / seconds
        row[f"tau_{family}"] = tau
        say(f"  spec {family}: {len(rounds)} rounds, median {round_ms:.3f} ms "
            f"({round_ms / row['plain_ms']:.2f}x a plain step), tau {tau:.2f}, "
            f"{tokens / seconds:.0f} tok/s (wall, prefill included)")
        if parts:
            timed = [p for p in parts if " vs 1: " not in p[0] and "round kernel: " not in p[0]]
            row["parts_" + family] = {name: ms for name, ms, _ in timed}
            say("    " + "; ".join(f"{name.strip()} {ms:.3f} ms ({n} kernels)"
                                   for name, ms, n in timed))
            say("    kernels the wider target forward adds: " + "; ".join(
                name.split(": ", 1)[1] for name, _, _ in parts if " vs 1: " in name))
            for name, _, _ in parts:
                if "round kernel: " in name:
                    say("    " + name.strip())
    loop = getattr(target, "_loop", None)
    if loop is not None and loop.step is not None:  # target.few_rows = step took the model
        row["step_forwards"] = loop.step_forwards
        say(f"  persistent step: {loop.step_forwards} forwards issued (a CUDA graph's replays "
            "not counted)")
    # the same target's plain decoding without graphs (on the CPU both runs are eager)
    eager = load_decoder(_config(args.families[0], args.k, args.accepted, args.batch,
                                 args.device, round_pdl, graphs="off"),
                         target=target, tokenizer=_tokenizer())
    eager.plain.prepare_for(ids, args.new_tokens)
    got = [list(r.tokens) for r in eager.plain.generate(ids, args.new_tokens, [], None)]
    same = sum(a == b for a, b in zip(got, graph_tokens, strict=True))
    row["plain_graphs_equal_eager"] = same == len(ids)
    say(f"  plain tokens without CUDA graphs equal to the graphed run's: {same} of {len(ids)} "
        "prompts")
    row["spec_round_vs_plain"] = row[f"spec_round_vs_plain_{args.families[0]}"]
    row["spec_tok_s"] = row[f"spec_tok_s_{args.families[0]}"]
    return row


def _round_parts(spec: Any, active: Any) -> list[tuple[str, float, int]]:
    """The round's parts, each captured and replayed alone on the live state (restored after):
    ``benchmarks/round.py``'s split, its first ten rows, then the kernels the verification's
    forward launches or spends time on beyond the one-token forward's (named ``... vs 1:
    ...``) and the round's costliest kernels (``round kernel: ...``)."""
    from round import _time_parts

    parts = _time_parts(spec, *spec.bucket(active))
    return parts[:10] + [p for p in parts if " vs 1: " in p[0] or "round kernel: " in p[0]]


def recipe(model: torch.nn.Module, args: argparse.Namespace) -> float:
    """Milliseconds per token of transformers' forward, StaticCache, one CUDA graph a step."""
    from e2e import StaticGraphRecipe

    g = torch.Generator().manual_seed(2)
    ids = [torch.randint(0, VOCAB, (args.prompt_len,), generator=g).tolist()
           for _ in range(args.batch)]
    rec = StaticGraphRecipe(model, args.batch, args.prompt_len + args.new_tokens + 8, 0)
    rec.capture(ids[0])
    rec.generate(ids, 8, set())
    _, seconds = rec.generate(ids, args.new_tokens, set())
    return seconds / args.new_tokens * 1e3


def gemms(model: torch.nn.Module, bw: float, sweep_rows: list[int] | None,
          say: Any) -> list[dict[str, Any]]:
    """Each product of one layer (and the head) alone: cuBLAS against the few-row product with
    what it carries, at 1, 8, 16, 32 and 64 rows, against reading its weight once; with
    ``sweep_rows``, :func:`sweep` of the product's launch sizes at those row counts, and a table
    of the best per product and row count. Every timing cycles through
    :func:`weight_copies`, so the weight streams from HBM."""
    from draftsmith.kernels.decode_linear import decode_linear, decode_linear_blocks
    from draftsmith.runtime.targets.hf_layers import LayerLoop

    loop = LayerLoop(model, row_stable=False)
    layer = loop.layers[0]
    head = model.get_output_embeddings().weight
    cases = [
        ("qkv", layer.qkv_weight, {}),
        ("o+add", layer.o_proj.weight, dict(residual=True)),
        ("gate_up+silu", layer.gate_up_weight, dict(gated=True)),
        ("down+add", layer.down_proj.weight, dict(residual=True)),
        ("head (fp32 out)", head, dict(out_dtype=torch.float32)),
    ]
    rows_out, best = [], []
    for name, w, kw in cases:
        floor = w.numel() * w.element_size() / bw * 1e6
        n = w.shape[0] // 2 if kw.get("gated") else w.shape[0]
        ws = weight_copies(w)

        def args(m: int, kw: dict = kw, n: int = n, w: torch.Tensor = w) -> tuple:
            x = torch.randn(m, w.shape[1], dtype=w.dtype, device=w.device)
            extra = dict(kw)
            if extra.pop("residual", False):
                extra["residual"] = torch.randn(m, n, dtype=w.dtype, device=w.device)
            return x, extra

        for m in (1, 8, 16, 32, 64):
            x, extra = args(m)
            nxt = itertools.cycle(ws).__next__
            cublas = graph_time_us(lambda x=x, nxt=nxt: torch.nn.functional.linear(x, nxt()), w.device)
            fused = graph_time_us(lambda x=x, e=extra, nxt=nxt: decode_linear(x, nxt(), **e), w.device)
            rows_out.append(dict(product=name, rows=m, floor_us=floor, cublas_us=cublas,
                                 fused_us=fused))
            say(f"  {name:<20} rows {m:>3}: floor {floor:8.1f} us, cuBLAS (product only) "
                f"{_us(cublas)} ({_ratio(cublas, floor)}), few-row {_us(fused)} "
                f"({_ratio(fused, floor)}) "
                f"{decode_linear_blocks(n, w.shape[1], w.dtype, bool(kw.get('gated')))}")
        if sweep_rows:
            found = sweep(name, ws, n, bool(kw.get("gated")), floor, args, sweep_rows, say)
            best += found
            rows_out.append(dict(product=name, sweep=found))
    if best:
        say("| product | rows | floor us | default us | best us | best / floor | "
            "best / default | best launch |")
        say("| --- " * 8 + "|")
        for r in best:
            say(f"| {r['product']} | {r['rows']} | {r['floor_us']:.1f} | {_us(r['default_us'])} | "
                f"{_us(r['best_us'])} | {_ratio(r['best_us'], r['floor_us'])} | "
                f"{_ratio(r['best_us'], r['default_us'] or float('nan'))} | {r['best']} |")
    return rows_out


def weight_copies(w: torch.Tensor, calls: int = 10, at_least: int = 512 << 20
                  ) -> list[torch.Tensor]:
    """``w`` and copies of it, cycled by the ``calls`` calls of one timed graph, enough that
    together they pass ``at_least`` bytes (2 to ``calls`` of them): each call reads its weight
    from HBM, as a step's layers do. One weight called over and over stays in the L2 cache
    (50 MB on an H100 / H200) and times a 1B layer's products below their floor."""
    size = w.numel() * w.element_size()
    count = max(2, min(calls, -(-at_least // max(size, 1))))
    return [w] + [w.clone() for _ in range(count - 1)]


SWEEP_BLOCK_N = (16, 32, 64)
SWEEP_BLOCK_K = (256, 512)
SWEEP_SPLIT_K = (1, 2, 4, 8)
"""The sweep's launch sizes: column tiles x ``K`` tiles x parts of ``K`` (4 warps, the stages
that fit), about 25 launches a product with the default."""


def sweep_candidates(n: int, k: int, dtype: torch.dtype, gated: bool) -> list[Any]:
    """The default :class:`Blocks` of the product first, then :data:`SWEEP_BLOCK_N` x
    :data:`SWEEP_BLOCK_K` x :data:`SWEEP_SPLIT_K`: ``K`` tiles no wider than ``K``'s power of
    two, and no split that runs as many parts as a smaller one (``split_parts`` clamps to the
    tiles of ``K``): each launch once."""
    import triton

    from draftsmith.kernels.decode_linear import (
        Blocks,
        decode_linear_blocks,
        split_parts,
        stages_for,
    )

    found = [decode_linear_blocks(n, k, dtype, gated)]
    seen = {(found[0].block_n, found[0].block_k, 1, found[0].num_stages)}
    for bn, bk, split in itertools.product(SWEEP_BLOCK_N, SWEEP_BLOCK_K, SWEEP_SPLIT_K):
        bk = min(bk, max(16, triton.next_power_of_2(k)))
        stages = stages_for(bn, bk, dtype, gated)
        key = (bn, bk, split_parts(k, bk, split)[0], stages)
        if key not in seen:
            seen.add(key)
            found.append(Blocks(bn, bk, 4, stages, split))
    return found


def sweep(name: str, ws: list[torch.Tensor], n: int, gated: bool, floor: float, args: Any,
          rows: list[int], say: Any, timer: Any = graph_time_us) -> list[dict[str, Any]]:
    """Every :func:`sweep_candidates` launch of product ``name`` (weights ``ws``: copies of one
    ``[N or 2N, K]``, cycled from call to call, see :func:`weight_copies`;
    ``n`` output columns, ``args(m) -> (x, keywords)``) at each of ``rows``, each timed by
    ``timer`` (a CUDA graph of 10 calls, 20 replays): per row count, the best launch against
    the floor and the default, the runners-up, and every time (``sweep`` in the JSON)."""
    from draftsmith.kernels.decode_linear import decode_linear

    w = ws[0]
    candidates = sweep_candidates(n, int(w.shape[1]), w.dtype, gated)
    out = []
    for m in rows:
        x, extra = args(m)
        nxt = itertools.cycle(ws).__next__
        times = [timer(lambda b=b, x=x, e=extra, nxt=nxt: decode_linear(x, nxt(), **e, blocks=b),
                       w.device, iters=20) for b in candidates]
        ranked = sorted((t, i) for i, t in enumerate(times) if t is not None)
        if not ranked:
            say(f"    sweep {name} rows {m}: no launch could be timed")
            continue
        default = times[0]
        for place, (t, i) in enumerate(ranked[:3]):
            say(f"    sweep {name:<16} rows {m:>2}: {'best' if place == 0 else '    '} "
                f"{t:7.1f} us ({t / floor:.2f}x floor, "
                f"{_ratio(t, default or float('nan'))} default {_us(default)}): {candidates[i]}")
        t, i = ranked[0]
        out.append(dict(product=name, rows=m, floor_us=floor, default_us=default, best_us=t,
                        best=str(candidates[i]),
                        all=[dict(us=u, blocks=str(b)) for u, b in zip(times, candidates, strict=True)]))
    return out


def _us(v: float | None) -> str:
    return "n/a" if v is None else f"{v:8.1f} us"


def _ratio(v: float | None, floor: float) -> str:
    return "n/a" if v is None else f"{v / floor:.2f}x"


def profile(model: torch.nn.Module, batch: int, say: Any) -> None:
    """Kernels of one eager step (``batch`` rows of one token at position 200 over 256
    columns, then the head), few-row path and torch path."""
    from draftsmith.runtime.targets.hf import HFTarget

    target = HFTarget(model, max_slots=batch + 2)
    target.reserve(batch + 2, 512)
    tokens = torch.zeros(batch, 1, dtype=torch.int64, device="cuda")
    starts = torch.full((batch,), 200, dtype=torch.int64, device="cuda")
    dtypes = target._loop.product_dtypes
    for label, few in (("few-row path", dtypes), ("torch path", ())):
        target._loop.product_dtypes = few
        for _ in range(3):
            target.forward_rows(tokens, starts, 256)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            target.forward_rows(tokens, starts, 256)
            torch.cuda.synchronize()
        events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
        replay = graph_time_us(lambda: target.forward_rows(tokens, starts, 256), "cuda")
        say(f"  {label}, {batch} rows: {sum(e.count for e in events)} kernels, "
            f"{sum(e.self_device_time_total for e in events) / 1e3:.3f} ms kernel time, "
            f"{replay / 1e3:.3f} ms a graph replay")
        for e in sorted(events, key=lambda e: -e.self_device_time_total)[:12]:
            say(f"    {e.self_device_time_total / 1e3:8.3f} ms {e.count:5d}x  {e.key[:80]}")
    target._loop.product_dtypes = dtypes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=[s for s in SHAPES if s != "tiny"],
                        choices=list(SHAPES))
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--accepted", type=int, default=4,
                        help="forced accepted length (drafts + bonus) of every round")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--gemms", action="store_true", help="time each product alone")
    parser.add_argument("--profile", nargs="*", type=int, metavar="ROWS",
                        help="kernels of one eager step at these row counts (default 1)")
    parser.add_argument("--no-recipe", action="store_true")
    parser.add_argument("--sweep", action="store_true",
                        help="with --gemms: time the few-row product's launch sizes (block_n, "
                             "block_k, split_k) and print the best per product and row count")
    parser.add_argument("--sweep-rows", nargs="+", type=int, default=[1, 8], metavar="ROWS",
                        help="row counts of --sweep (each a compile of every launch: M = 1 and "
                             "multiples of 16 are specialized)")
    parser.add_argument("--few-rows", nargs="+", default=["auto"],
                        choices=["auto", "launches", "persistent", "step"],
                        help="target.few_rows of the decoding runs; the first fills the table, "
                             "each other is run and printed after it (fields few_rows_<value>)")
    parser.add_argument("--pdl", nargs="+", default=["auto"], choices=["auto", "off"],
                        help="target.pdl of the decoding runs, as --few-rows (fields "
                             "pdl_<value>)")
    parser.add_argument("--round-pdl", nargs="+", default=["auto"], choices=["auto", "off"],
                        help="runtime.pdl of the decoding runs, as --few-rows (fields "
                             "round_pdl_<value>)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--smoke", action="store_true", help="the tiny shape on the CPU")
    args = parser.parse_args()
    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.smoke:
        args.shapes, args.prompts, args.new_tokens, args.prompt_len = ["tiny"], 1, 8, 12
        args.no_recipe = True
    log = RunLog(args.out, "scale", args.device)
    say, rows = log.say, log.rows

    say(f"# scale on {log.machine}, {log.stamp}, commit {log.commit}, torch "
        f"{torch.__version__}; {' '.join(sys.argv)}")
    bw = copy_bandwidth(args.device)
    say(f"# copy bandwidth {bw / 1e12:.2f} TB/s (read + write)")
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    for shape in args.shapes:
        t0 = time.perf_counter()
        model = build(shape, dtype, args.device)
        size = weight_bytes(model)
        floor_ms = size / bw * 1e3
        read_ms = read_bytes(model) / bw * 1e3
        row: dict[str, Any] = {"shape": shape, "params_b": size / model.dtype.itemsize / 1e9,
                               "weight_gb": size / 1e9, "floor_ms": floor_ms,
                               "floor_read_ms": read_ms}
        rows.append(row)
        say(f"## {shape}: {row['params_b']:.2f} B parameters, {size / 1e9:.2f} GB, floor "
            f"{floor_ms:.3f} ms, read floor {read_ms:.3f} ms (built in "
            f"{time.perf_counter() - t0:.1f} s)")
        if args.gemms and args.device == "cuda":
            row["gemms"] = gemms(model, bw, args.sweep_rows if args.sweep else None, say)
        if args.profile is not None and args.device == "cuda":
            for batch in args.profile or [1]:
                profile(model, batch, say)
        first = dict(few_rows=args.few_rows[0], pdl=args.pdl[0], round_pdl=args.round_pdl[0])
        row.update(decode(model, args, say, **first))
        row["plain_vs_floor"] = row["plain_ms"] / floor_ms
        row["plain_vs_read_floor"] = row["plain_ms"] / read_ms
        others = [(field, v, {**first, field: v})
                  for field, values in (("few_rows", args.few_rows), ("pdl", args.pdl),
                                        ("round_pdl", args.round_pdl))
                  for v in values[1:]]
        for field, value, settings in others:
            other = decode(model, args, say, **settings)
            other["plain_vs_floor"] = other["plain_ms"] / floor_ms
            row[f"{field}_{value}"] = other
            name = "runtime.pdl" if field == "round_pdl" else f"target.{field}"
            say(f"  {name} = {value}: plain {other['plain_ms']:.3f} ms = "
                f"{other['plain_vs_floor']:.2f}x floor (first run: {row['plain_ms']:.3f} ms); "
                + ", ".join(f"{f} round {other[f'spec_round_ms_{f}']:.3f} ms = "
                            f"{other[f'spec_round_vs_plain_{f}']:.2f}x plain (first run: "
                            f"{row[f'spec_round_ms_{f}']:.3f} ms)" for f in args.families)
                + ("" if other["plain_graphs_equal_eager"] else
                   "; PLAIN TOKENS WITH CUDA GRAPHS DIFFER FROM EAGER"))
        if not args.no_recipe and args.device == "cuda":
            try:
                row["recipe_ms"] = recipe(model, args)
            except Exception as exc:  # noqa: BLE001 - the baseline's failure is reported
                torch.cuda.synchronize()
                say(f"  recipe failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        say(f"  => plain {row['plain_ms']:.3f} ms = {row['plain_vs_floor']:.2f}x floor "
            f"({row['plain_vs_read_floor']:.2f}x the read floor); "
            + ", ".join(f"{f} round {row[f'spec_round_vs_plain_{f}']:.2f}x plain"
                        for f in args.families)
            + (f"; recipe {row['recipe_ms']:.3f} ms" if "recipe_ms" in row else "")
            + ("" if row["plain_graphs_equal_eager"] else
               "; PLAIN TOKENS WITH CUDA GRAPHS DIFFER FROM EAGER"))
        del model
        torch.cuda.empty_cache() if args.device == "cuda" else None
    say("| shape | params (B) | floor ms | plain ms | plain / floor | plain / read floor | "
        + " | ".join(f"{f} round / plain" for f in args.families)
        + " | spec tok/s | recipe ms |")
    say("| --- " * (8 + len(args.families)) + "|")
    for r in rows:
        say(f"| {r['shape']} | {r['params_b']:.2f} | {r['floor_ms']:.3f} | {r['plain_ms']:.3f} | "
            f"{r['plain_vs_floor']:.2f}x | {r['plain_vs_read_floor']:.2f}x | "
            + " | ".join(f"{r[f'spec_round_vs_plain_{f}']:.2f}x" for f in args.families)
            + f" | {r['spec_tok_s']:.0f} | "
            + (f"{r['recipe_ms']:.3f} |" if "recipe_ms" in r else "- |"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
