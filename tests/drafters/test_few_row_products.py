"""The drafters' few-row products (``drafters.nn.product``): at up to ``FEW_ROWS`` rows of a bf16
or fp16 block on a GPU one launch of the target's few-row kernel (the gate and the head's fp32
logits inside it), above that cuBLAS; the same values either way to rounding. Inside
``kernels.pdl_scope(True)`` the drafters' kernels launch programmatically dependent and give the
bits of plain launches, eagerly and over CUDA graph replays (GPU)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from draftsmith.contract import LoadRequest, OutputHead, TargetInfo
from draftsmith.drafters import nn as drafter_nn
from draftsmith.kernels import in_pdl_scope, pdl_scope

gpu = pytest.mark.gpu
needs_hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
    reason="needs a GPU of compute capability 9.0 or above (run on the device machine)")


@pytest.fixture
def few_fp32(monkeypatch):
    """The GPU path on the CPU under the interpreter, fp32 admitted to the few-row products,
    autograd off (as in the runtime's rounds); yields the ``gated`` flag of each few-row
    launch."""
    calls: list[bool] = []
    real = drafter_nn.decode_linear
    monkeypatch.setattr(drafter_nn, "on_gpu", lambda t: True)
    monkeypatch.setattr(drafter_nn, "FEW_ROW_DTYPES", (torch.float32,))
    monkeypatch.setattr(drafter_nn, "decode_linear",
                        lambda *a, **k: calls.append(bool(k.get("gated"))) or real(*a, **k))
    with torch.no_grad():
        yield calls


@pytest.mark.parametrize("rows", [1, 7, 16, 17])
def test_product_runs_the_few_row_kernel_up_to_the_bound(few_fp32, rows):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 45, generator=g)
    weight, bias = torch.randn(37, 45, generator=g), torch.randn(37, generator=g)
    torch.testing.assert_close(drafter_nn.product(x, weight, bias), F.linear(x, weight, bias),
                               atol=1e-4, rtol=1e-4)
    gu = torch.randn(2 * 19, 45, generator=g)
    y = F.linear(x, gu)
    torch.testing.assert_close(drafter_nn.product(x[None], gu, gated=True)[0],
                               F.silu(y[:, :19]) * y[:, 19:], atol=1e-4, rtol=1e-4)
    assert few_fp32 == ([False, True] if rows <= drafter_nn.FEW_ROWS else [])


def test_product_keeps_the_leading_dims_and_strided_rows(few_fp32):
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(2, 3, 60, generator=g)
    x = wide[..., 5:50]  # rows strided, last dim contiguous
    weight = torch.randn(21, 45, generator=g)
    got = drafter_nn.product(x, weight)
    assert got.shape == (2, 3, 21)
    torch.testing.assert_close(got, F.linear(x, weight), atol=1e-4, rtol=1e-4)
    assert few_fp32 == [False]


def test_head_logits_take_the_kernel_unless_the_target_gives_its_product(few_fp32):
    head = OutputHead.make_dummy(vocab_size=53, hidden_size=24, seed=1)
    hidden = torch.randn(5, 24, generator=torch.Generator().manual_seed(2))
    want = F.linear(hidden, head.weight)
    got = drafter_nn.head_logits(head, hidden)
    assert got.dtype == torch.float32 and few_fp32 == [False]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    own = dataclasses.replace(head, product=lambda h: F.linear(h, head.weight) * 2)
    torch.testing.assert_close(drafter_nn.head_logits(own, hidden), 2 * want)
    assert few_fp32 == [False]  # the target's own product ran


def test_the_cpu_and_autograd_keep_torch_products(monkeypatch):
    calls = []
    monkeypatch.setattr(drafter_nn, "decode_linear", lambda *a, **k: calls.append(1))
    x, weight = torch.randn(3, 8), torch.randn(5, 8)
    assert torch.equal(drafter_nn.product(x, weight), F.linear(x, weight))  # not on a GPU
    monkeypatch.setattr(drafter_nn, "on_gpu", lambda t: True)
    lin = torch.nn.Linear(8, 5)
    out = drafter_nn.linear(lin, x)  # autograd on: the module's own call
    assert out.requires_grad and not calls
    with torch.no_grad():
        assert torch.equal(drafter_nn.product(x, weight), F.linear(x, weight))  # fp32 is not few-row
    assert not calls


def test_pdl_scope_nests_and_unwinds():
    assert not in_pdl_scope()
    with pdl_scope(False):
        assert not in_pdl_scope()
        with pdl_scope(True):
            assert in_pdl_scope()
            with pdl_scope(False):
                assert in_pdl_scope()  # an inner "off" does not end an outer "on"
        assert not in_pdl_scope()
    with pytest.raises(RuntimeError), pdl_scope(True):
        raise RuntimeError
    assert not in_pdl_scope()


def _gqa():
    from draftsmith.drafters.builtin import dspark_gqa

    target = TargetInfo(vocab_size=512, hidden_size=256, num_layers=8)
    opts = dspark_gqa.FAMILY.options_model(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
                                           intermediate_size=320, init_std=0.05, block_size=8)
    return dspark_gqa.FAMILY.load(LoadRequest(options=opts, target=target, seed=3,
                                              device=torch.device("cuda"), dtype=torch.bfloat16))


def _round(drafter, head, feats, positions, inputs, placement, cache):
    """What a round asks of the drafter: context entries, block hidden states, draft logits."""
    entries = drafter.project_context(feats, positions)
    hidden = drafter.forward_block(inputs, placement, cache)
    return entries, hidden, drafter.block_logits(hidden[:, 1:].reshape(-1, hidden.shape[-1]),
                                                 head).logits


@gpu
@needs_hopper
def test_gpu_drafter_under_pdl_gives_the_bits_of_plain_launches():
    from _gqa_helpers import make_placement, permuted_tables

    from draftsmith.contract import DraftBlockInputs, PagedContextCache

    drafter = _gqa()
    g = torch.Generator(device="cuda").manual_seed(0)
    head = OutputHead(weight=(torch.randn(512, 256, generator=g, device="cuda") / 16).bfloat16(),
                      vocab_start=0, vocab_size=512)
    feats = torch.randn(8, drafter.spec.feature_width, generator=g, device="cuda").bfloat16()
    positions = torch.arange(40, 48, device="cuda")
    tables = permuted_tables(1, 16, seed=1)
    cache = PagedContextCache.make_dummy(drafter.capabilities.context_entry, num_pages=16,
                                         page_size=16, dtype=torch.bfloat16).to("cuda")
    cache.pool.normal_(generator=g)
    placement = make_placement(tables, (40,), 8, 16, bonus=[7]).to("cuda")
    placement = dataclasses.replace(placement, context_width=256)
    ids = torch.full((1, 8), drafter.spec.mask_token_id, dtype=torch.int64, device="cuda")
    ids[0, 0] = 7
    emb = torch.randn(512, 256, generator=g, device="cuda").bfloat16()
    inputs = DraftBlockInputs(ids, placement.query_positions, drafter.embed_block(ids, emb))
    args = (drafter, head, feats, positions, inputs, placement, cache)
    want = _round(*args)
    with torch.no_grad():
        wide = F.linear(want[1][:, 1:].reshape(-1, 256), head.weight).float()
    torch.testing.assert_close(want[2], wide, atol=0.05, rtol=0.02)  # the few-row head
    with pdl_scope(True):
        got = _round(*args)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), pdl_scope(True):
        _round(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), pdl_scope(True):
        got = _round(*args)
    for _ in range(30):
        for t in got:
            t.zero_()
        graph.replay()
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
