"""Tensor-parallel selection, the sharded Markov chain and the dspark-mla TP fusions, per step.

Spawns its own ranks (a :class:`~draftsmith.parallel.RankPool`: NCCL, rank ``r`` on ``cuda:r``;
``--smoke``: gloo on the CPU with tiny sizes) and prints, from rank 0, microseconds per step as
the slowest rank saw them (CUDA events), eager and inside a CUDA graph (10 steps per graph,
replayed), and ratios:

1. Vocab-parallel greedy selection, bf16 logits, ``V = 163840`` split over TP ranks,
   ``B`` in {1, 4, 32, 128, 256} rows:

   * ``fused``: draftsmith's path (``sharded_argmax``): the ``argmax_pair`` Triton kernel writes
     the zero-padded ``[B, 128]`` fp32 staging row of an :class:`ExchangeWorkspace`, one NCCL SUM
     all-reduce, decode;
   * ``gather``: all-gather the bf16 shards (``all_gather_into_tensor``), lay out ``[B, V]``,
     ``torch.argmax``;
   * ``naive``: the pair path from torch ops: ``torch.max``, index writes into a zeroed staging
     row, NCCL all-reduce, decode.

   Target (issue 8, in a graph): ``fused`` no slower than ``gather`` at every ``B`` and at least
   2.5x faster at ``B = 128``; the verdict is printed.
2. The greedy Markov chain, ``K = 6``, ``r = 256``, bf16 head, ``G`` in {1, 4, 32} requests:
   sharded (each rank its ``w2`` rows; per position ``markov_step`` on the shard + one pair
   exchange; and the runtime's ``DraftChain`` with the eager bias) vs the head replicated on
   every rank (all-gather the ``[G, K, S]`` base logits once, then the fused full-vocabulary
   ``markov_chain``, as ``DraftChain`` runs it on one rank).
3. dspark-mla, bf16, one layer of DeepSeek-V3 attention / MLP sizes (H 7168, 128 heads,
   q_lora 1536, kv_lora 512, I 18432, ``n_cap = 5``), ``W = 7``, 1024 context entries per
   request: ``forward_block`` and ``project_context`` with both TP fusions vs without.

    python benchmarks/tp_selection.py --world-size 2 --out benchmarks/results
    python benchmarks/tp_selection.py --world-size 2 --smoke   # gloo on the CPU, tiny sizes

The raw output goes to ``<out>/tp_selection-tp<N>_<machine>_<UTC date-time>.txt``. NVLink
multicast stays off in every NCCL rank (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NVSHMEM_DISABLE_NVLS=1``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(NCCL_ENV)  # inherited by every spawned rank (RankPool sets them again)
if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from _timing import machine_tag, time_us  # noqa: E402

from draftsmith.contract import (  # noqa: E402
    DraftBlockInputs,
    DraftBlockPlacement,
    LogitsShard,
    MarkovHeadKind,
    MarkovHeadWeights,
    PagedContextCache,
    TPFusion,
)
from draftsmith.drafters.mla import (  # noqa: E402
    DSparkMLADrafter,
    MLAConfig,
    mla_tensor_shapes,
)
from draftsmith.kernels.argmax_pair import EXCHANGE_COLUMNS  # noqa: E402
from draftsmith.kernels.markov_chain import (  # noqa: E402
    markov_chain,
    markov_chain_reference,
    markov_step,
    markov_step_reference,
)
from draftsmith.parallel import RankPool, rank_device, world_collectives  # noqa: E402
from draftsmith.runtime.markov import DraftChain  # noqa: E402
from draftsmith.selection.strategies import GreedySelector  # noqa: E402
from draftsmith.selection.vocab_parallel import (  # noqa: E402
    ExchangeWorkspace,
    decode_pairs,
    sharded_argmax,
)

CALLS_PER_GRAPH = 10


# ---- timing helpers (run on every rank, in lockstep) -----------------------------------------


def _align(dev: torch.device) -> None:
    """All ranks idle and together before a measurement."""
    t = torch.zeros(1, device=dev)
    dist.all_reduce(t)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _eager_us(fn: Callable[[], object], dev: torch.device, iters: int) -> float:
    _align(dev)
    return time_us(fn, dev, iters=iters, warmup=max(3, iters // 10))


def _graph_us(fn: Callable[[], object], dev: torch.device, iters: int
              ) -> tuple[float | None, str]:
    """Mean us per call with ``CALLS_PER_GRAPH`` calls captured in one graph, or ``(None, why)``."""
    if dev.type != "cuda":
        return None, "cpu"
    _align(dev)
    why = ""
    try:
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream(dev).wait_stream(side)
        torch.cuda.synchronize(dev)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the NCCL watchdog thread may query events while this thread captures
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            for _ in range(CALLS_PER_GRAPH):
                fn()
    except Exception as exc:  # noqa: BLE001 - reported in the table as n/a with the reason
        torch.cuda.synchronize(dev)
        why = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}"
    # captured collectives only run on replay: replay only if every rank captured
    captured = torch.tensor([0.0 if why else 1.0], device=dev)
    dist.all_reduce(captured)
    if int(captured.item()) != dist.get_world_size():
        return None, why or "capture failed on another rank"
    per_replay = time_us(graph.replay, dev, iters=max(10, iters // 2), warmup=3)
    del graph
    return per_replay / CALLS_PER_GRAPH, ""


def _measure(name: str, fn: Callable[[], object], dev: torch.device, iters: int,
             out: dict[str, tuple[float | None, float | None, str]]) -> None:
    eager = _eager_us(fn, dev, iters)
    graph, why = _graph_us(fn, dev, iters)
    out[name] = (eager, graph, why)


# ---- 1. vocab-parallel selection --------------------------------------------------------------


def _all_gather_into(buf: torch.Tensor, shard: torch.Tensor, tp: int) -> torch.Tensor:
    """Every rank's ``shard`` stacked rank-major into ``buf`` (``tp * shard.numel()`` elements);
    returns ``buf`` viewed ``[TP, *shard.shape]``."""
    if dist.get_backend() == "nccl":
        dist.all_gather_into_tensor(buf, shard)
    else:
        dist.all_gather(list(buf.view(tp, *shard.shape).unbind(0)), shard)
    return buf.view(tp, *shard.shape)


def _gather_rows(shard: torch.Tensor, tp: int, buf: torch.Tensor) -> torch.Tensor:
    """All-gather ``[B, S]`` shards into ``buf: [TP * B, S]`` and lay out the full ``[B, V]``."""
    b, s = shard.shape
    return _all_gather_into(buf, shard, tp).permute(1, 0, 2).reshape(b, tp * s)


def _bench_selection(batches: list[int], vocab: int, iters: int, use_kernel: bool | None) -> dict:
    col, dev = world_collectives(), rank_device()
    tp, rank = col.world_size, col.rank
    s = vocab // tp
    out: dict[str, tuple[float | None, float | None, str]] = {}
    checks: dict[int, bool] = {}
    for b in batches:
        gen = torch.Generator(device=dev).manual_seed(b)
        full = (torch.randn(b, vocab, device=dev, generator=gen) * 3).to(torch.bfloat16)
        shard = LogitsShard(full[:, rank * s:(rank + 1) * s].contiguous(), rank * s, vocab)
        ws = ExchangeWorkspace(max(batches), dev)
        buf = torch.empty(tp * b, s, dtype=torch.bfloat16, device=dev)
        naive_staging = torch.empty(b, EXCHANGE_COLUMNS, dtype=torch.float32, device=dev)

        def fused(shard=shard, ws=ws):
            return sharded_argmax(shard, col, ws, use_kernel)

        def gather(shard=shard, buf=buf):
            return torch.argmax(_gather_rows(shard.logits, tp, buf), dim=1)

        def naive(shard=shard, st=naive_staging):
            vals, idx = torch.max(shard.logits, dim=1)
            st.zero_()
            st[:, 2 * rank] = (idx + shard.vocab_start).to(torch.float32)
            st[:, 2 * rank + 1] = vals.to(torch.float32)
            dist.all_reduce(st)
            return decode_pairs(st, tp)

        want = torch.argmax(full, dim=1)
        checks[b] = all(torch.equal(f(), want) for f in (fused, gather, naive))
        for name, fn in (("fused", fused), ("gather", gather), ("naive", naive)):
            _measure(f"sel/{name}/{b}", fn, dev, iters, out)
        del full, shard, buf
    return {"times": out, "checks": checks}


# ---- 2. Markov chain ----------------------------------------------------------------------------


def _bench_markov(groups: list[int], vocab: int, k: int, r: int, iters: int) -> dict:
    col, dev = world_collectives(), rank_device()
    tp, rank = col.world_size, col.rank
    s = vocab // tp
    lo = rank * s
    cuda = dev.type == "cuda"
    step = markov_step if cuda else markov_step_reference

    def chain_full(base, anchor, w1, w2):
        """The full-vocabulary greedy chain as ``DraftChain`` runs it on one rank."""
        chain = markov_chain if cuda else markov_chain_reference
        return chain(base, anchor, w1, w2, store_corrected=False)
    gen = torch.Generator(device=dev).manual_seed(7)
    w1 = (torch.randn(vocab, r, device=dev, generator=gen) * 0.1).to(torch.bfloat16)
    w2 = (torch.randn(vocab, r, device=dev, generator=gen) * 0.1).to(torch.bfloat16)
    w2_shard = w2[lo:lo + s].contiguous()
    weights = MarkovHeadWeights(MarkovHeadKind.VANILLA, w1, w2_shard, vocab_start=lo)
    out: dict[str, tuple[float | None, float | None, str]] = {}
    checks: dict[int, float] = {}
    for g in groups:
        base_full = torch.randn(g, k, vocab, device=dev, generator=gen) * 2
        base = base_full[:, :, lo:lo + s].contiguous()
        anchor = torch.randint(0, vocab, (g,), device=dev, generator=gen)
        ws = ExchangeWorkspace(g, dev)
        staging = ws.rows(g)
        corrected = torch.empty(g, k, s, dtype=torch.float32, device=dev)
        drafts = torch.empty(g, k, dtype=torch.int64, device=dev)
        gbuf = torch.empty(tp * g, k * s, dtype=torch.float32, device=dev)
        chain = DraftChain(weights, GreedySelector(workspace=ws), col, mode="eager",
                           vocab_size=vocab)

        def sharded_fused(base=base, staging=staging, corrected=corrected, drafts=drafts,
                          anchor=anchor):
            prev = anchor
            for j in range(k):
                val, idx = step(base[:, j], prev, w1, w2_shard, lo, corrected[:, j])
                staging.zero_()
                staging[:, 2 * rank] = idx.to(torch.float32)
                staging[:, 2 * rank + 1] = val
                col.all_reduce(staging)
                prev = decode_pairs(staging, tp)
                drafts[:, j] = prev
            return drafts

        def sharded_chain(base=base, anchor=anchor, chain=chain):
            return chain.run(base, lo, anchor, None)[0]

        def replicated(base=base, anchor=anchor, gbuf=gbuf, g=g):
            full = _all_gather_into(gbuf, base, tp).permute(1, 2, 0, 3).reshape(g, k, vocab)
            return chain_full(full, anchor, w1, w2)[0]

        want = markov_chain_reference(base_full, anchor, w1, w2)[0]
        agree = [float((f() == want).float().mean()) for f in
                 (sharded_fused, sharded_chain, replicated)]
        checks[g] = min(agree)
        for name, fn in (("sharded-fused", sharded_fused), ("sharded-chain", sharded_chain),
                         ("replicated", replicated)):
            _measure(f"markov/{name}/{g}", fn, dev, iters, out)
    return {"times": out, "checks": checks}


# ---- 3. dspark-mla block forward ------------------------------------------------------------------


def _mla_config(smoke: bool) -> MLAConfig:
    if smoke:
        return MLAConfig(num_layers=1, num_heads=8, q_lora_rank=16, kv_lora_rank=16,
                         qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                         intermediate_size=64, block_size=7, markov_rank=0, hidden_size=64,
                         vocab_size=256, target_hidden_size=64, target_layer_ids=(1, 3))
    return MLAConfig(num_layers=1, num_heads=128, q_lora_rank=1536, kv_lora_rank=512,
                     qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                     intermediate_size=18432, block_size=7, markov_rank=0, hidden_size=7168,
                     vocab_size=1024, target_hidden_size=7168,
                     target_layer_ids=(1, 13, 25, 37, 49))


def _random_weights(cfg: MLAConfig, dev: torch.device) -> dict[str, torch.Tensor]:
    """Random full weights made on ``dev`` (same seed on every rank): values do not matter for
    timing, only that every rank shards the same model."""
    gen = torch.Generator(device=dev).manual_seed(0)
    out = {}
    for name, shape in mla_tensor_shapes(cfg).items():
        x = torch.randn(shape, device=dev, generator=gen)
        out[name] = 1.0 + 0.1 * x if name.endswith("norm.weight") else x / math.sqrt(shape[-1])
    return out


def _bench_mla(groups: list[int], ctx_len: int, page_size: int, iters: int, smoke: bool) -> dict:
    col, dev = world_collectives(), rank_device()
    cfg = _mla_config(smoke)
    full = _random_weights(cfg, dev)
    models = {
        "fused": DSparkMLADrafter.from_tensors(cfg, full, col, frozenset(TPFusion),
                                               torch.bfloat16, dev),
        "unfused": DSparkMLADrafter.from_tensors(cfg, full, col, frozenset(), torch.bfloat16,
                                                 dev),
    }
    del full
    active = {k: sorted(f.value for f in m.active_tp_fusions) for k, m in models.items()}
    width = cfg.block_size
    out: dict[str, tuple[float | None, float | None, str]] = {}
    diffs: dict[int, float] = {}
    for g in groups:
        pages = -(-(ctx_len + width + 1) // page_size)
        gen = torch.Generator(device=dev).manual_seed(g)
        tables = torch.arange(g * pages, device=dev).view(g, pages)
        pool = torch.randn(cfg.num_layers, g * pages, 1, 1, page_size, cfg.latent_width,
                           device=dev, generator=gen).to(torch.bfloat16)
        lens = torch.full((g,), ctx_len, device=dev)
        j = torch.arange(width + 1, device=dev)
        cols = lens[:, None] + j
        placement = DraftBlockPlacement(
            slots=torch.arange(g, device=dev), cache_rows=torch.arange(g, device=dev),
            rows_start=None, bonus=torch.ones(g, dtype=torch.int64, device=dev),
            query_positions=lens[:, None] + torch.arange(width, device=dev), ctx_positions=cols,
            write_mask=(j < 1).expand(g, width + 1).contiguous(), dest_cols=cols,
            dest_pages=torch.gather(tables, 1, cols // page_size), dest_offsets=cols % page_size,
            num_ctx=lens.clone(), new_ctx_len=lens.clone(), block_tables=tables,
            page_size=page_size, context_width=ctx_len,
        )
        cache = PagedContextCache(pool=pool, page_size=page_size)
        ids = torch.randint(0, cfg.vocab_size, (g, width), device=dev, generator=gen)
        feats = torch.randn(g * (width + 1), cfg.feature_width, device=dev,
                            generator=gen).to(torch.bfloat16)
        fpos = torch.arange(g * (width + 1), device=dev)
        hidden = {}
        for name, model in models.items():
            emb = model.embed_block(ids)
            inputs = DraftBlockInputs(ids, placement.query_positions, emb)

            def block(model=model, inputs=inputs, placement=placement, cache=cache):
                return model.forward_block(inputs, placement, cache)

            def project(model=model, feats=feats, fpos=fpos):
                return model.project_context(feats, fpos)

            hidden[name] = block().float()
            _measure(f"mla/block-{name}/{g}", block, dev, iters, out)
            _measure(f"mla/project-{name}/{g}", project, dev, iters, out)
        diffs[g] = float((hidden["fused"] - hidden["unfused"]).norm()
                         / hidden["unfused"].norm().clamp_min(1e-30))
    return {"times": out, "checks": diffs, "active": active}


# ---- driver (every rank) ---------------------------------------------------------------------------


def _bench_all(args: dict) -> dict:
    dev = rank_device()
    result: dict = {"machine": machine_tag(dev), "errors": []}
    for key, fn, fargs in (
        ("selection", _bench_selection, (args["batches"], args["vocab"], args["iters"],
                                         args["use_kernel"])),
        ("markov", _bench_markov, (args["groups"], args["vocab"], 6, args["rank_r"],
                                   args["iters"])),
        ("mla", _bench_mla, (args["mla_groups"], args["ctx_len"], args["page_size"],
                             args["iters"], args["smoke"])),
    ):
        t0 = time.perf_counter()
        try:
            result[key] = fn(*fargs)
        except Exception:  # noqa: BLE001 - the other sections still run; reported below
            result["errors"].append(f"{key}:\n{traceback.format_exc()}")
            result[key] = None
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        result[f"{key}_s"] = time.perf_counter() - t0
    return result


def _slowest(results: list[dict], section: str) -> dict[str, tuple[float | None, float | None,
                                                                    str]]:
    """Per measurement, the slowest rank's eager and graph times."""
    merged = {}
    for name in results[0][section]["times"]:
        per_rank = [r[section]["times"][name] for r in results]
        eager = max(p[0] for p in per_rank)
        graphs = [p[1] for p in per_rank]
        graph = None if any(g is None for g in graphs) else max(graphs)
        why = next((p[2] for p in per_rank if p[2]), "")
        merged[name] = (eager, graph, why)
    return merged


def _f(x: float | None) -> str:
    return f"{'n/a':>8}" if x is None else f"{x:8.1f}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{'n/a':>7}" if a is None or b is None or b == 0 else f"{a / b:6.2f}x"


def report(results: list[dict], args: dict, lines: list[str]) -> bool:
    """Append the tables to ``lines``; return whether the issue-8 selection target is met."""
    emit = lines.append
    r0 = results[0]
    ok = True
    for r in results:
        for err in r["errors"]:
            emit(f"ERROR {err}")
            ok = False
    if r0["selection"] is not None:
        t = _slowest(results, "selection")
        emit("")
        emit(f"1. vocab-parallel greedy selection, bf16, V = {args['vocab']}, "
             f"TP = {args['world_size']} (us per step, slowest rank)")
        emit(f"{'B':>5} | {'fused':>8} {'gather':>8} {'naive':>8} | {'g/f':>7} {'n/f':>7} |"
             f" {'fused':>8} {'gather':>8} {'naive':>8} | {'g/f':>7} {'n/f':>7} | tokens")
        emit(f"{'':>5} | {'eager':^26} | {'':>15} | {'CUDA graph':^26} | {'':>15} |")
        verdicts = []
        for b in args["batches"]:
            fe, fg, _ = t[f"sel/fused/{b}"]
            ge, gg, _ = t[f"sel/gather/{b}"]
            ne, ng, _ = t[f"sel/naive/{b}"]
            same = all(r["selection"]["checks"][b] for r in results)
            emit(f"{b:>5} | {_f(fe)} {_f(ge)} {_f(ne)} | {_ratio(ge, fe)} {_ratio(ne, fe)} |"
                 f" {_f(fg)} {_f(gg)} {_f(ng)} | {_ratio(gg, fg)} {_ratio(ng, fg)} |"
                 f" {'equal' if same else 'DIFFER'}")
            ok &= same
            if fg is not None and gg is not None:
                verdicts.append((b, fg, gg))
        whys = {why for _, _, why in t.values() if why and why != "cpu"}
        for why in sorted(whys):
            emit(f"  graph capture failed: {why}")
        if verdicts:
            never_slower = all(fg <= gg for _, fg, gg in verdicts)
            at128 = [gg / fg for b, fg, gg in verdicts if b == 128]
            emit(f"  target, in a graph: fused <= gather at every B: "
                 f"{'PASS' if never_slower else 'FAIL'}; fused >= 2.5x faster at B = 128: "
                 + (f"{'PASS' if at128[0] >= 2.5 else 'FAIL'} ({at128[0]:.2f}x)" if at128
                    else "not measured"))
            ok &= never_slower and (not at128 or at128[0] >= 2.5)
        else:
            emit("  target, in a graph: not measured (no CUDA graph timings)")
    if r0["markov"] is not None:
        t = _slowest(results, "markov")
        emit("")
        emit(f"2. greedy Markov chain, K = 6, r = {args['rank_r']}, bf16 head, V = {args['vocab']},"
             f" TP = {args['world_size']} (us per chain, slowest rank)")
        emit(f"{'G':>5} | {'shard-f':>8} {'shard-c':>8} {'replic':>8} | {'r/sf':>7} |"
             f" {'shard-f':>8} {'shard-c':>8} {'replic':>8} | {'r/sf':>7} | agree")
        emit(f"{'':>5} | {'eager':^26} | {'':>7} | {'CUDA graph':^26} | {'':>7} |")
        for g in args["groups"]:
            sfe, sfg, _ = t[f"markov/sharded-fused/{g}"]
            sce, scg, _ = t[f"markov/sharded-chain/{g}"]
            re_, rg, _ = t[f"markov/replicated/{g}"]
            agree = min(r["markov"]["checks"][g] for r in results)
            emit(f"{g:>5} | {_f(sfe)} {_f(sce)} {_f(re_)} | {_ratio(re_, sfe)} |"
                 f" {_f(sfg)} {_f(scg)} {_f(rg)} | {_ratio(rg, sfg)} | {agree:.3f}")
        emit("  shard-f: markov_step on the shard + pair exchange per position; shard-c: the "
             "runtime's DraftChain (eager bias); replic: all-gather base + fused full chain")
        emit("  agree: fraction of drafts equal to the fp32 reference chain (fused bias rounding "
             "may flip near-ties, spec 9.20)")
    if r0["mla"] is not None:
        t = _slowest(results, "mla")
        emit("")
        emit(f"3. dspark-mla, bf16, 1 layer (H 7168, 128 heads, I 18432, n_cap 5), W = 7, "
             f"{args['ctx_len']} context entries, TP = {args['world_size']}"
             + (" [smoke: tiny config]" if args["smoke"] else ""))
        emit(f"   active fusions: {r0['mla']['active']}")
        emit(f"{'G':>5} | {'op':<8} | {'fused':>8} {'unfused':>8} {'u/f':>7} | "
             f"{'fused':>8} {'unfused':>8} {'u/f':>7} | rel diff")
        emit(f"{'':>5} | {'':<8} | {'eager':^25} | {'CUDA graph':^25} |")
        for g in args["mla_groups"]:
            for op in ("block", "project"):
                fe, fg, _ = t[f"mla/{op}-fused/{g}"]
                ue, ug, _ = t[f"mla/{op}-unfused/{g}"]
                diff = max(r["mla"]["checks"][g] for r in results) if op == "block" else None
                emit(f"{g:>5} | {op:<8} | {_f(fe)} {_f(ue)} {_ratio(ue, fe)} | {_f(fg)} {_f(ug)} "
                     f"{_ratio(ug, fg)} | " + (f"{diff:.2e}" if diff is not None else ""))
        emit("  project: project_context of G * 8 rows (fc split + fused all-reduce/hidden_norm "
             "vs replicated fc)")
    emit("")
    emit("section seconds (rank 0): " + ", ".join(
        f"{k} {r0[f'{k}_s']:.1f}" for k in ("selection", "markov", "mla")))
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="directory for the raw output")
    parser.add_argument("--smoke", action="store_true", help="gloo on the CPU, tiny sizes")
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=420.0,
                        help="seconds before the ranks are stopped (a hung collective)")
    ns = parser.parse_args(argv)
    smoke = ns.smoke
    args = {
        "world_size": ns.world_size,
        "smoke": smoke,
        "batches": [1, 4] if smoke else [1, 4, 32, 128, 256],
        "vocab": 1024 if smoke else 163840,
        "use_kernel": None,  # the Triton kernel on CUDA, the eager reference on the CPU
        "iters": ns.iters or (3 if smoke else 100),
        "groups": [1, 2] if smoke else [1, 4, 32],
        "rank_r": 8 if smoke else 256,
        "mla_groups": [1, 2] if smoke else [1, 32],
        "ctx_len": 16 if smoke else 1024,
        "page_size": 4 if smoke else 64,
    }
    backend = "gloo" if smoke else "nccl"
    if backend == "nccl" and torch.cuda.device_count() < ns.world_size:
        print(f"needs {ns.world_size} GPUs, found {torch.cuda.device_count()}; use --smoke on "
              "the CPU", file=sys.stderr)
        return 2
    started = _dt.datetime.now(_dt.UTC)
    with RankPool(ns.world_size, backend=backend, timeout_s=ns.timeout, error_grace_s=60.0) as pool:
        results = pool.run(_bench_all, args)
    lines = [f"tp_selection.py world_size={ns.world_size} backend={backend} machine="
             f"{results[0]['machine']} torch={torch.__version__} started {started:%Y-%m-%dT%H:%MZ}"
             f" env: " + " ".join(f"{k}={v}" for k, v in NCCL_ENV.items())]
    ok = report(results, args, lines)
    text = "\n".join(lines)
    print(text, flush=True)
    if ns.out is not None:
        stamp = started.strftime("%Y%m%d-%H%M%S")
        path = ns.out / f"tp_selection-tp{ns.world_size}_{results[0]['machine']}_{stamp}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
        print(f"raw output: {path}")
    return 0 if ok or smoke else 1


if __name__ == "__main__":
    sys.exit(main())
