"""The static context bound ``DraftBlockPlacement.context_width``: the GQA block forward
gives the same hidden states with and without it, reads nothing back to the host with it, costs
the same whatever the number of unused pages, and (GPU) captures in a CUDA graph whose replay on
new inputs copied into the static buffers equals the eager forward bit for bit."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _gqa_helpers import make_placement, permuted_tables, write_context
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from draftsmith.contract import (
    DraftBlockInputs,
    DraftBlockPlacement,
    LoadRequest,
    PagedContextCache,
    ShapeError,
    TargetInfo,
)
from draftsmith.drafters.builtin import dspark_gqa as dspark_family
from draftsmith.drafters.nn import context_columns, gather_context

V, H, L_T = 50, 32, 8
TARGET = TargetInfo(vocab_size=V, hidden_size=H, num_layers=L_T)
PAGE = 4
BLOCK = 7
CTX_LENS = (3, 9, 14)
BOUND = 24  # static bound >= max(CTX_LENS) the runtime would pick for a capture bucket


def _drafter(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
    opts = dspark_family.FAMILY.options_model(
        num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=24,
        init_std=0.2, block_size=BLOCK, layer_types=("sliding_attention", "full_attention"),
        sliding_window=5,
    )
    return dspark_family.FAMILY.load(LoadRequest(options=opts, target=TARGET, seed=11,
                                                 device=torch.device(device), dtype=dtype))


def _world(drafter, ctx_lens, seed: int, pages_per_row: int, nan_garbage: bool = True):
    """Inputs, placement and a pool of ``G * pages_per_row`` pages holding each request's context
    in permuted pages; every other pool entry is garbage (NaN when ``nan_garbage``)."""
    device = drafter.fc.weight.device
    g = len(ctx_lens)
    gen = torch.Generator().manual_seed(seed)
    tables = permuted_tables(g, pages_per_row, seed=seed)
    cache = PagedContextCache.make_dummy(drafter.capabilities.context_entry,
                                         num_pages=g * pages_per_row, page_size=PAGE,
                                         dtype=drafter.dtype)
    if nan_garbage:
        cache.pool.fill_(float("nan"))
    else:
        cache.pool.copy_(torch.randn(cache.pool.shape, generator=gen))
    for b, c in enumerate(ctx_lens):
        feats = torch.randn(c, drafter.spec.feature_width, generator=gen)
        entries = drafter.project_context(feats.to(device),
                                          torch.arange(c, dtype=torch.int64, device=device))
        write_context(cache, tables[b], entries.cpu())
    bonus = torch.randint(0, V, (g,), generator=gen)
    placement = make_placement(tables, ctx_lens, BLOCK, PAGE, bonus=bonus.tolist())
    ids = torch.full((g, BLOCK), drafter.spec.mask_token_id, dtype=torch.int64)
    ids[:, 0] = bonus
    embedding = torch.randn(V, H, generator=gen)
    inputs = DraftBlockInputs(token_ids=ids, positions=placement.query_positions.clone())
    inputs = dataclasses.replace(inputs, embeddings=drafter.embed_block(ids, embedding))
    return inputs.to(device), placement.to(device), cache.to(device)


def _bounded(placement: DraftBlockPlacement, bound: int) -> DraftBlockPlacement:
    return dataclasses.replace(placement, context_width=bound)


@pytest.fixture(scope="module")
def drafter():
    return _drafter()


def test_context_width_is_validated():
    placement = DraftBlockPlacement.make_dummy(ctx_len=5, page_size=4)
    span = placement.block_tables.shape[1] * placement.page_size
    assert placement.context_width is None
    assert _bounded(placement, span).context_width == span
    for bad in (0, -3, span + 1, True, 2.0):
        with pytest.raises(ShapeError, match="context_width"):
            _bounded(placement, bad)


def test_gather_context_uses_the_static_bound(drafter):
    inputs, placement, cache = _world(drafter, CTX_LENS, seed=1, pages_per_row=8)
    assert context_columns(placement) == max(CTX_LENS)
    entries, valid = gather_context(cache, placement, 1)
    b_entries, b_valid = gather_context(cache, _bounded(placement, BOUND), 1)
    assert entries.shape[1] == max(CTX_LENS) and b_entries.shape[1] == BOUND
    assert torch.equal(b_valid[:, :max(CTX_LENS)], valid) and not b_valid[:, max(CTX_LENS):].any()
    assert torch.equal(b_entries[:, :max(CTX_LENS)][valid], entries[valid])
    assert torch.equal(b_valid.sum(1), placement.num_ctx)
    # an explicit ``columns`` overrides both
    assert gather_context(cache, placement, 0, 5)[0].shape[1] == 5


def test_same_hidden_with_and_without_the_bound(drafter):
    inputs, placement, cache = _world(drafter, CTX_LENS, seed=2, pages_per_row=8)
    eager = drafter.forward_block(inputs, placement, cache)
    assert torch.isfinite(eager).all()  # NaN garbage past num_ctx never leaks in
    tight = drafter.forward_block(inputs, _bounded(placement, max(CTX_LENS)), cache)
    assert torch.equal(tight, eager)
    for bound in (BOUND, 8 * PAGE):
        wide = drafter.forward_block(inputs, _bounded(placement, bound), cache)
        torch.testing.assert_close(wide, eager, rtol=1e-6, atol=1e-6)


def test_bounded_forward_reads_nothing_back(drafter, monkeypatch):
    """With the bound, no tensor is converted to a host value (the CPU stand-in for "no sync")."""
    inputs, placement, cache = _world(drafter, CTX_LENS, seed=3, pages_per_row=8)
    placement = _bounded(placement, BOUND)
    want = drafter.forward_block(inputs, placement, cache)

    def _no_host_read(*_args, **_kwargs):
        raise AssertionError("forward_block read a tensor back to the host")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, _no_host_read)
    got = drafter.forward_block(inputs, placement, cache)
    monkeypatch.undo()
    assert torch.equal(got, want)
    # the negative control: without the bound the forward does read num_ctx back
    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, _no_host_read)
    with pytest.raises(AssertionError, match="host"):
        drafter.forward_block(inputs, dataclasses.replace(placement, context_width=None), cache)


class _ElementCounter(TorchDispatchMode):
    """Counts the elements every aten op writes (views excluded): a timing-free proxy for the work done (the FLOP
    counter does not see the CPU attention kernel)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not any(r.alias_info is not None for r in func._schema.returns):  # views move nothing
            self.total += sum(t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
        return out


def _work(drafter, inputs, placement, cache) -> int:
    drafter.forward_block(inputs, placement, cache)  # warm the per-device RoPE cache first
    with _ElementCounter() as counter:
        drafter.forward_block(inputs, placement, cache)
    return counter.total


def test_cost_does_not_scale_with_unused_pages(drafter):
    """Task-3 sanity without timing: the same requests behind page tables of 8 and of 64 pages per
    row do the same work and give the same hidden states; only the bound sets the width."""
    small = _world(drafter, CTX_LENS, seed=4, pages_per_row=8)
    large = _world(drafter, CTX_LENS, seed=4, pages_per_row=64)
    assert large[2].num_pages == 8 * small[2].num_pages
    for bound in (None, BOUND):
        s_inputs, s_place, s_cache = small
        l_inputs, l_place, l_cache = large
        s_place, l_place = (dataclasses.replace(p, context_width=bound) for p in (s_place, l_place))
        assert _work(drafter, s_inputs, s_place, s_cache) == _work(
            drafter, l_inputs, l_place, l_cache)
        torch.testing.assert_close(drafter.forward_block(l_inputs, l_place, l_cache),
                                   drafter.forward_block(s_inputs, s_place, s_cache),
                                   rtol=1e-6, atol=1e-6)
    # while the bound itself does set the cost (the counter is not blind to the width)
    s_inputs, s_place, s_cache = small
    assert _work(drafter, s_inputs, _bounded(s_place, 32), s_cache) > _work(
        drafter, s_inputs, _bounded(s_place, 16), s_cache)


def _copy_into(static, fresh) -> None:
    """Copy every tensor field of record ``fresh`` into the same field of ``static``."""
    for field in dataclasses.fields(static):
        dst, src = getattr(static, field.name), getattr(fresh, field.name)
        if isinstance(dst, torch.Tensor):
            dst.copy_(src)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_block_replays_bit_identically_in_a_cuda_graph(dtype):
    drafter = _drafter("cuda", dtype)
    pages = 8
    inputs, placement, cache = _world(drafter, CTX_LENS, seed=5, pages_per_row=pages)
    placement = _bounded(placement, BOUND)
    # Warm up on a side stream (lazy init, cuBLAS handles), then capture.
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            drafter.forward_block(inputs, placement, cache)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.set_sync_debug_mode("error")
    try:
        drafter.forward_block(inputs, placement, cache)  # no host sync with the bound
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = drafter.forward_block(inputs, placement, cache)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, drafter.forward_block(inputs, placement, cache))

    # New requests of the same shapes (other lengths, pages, tokens and context), copied in.
    for seed, lens in ((6, (20, 1, 7)), (7, (24, 24, 2))):
        f_inputs, f_place, f_cache = _world(drafter, lens, seed=seed, pages_per_row=pages)
        f_place = _bounded(f_place, BOUND)
        _copy_into(inputs, f_inputs)
        _copy_into(placement, f_place)
        cache.pool.copy_(f_cache.pool)
        graph.replay()
        torch.cuda.synchronize()
        eager = drafter.forward_block(f_inputs, f_place, f_cache)
        assert torch.isfinite(eager.float()).all()
        assert torch.equal(static_out, eager)


@pytest.mark.gpu
def test_fused_gpu_forward_matches_the_cpu_reference():
    """On a GPU the layer packs q/k/v and gate/up into one GEMM each, norms q and k in one launch,
    fuses residual adds with the norms and attends with the fused paged kernel (sliding and full
    layers here); the context projection packs every layer's k and v: fp32 results equal the
    CPU path's."""
    cpu, gpu = _drafter("cpu"), _drafter("cuda")
    for lens, seed in (((3, 9, 14), 5), ((24, 1, 7), 6)):
        inputs, placement, cache = _world(cpu, lens, seed=seed, pages_per_row=8)
        want = cpu.forward_block(inputs, _bounded(placement, BOUND), cache)
        got = gpu.forward_block(inputs.to("cuda"), _bounded(placement, BOUND).to("cuda"),
                                cache.to("cuda"))
        torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)
    feats = torch.randn(11, cpu.spec.feature_width, generator=torch.Generator().manual_seed(2))
    positions = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 30, 4000])
    torch.testing.assert_close(gpu.project_context(feats.cuda(), positions.cuda()).cpu(),
                               cpu.project_context(feats, positions), atol=1e-4, rtol=1e-4)
    assert "_packed_k_norms" in gpu.__dict__
    assert "_packed_linear" in gpu.layers[0].self_attn.__dict__
    assert "_packed_gate_up" in gpu.layers[0].mlp.__dict__
    assert "_packed_linear" not in cpu.layers[0].self_attn.__dict__


@pytest.mark.parametrize("few_rows", [False, True])
def test_fused_paths_on_the_interpreter_match_the_torch_paths(monkeypatch, few_rows):
    """The GPU code paths (packed projections, fused norms and attention, fused context
    projection, the head's logits), forced on the CPU under Triton's interpreter in fp32, equal
    the torch paths; with ``few_rows`` every product runs the few-row kernel (fp32 admitted and
    the row bound raised past the test's 21 block rows), the gate and the head's fp32 output
    inside it."""
    from draftsmith.contract import OutputHead
    from draftsmith.drafters import nn as drafter_nn

    drafter = _drafter()
    feats = torch.randn(9, drafter.spec.feature_width, generator=torch.Generator().manual_seed(3))
    positions = torch.tensor([0, 1, 2, 3, 5, 8, 13, 21, 34])
    head = OutputHead.make_dummy(V, H, seed=4)
    products = []
    if few_rows:
        monkeypatch.setattr(drafter_nn, "FEW_ROW_DTYPES", (torch.float32,))
        monkeypatch.setattr(drafter_nn, "FEW_ROWS", 64)
        real = drafter_nn.decode_linear
        monkeypatch.setattr(drafter_nn, "decode_linear",
                            lambda *a, **k: products.append(k.get("gated")) or real(*a, **k))
    from draftsmith.drafters.gqa import model as gqa_model

    tables = []  # the RoPE tables each path makes: the fused path makes its angles in-launch
    real_tables = gqa_model.rope_cos_sin
    monkeypatch.setattr(gqa_model, "rope_cos_sin",
                        lambda *a, **k: tables.append(1) or real_tables(*a, **k))
    results, made = [], []
    for fused in (False, True):
        monkeypatch.setattr(drafter_nn, "on_gpu", lambda t, fused=fused: fused)
        inputs, placement, cache = _world(drafter, (3, 9, 14), seed=5, pages_per_row=8)
        products.clear()  # the context _world wrote
        tables.clear()
        hidden = drafter.forward_block(inputs, _bounded(placement, BOUND), cache)
        results.append((hidden, drafter.project_context(feats, positions),
                        drafter.block_logits(hidden[0], head).logits))
        made.append(len(tables))
    assert made == [2, 0]
    assert "_packed_gate_up" in drafter.layers[1].mlp.__dict__
    for want, got in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # fc and the packed k | v (context); [q | k | v], o, gated [gate | up], down a layer; head
    assert products.count(True) == (drafter.spec.num_layers if few_rows else 0)
    assert len(products) == (2 + 4 * drafter.spec.num_layers + 1 if few_rows else 0)
