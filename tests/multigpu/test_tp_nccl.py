"""Tensor parallelism on real process groups: the same tests on gloo (CPU) and NCCL (GPUs).

Every test takes the module's ``pool``: gloo groups of 2, 4 and 8 processes on the CPU (always
run), and NCCL groups of the sizes the machine has GPUs for (marked ``gpu``; rank ``r`` on
``cuda:r``). Each rank holds only its shard and must reproduce the TP = 1 answer:

* vocab-parallel argmax (pair exchange, SUM and gather) == ``torch.argmax`` of the full row;
* Gumbel-max sampling (pair exchange) and top-k sampling == the TP = 1 sample with the same key;
* rejection sampling of a sharded draft / target == TP = 1 with the same keys;
* the sharded Markov chain == the full-vocabulary chain (tokens equal, logits ``assert_close``);
* dspark-mla with both TP fusions (and without) == the one-rank drafter;
* NCCL only: the pair exchange (argmax and Gumbel sampling) captured in one CUDA graph and
  replayed on fresh logits.

On the GPU host: ``pytest -m gpu tests/multigpu``. Shapes are small on the CPU (the whole
module, 14 processes started in all, runs in about a minute on two cores) and larger on GPUs,
where the Triton pair kernels run with several chunks per row.
"""

from __future__ import annotations

import pytest
import torch

from draftsmith.contract import (
    DraftBlockInputs,
    DraftBlockPlacement,
    LogitsShard,
    MarkovHeadKind,
    MarkovHeadWeights,
    OutputHead,
    PagedContextCache,
    SamplingKey,
    SingleRank,
    TPFusion,
)
from draftsmith.drafters.mla import DSparkMLADrafter, MLAConfig, YarnRope, random_mla_tensors
from draftsmith.drafters.tp import fc_split_columns
from draftsmith.parallel import RankPool, rank_device, world_collectives
from draftsmith.runtime.markov import DraftChain
from draftsmith.selection.configs import SampleConfig
from draftsmith.selection.rejection import rejection_sample
from draftsmith.selection.strategies import GreedySelector, SampleSelector
from draftsmith.selection.vocab_parallel import (
    ExchangeWorkspace,
    sharded_argmax,
    sharded_gumbel_sample,
)

ROWS = 10


def _pool_params() -> list:
    # gloo at 2 and 4 ranks on the CPU: 8 processes on the CI machine's two cores cost 40 s
    # and cover nothing 4 does not; NCCL runs 2, 4 and 8 where the GPUs are
    params = [pytest.param(("gloo", n), id=f"gloo{n}") for n in (2, 4)]
    for n in (2, 4, 8):
        marks = [pytest.mark.gpu, pytest.mark.skipif(
            torch.cuda.device_count() < n, reason=f"NCCL TP={n} needs {n} GPUs")]
        params.append(pytest.param(("nccl", n), id=f"nccl{n}", marks=marks))
    return params


@pytest.fixture(scope="module", params=_pool_params())
def pool(request: pytest.FixtureRequest):
    """One pool per (backend, TP) for the whole module; pytest orders the tests by parameter,
    so only one pool is alive at a time."""
    backend, world_size = request.param
    with RankPool(world_size, backend=backend, timeout_s=240.0) as p:
        yield p


def _vocab(pool: RankPool) -> int:
    """Vocabulary of the selection tests: small on the CPU, several kernel chunks on GPUs."""
    return 1024 if pool.backend == "gloo" else 8 * 8192


# ---- inputs ----------------------------------------------------------------------------------


def nan_with(payload: int) -> float:
    return float(torch.tensor([payload], dtype=torch.int32).view(torch.float32)[0])


def adversarial_logits(rows: int, v: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """bf16-rounded random rows plus the order-T cases (NaN, ±inf, ties, ±0) placed on the shard
    borders of TP 2, 4 and 8."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, v, generator=g) * 3).to(torch.bfloat16).float()
    q = v // 8
    x[0, 3 * q + 2] = nan_with(0x7FC00001)
    x[0, 6 * q] = float("nan")  # the first NaN wins
    x[1] = float("-inf")  # -> id 0
    x[2, [4 * q - 1, 4 * q, 2 * q, v - 1]] = 50.0  # ties across shard borders -> 2q
    x[3] = -1.0
    x[3, 4 * q] = -0.0
    x[3, 6 * q + 1] = 0.0  # -0.0 == +0.0 -> the lower id
    x[4, 0] = float("inf")
    x[4, 7 * q] = float("nan")  # NaN on the last rank beats +inf on rank 0
    x[5] = 0.5  # all equal -> 0
    x[6, v - 1] = float("inf")
    x[6, q] = float("inf")  # +inf ties -> q
    return x.to(dtype)


def random_logits(shape: tuple[int, ...], seed: int, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).float()


def make_key(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2**62, (rows,), generator=g),
            torch.randint(0, 2**31, (rows,), generator=g))


def shard_cols(full: torch.Tensor, rank: int, tp: int) -> tuple[torch.Tensor, int]:
    """Rank ``rank``'s contiguous columns of ``full: [..., V]`` and their first global id."""
    s = full.shape[-1] // tp
    return full[..., rank * s:(rank + 1) * s].contiguous(), rank * s


def _shard(full: torch.Tensor, col) -> LogitsShard:
    logits, start = shard_cols(full, col.rank, col.world_size)
    return LogitsShard(logits, start, full.shape[-1])


# ---- rank workers (module level: spawned ranks unpickle them by name) -----------------------


def _argmax_worker(full_cpu: torch.Tensor, method: str, use_kernel: bool | None,
                   ws_rows: int) -> torch.Tensor:
    col, dev = world_collectives(), rank_device()
    shard = _shard(full_cpu.to(dev), col)
    ws = ExchangeWorkspace(ws_rows, dev) if ws_rows else None
    return sharded_argmax(shard, col, ws, use_kernel, method).cpu()


def _gumbel_worker(full_cpu: torch.Tensor, temps_cpu: torch.Tensor, seeds: torch.Tensor,
                   offsets: torch.Tensor, configs: list[SampleConfig]) -> dict:
    """Pair-exchange Gumbel sampling and the selectors, each next to its TP = 1 twin on the same
    device."""
    col, dev = world_collectives(), rank_device()
    full, temps = full_cpu.to(dev), temps_cpu.to(dev)
    key = SamplingKey(seeds.to(dev), offsets.to(dev))
    ws = ExchangeWorkspace(full.shape[0], dev)
    out = {
        "tp": sharded_gumbel_sample(_shard(full, col), temps, key, 1, col, ws).cpu(),
        "tp1": sharded_gumbel_sample(LogitsShard.full(full), temps, key, 1, SingleRank()).cpu(),
        "selectors": [],
    }
    for cfg in configs:
        sel = SampleSelector(cfg, workspace=ws)
        out["selectors"].append((
            sel.route(col.world_size, full.shape[1]).kind,
            sel.select(_shard(full, col), key, 0, col).cpu(),
            SampleSelector(cfg).select(LogitsShard.full(full), key, 0, SingleRank()).cpu(),
        ))
    return out


def _rejection(col, draft_logits: torch.Tensor, target_logits: torch.Tensor, cfg: SampleConfig,
               key: SamplingKey, verify_len: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Drafts sampled from the (sharded) draft logits, then rejection sampling against the
    (sharded, gathered for the probabilities) target logits."""
    g, k, v = draft_logits.shape
    sel = SampleSelector(cfg)
    flat_draft = draft_logits.reshape(g * k, v)
    j = torch.arange(k, device=draft_logits.device)
    draft_key = SamplingKey(key.seeds.repeat_interleave(k),
                            (key.offsets[:, None] + j).reshape(-1))
    split = col.world_size > 1
    d_shard = _shard(flat_draft, col) if split else LogitsShard.full(flat_draft)
    t_flat = target_logits.reshape(g * (k + 1), v)
    t_shard = _shard(t_flat, col) if split else LogitsShard.full(t_flat)
    drafts = sel.select(d_shard, draft_key, 1, col).view(g, k)
    q = sel.probs(d_shard, col).view(g, k, v)
    p = sel.probs(t_shard, col).view(g, k + 1, v)
    accepted, n = rejection_sample(drafts, q, p, key, verify_len)
    return drafts.cpu(), accepted.cpu(), n.cpu()


def _rejection_worker(draft_cpu, target_cpu, cfg, seeds, offsets, verify_len):
    col, dev = world_collectives(), rank_device()
    key = SamplingKey(seeds.to(dev), offsets.to(dev))
    args = (draft_cpu.to(dev), target_cpu.to(dev), cfg, key, verify_len.to(dev))
    return _rejection(col, *args), _rejection(SingleRank(), *args)


def _markov_worker(base_cpu, w1_cpu, w2_cpu, anchor_cpu, sampled: bool, seeds, offsets):
    """The sharded chain on this rank's rows of ``w2`` and columns of ``base``, and the full chain
    (TP = 1) on the same device."""
    col, dev = world_collectives(), rank_device()
    base, w1, w2, anchor = (t.to(dev) for t in (base_cpu, w1_cpu, w2_cpu, anchor_cpu))
    v = base.shape[-1]
    key = SamplingKey(seeds.to(dev), offsets.to(dev)) if sampled else None
    ws = ExchangeWorkspace(base.shape[0], dev)

    def selector():
        return (SampleSelector(SampleConfig(temperature=0.8), workspace=ws) if sampled
                else GreedySelector(workspace=ws))

    shard_base, lo = shard_cols(base, col.rank, col.world_size)
    s = shard_base.shape[-1]
    weights = MarkovHeadWeights(MarkovHeadKind.VANILLA, w1, w2[lo:lo + s].contiguous(),
                                vocab_start=lo)
    chain = DraftChain(weights, selector(), col, mode="eager", vocab_size=v)
    drafts, corrected = chain.run(shard_base, lo, anchor, key)
    full_w = MarkovHeadWeights(MarkovHeadKind.VANILLA, w1, w2)
    full = DraftChain(full_w, selector(), SingleRank(), mode="eager", vocab_size=v)
    full_drafts, full_corrected = full.run(base, 0, anchor, key)
    return (drafts.cpu(), col.all_gather(corrected, dim=-1).cpu(), full_drafts.cpu(),
            full_corrected.cpu())


# ---- dspark-mla --------------------------------------------------------------------------------

PAGE_SIZE = 4
CTX_LENS = (5, 1, 11)


def mla_config(n_cap: int, hidden: int = 24) -> MLAConfig:
    """8 heads, intermediate 32 and vocabulary 64: every size splits over TP 2, 4 and 8."""
    return MLAConfig(
        num_layers=2, num_heads=8, q_lora_rank=20, kv_lora_rank=16, qk_nope_head_dim=8,
        qk_rope_head_dim=6, v_head_dim=10, intermediate_size=32, block_size=4, mask_token_id=3,
        markov_rank=4, rope=YarnRope(theta=50.0, factor=4.0, original_max_position_embeddings=16,
                                     mscale=0.8, mscale_all_dim=1.0),
        hidden_size=hidden, vocab_size=64, target_hidden_size=hidden,
        target_layer_ids=tuple(range(1, 1 + 2 * n_cap, 2)),
    )


def _mla_block(model: DSparkMLADrafter, cfg: MLAConfig, dev: torch.device) -> torch.Tensor:
    """Block hidden ``[G, W, H]`` over paged context projected by ``model`` itself."""
    gen = torch.Generator().manual_seed(5)
    width = cfg.block_size
    g = len(CTX_LENS)
    lens = torch.tensor(CTX_LENS)
    pages = -(-(max(CTX_LENS) + width + 1) // PAGE_SIZE)
    tables = torch.randperm(g * pages + 2, generator=gen)[:g * pages].view(g, pages)
    pool = torch.full((cfg.num_layers, g * pages + 2, 1, 1, PAGE_SIZE, cfg.latent_width),
                      float("nan"), dtype=model.dtype, device=dev)
    for b, n in enumerate(CTX_LENS):
        feats = torch.randn(n, cfg.feature_width, generator=gen).to(dev)
        cols = torch.arange(n)
        latents = model.project_context(feats, cols.to(dev))
        for layer in range(cfg.num_layers):
            pool[layer, tables[b, cols // PAGE_SIZE].to(dev), 0, 0, (cols % PAGE_SIZE).to(dev)] = (
                latents[:, layer, 0, 0])
    ids = torch.full((g, width), cfg.mask_token_id)
    ids[:, 0] = torch.randint(0, cfg.vocab_size, (g,), generator=gen)
    positions = lens[:, None] + torch.arange(width)
    j = torch.arange(width + 1)
    cols = lens[:, None] + j
    placement = DraftBlockPlacement(
        slots=torch.arange(g), cache_rows=torch.arange(g), rows_start=None, bonus=ids[:, 0],
        query_positions=positions, ctx_positions=cols,
        write_mask=(j < 1).expand(g, width + 1).clone(), dest_cols=cols,
        dest_pages=torch.gather(tables, 1, cols // PAGE_SIZE), dest_offsets=cols % PAGE_SIZE,
        num_ctx=lens.clone(), new_ctx_len=lens.clone(), block_tables=tables, page_size=PAGE_SIZE,
    ).to(dev)
    ids, positions = ids.to(dev), positions.to(dev)
    inputs = DraftBlockInputs(ids, positions, model.embed_block(ids))
    return model.forward_block(inputs, placement, PagedContextCache(pool=pool, page_size=PAGE_SIZE))


def _mla_worker(n_cap: int, hidden: int) -> dict:
    col, dev = world_collectives(), rank_device()
    cfg = mla_config(n_cap, hidden)
    tensors = random_mla_tensors(cfg, seed=21)
    every = frozenset(TPFusion)
    fused = DSparkMLADrafter.from_tensors(cfg, tensors, col, every, torch.float32, dev)
    stock = DSparkMLADrafter.from_tensors(cfg, tensors, col, frozenset(), torch.float32, dev)
    single = DSparkMLADrafter.from_tensors(cfg, tensors, SingleRank(), every, torch.float32, dev)
    feats = torch.randn(7, cfg.feature_width, generator=torch.Generator().manual_seed(3)).to(dev)
    pos = torch.arange(7, device=dev) * 3
    head = torch.randn(cfg.vocab_size, cfg.hidden_size,
                       generator=torch.Generator().manual_seed(23)).to(dev)
    h_fused, h_stock, h_single = (_mla_block(m, cfg, dev) for m in (fused, stock, single))
    s = cfg.vocab_size // col.world_size
    shard_head = OutputHead(head[col.rank * s:(col.rank + 1) * s].contiguous(), col.rank * s,
                            cfg.vocab_size)
    logits = fused.block_logits(h_fused.reshape(-1, cfg.hidden_size), shard_head).logits
    return {
        "active": fused.active_tp_fusions,
        "fc_columns": fused.fc_columns,
        "latent_fused": fused.project_context(feats, pos).cpu(),
        "latent_single": single.project_context(feats, pos).cpu(),
        "h_fused": h_fused.cpu(), "h_stock": h_stock.cpu(), "h_single": h_single.cpu(),
        "logits": col.all_gather(logits, dim=1).cpu(),
        "logits_single": single.block_logits(h_single.reshape(-1, cfg.hidden_size),
                                             OutputHead(head, 0, cfg.vocab_size)).logits.cpu(),
    }


# ---- CUDA graph (NCCL) -----------------------------------------------------------------------


def _graph_worker(fulls_cpu: list[torch.Tensor], temps_cpu: torch.Tensor, seeds: torch.Tensor,
                  offsets: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
    """Capture argmax + Gumbel sampling (two pair exchanges) once; replay on each of ``fulls``.

    Returns per input ``(graph argmax, graph sample, eager sample at TP = 1 on this device)``.
    """
    col, dev = world_collectives(), rank_device()
    rows = fulls_cpu[0].shape[0]
    static = _shard(fulls_cpu[0].to(dev), col)
    temps = temps_cpu.to(dev)
    key = SamplingKey(seeds.to(dev), offsets.to(dev))
    ws_argmax, ws_sample = ExchangeWorkspace(rows, dev), ExchangeWorkspace(rows, dev)

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        return (sharded_argmax(static, col, ws_argmax),
                sharded_gumbel_sample(static, temps, key, 1, col, ws_sample))

    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(2):  # Triton compilation and allocations, outside the capture
            step()
    torch.cuda.current_stream(dev).wait_stream(side)
    torch.cuda.synchronize(dev)
    graph = torch.cuda.CUDAGraph()
    # thread_local: the NCCL watchdog thread may query events while this thread captures
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        tokens, sampled = step()
    out = []
    for i, full_cpu in enumerate(fulls_cpu):
        full = full_cpu.to(dev)
        static.logits.copy_(_shard(full, col).logits)
        key.offsets.copy_(offsets.to(dev) + i)  # fresh draws each replay
        graph.replay()
        torch.cuda.synchronize(dev)
        fresh_key = SamplingKey(seeds.to(dev), offsets.to(dev) + i)
        want = sharded_gumbel_sample(LogitsShard.full(full), temps, fresh_key, 1, SingleRank())
        out.append((tokens.cpu().clone(), sampled.cpu().clone(), want.cpu()))
    return out


# ---- tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("method", ["sum", "gather"])
def test_vocab_parallel_argmax_equals_torch_argmax(pool: RankPool, dtype, method: str) -> None:
    full = adversarial_logits(ROWS, _vocab(pool), seed=pool.world_size, dtype=dtype)
    want = torch.argmax(full, dim=1)
    for token in pool.run(_argmax_worker, full, method, None, ROWS):
        assert torch.equal(token, want)


def test_vocab_parallel_argmax_triton_kernel_and_overflow(pool: RankPool) -> None:
    """The Triton pair kernel (interpreted on the CPU); a 4-row workspace makes 10 rows take the
    gather exchange, 3 rows the SUM exchange."""
    full = adversarial_logits(ROWS, _vocab(pool), seed=7, dtype=torch.bfloat16)
    for rows in (ROWS, 3):
        want = torch.argmax(full[:rows], dim=1)
        for token in pool.run(_argmax_worker, full[:rows].contiguous(), "auto", True, 4):
            assert torch.equal(token, want)


SAMPLE_CONFIGS = [
    (SampleConfig(temperature=0.9), "gumbel_pairs"),
    (SampleConfig(temperature=1.2, top_k=7), "topk_candidates"),
    (SampleConfig(temperature=0.6, top_k=40, top_p=0.8), "topk_candidates"),
    (SampleConfig(temperature=1.0, top_p=0.7), "gather"),
    (SampleConfig(temperature=0.0), "pair_argmax"),
]


def test_gumbel_sampling_equals_tp1(pool: RankPool) -> None:
    v = _vocab(pool)
    full = random_logits((ROWS, v), seed=21)
    temps = torch.tensor([0.8, 1.0, 0.0, 1.5, 0.3, 2.0, 0.7, 1.0, 0.0, 5.0])
    seeds, offsets = make_key(ROWS, seed=3)
    results = pool.run(_gumbel_worker, full, temps, seeds, offsets,
                       [c for c, _ in SAMPLE_CONFIGS])
    for r in results:
        assert torch.equal(r["tp"], r["tp1"])
        assert torch.equal(r["tp"], results[0]["tp"])  # identical on every rank
        for (route, got, want), (_, want_route) in zip(r["selectors"], SAMPLE_CONFIGS,
                                                       strict=True):
            assert route == want_route
            assert torch.equal(got, want)
    greedy = torch.argmax(full, dim=1)
    tokens = results[0]["tp"]
    assert torch.equal(tokens[temps == 0], greedy[temps == 0])
    assert not torch.equal(tokens, greedy)  # sampling happened
    if pool.backend == "gloo":  # TP = 1 on the CPU, computed here, bit for bit
        key = SamplingKey(seeds, offsets)
        assert torch.equal(tokens, sharded_gumbel_sample(LogitsShard.full(full), temps, key, 1,
                                                         SingleRank()))


def test_rejection_sampling_equals_tp1(pool: RankPool) -> None:
    g, k, v = 6, 4, _vocab(pool)
    target = random_logits((g, k + 1, v), seed=31, scale=1.5)
    draft = (target[:, :k] + random_logits((g, k, v), seed=32, scale=0.5)).contiguous()
    seeds, offsets = make_key(g, seed=33)
    verify_len = torch.tensor([4, 4, 2, 4, 0, 3])
    cfg = SampleConfig(temperature=0.9)
    results = pool.run(_rejection_worker, draft, target, cfg, seeds, offsets, verify_len)
    for tp, tp1 in results:
        for a, b in zip(tp, tp1, strict=True):
            assert torch.equal(a, b)
        for a, b in zip(tp, results[0][0], strict=True):
            assert torch.equal(a, b)
    drafts, accepted, n = results[0][0]
    assert torch.all(n <= verify_len + 1) and torch.all(n >= 1)
    assert int(n.min()) < int(n.max())  # some blocks rejected early, some accepted further
    for b in range(g):
        a = int(n[b]) - 1
        assert torch.equal(accepted[b, :a], drafts[b, :a]) and bool((accepted[b, a + 1:] == -1).all())


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_sharded_markov_chain_equals_full_chain(pool: RankPool, sampled: bool) -> None:
    g, k, v, r = 3, 6, _vocab(pool) // 4, 8
    base = random_logits((g, k, v), seed=41)
    gen = torch.Generator().manual_seed(42)
    w1 = torch.randn(v, r, generator=gen) * 0.5
    w2 = torch.randn(v, r, generator=gen) * 0.5
    anchor = torch.tensor([3, -1, v - 1])  # -1: a zero bias
    seeds, offsets = make_key(g, seed=43)
    results = pool.run(_markov_worker, base, w1, w2, anchor, sampled, seeds, offsets)
    for drafts, corrected, full_drafts, full_corrected in results:
        assert torch.equal(drafts, full_drafts)
        assert torch.equal(drafts, results[0][0])
        torch.testing.assert_close(corrected, full_corrected)
    # the head matters: the chain differs from selecting the uncorrected base logits
    assert not torch.equal(results[0][0], torch.argmax(base, dim=-1))


@pytest.mark.parametrize(("n_cap", "hidden"), [(2, 24), (3, 15)],
                         ids=["fc-split", "fc-replicated"])
def test_dspark_mla_tp_fusions_equal_tp1(pool: RankPool, n_cap: int, hidden: int) -> None:
    """``F = 2 * 24 = 48`` splits over TP 2/4/8 (both fusions active); ``F = 3 * 15 = 45``
    splits over none (``fc`` stays replicated, only the residual fusion is taken)."""
    tol = 1e-5 if pool.backend == "gloo" else 1e-4
    results = pool.run(_mla_worker, n_cap, hidden)
    feature_width = n_cap * hidden
    for rank, r in enumerate(results):
        columns = fc_split_columns(feature_width, pool.world_size, rank)
        assert r["fc_columns"] == columns
        assert (columns is None) == (n_cap == 3)
        want_active = set(TPFusion) if columns else {TPFusion.AR_RESIDUAL_RMSNORM}
        assert r["active"] == want_active
        torch.testing.assert_close(r["latent_fused"], r["latent_single"], rtol=tol, atol=tol)
        for name in ("h_fused", "h_stock"):
            torch.testing.assert_close(r[name], r["h_single"], rtol=tol, atol=tol)
        torch.testing.assert_close(r["logits"], r["logits_single"], rtol=tol, atol=tol)
        assert torch.equal(r["h_fused"], results[0]["h_fused"])  # replicated, bit for bit
        assert not torch.isnan(r["h_fused"]).any()  # NaN-filled unused pages never read


def test_pair_exchange_in_cuda_graph(pool: RankPool) -> None:
    if pool.backend != "nccl":
        pytest.skip("CUDA-graph capture of the pair exchange needs NCCL ranks on GPUs")
    rows, v = 64, _vocab(pool)
    fulls = [adversarial_logits(rows, v, seed=s, dtype=torch.bfloat16) for s in (1, 2)]
    fulls.append(torch.flip(fulls[0], dims=[1]).contiguous())
    temps = torch.linspace(0.0, 2.0, rows)
    seeds, offsets = make_key(rows, seed=9)
    for rank_out in pool.run(_graph_worker, fulls, temps, seeds, offsets):
        for full, (tokens, sampled, want_sampled) in zip(fulls, rank_out, strict=True):
            assert torch.equal(tokens, torch.argmax(full, dim=1))
            assert torch.equal(sampled, want_sampled)
    assert not torch.equal(rank_out[0][1], rank_out[2][1])  # replays saw the new inputs
