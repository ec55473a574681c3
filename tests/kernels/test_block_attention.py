"""block_attention: the Triton kernel against its torch reference (interpreter on the CPU, fp32;
bf16 on a GPU), on odd shapes, every visibility rule, ragged contexts and shuffled pages; the
split of a wide context (forced small with ``split_cols`` so that a few hundred columns make
several splits on the CPU) against the reference with contexts of 0 columns, less than one split
and the full width, bit for bit the same on every call and (on a GPU) graph replay and under PDL;
and the one-launch path bit for bit the kernel from before the split."""

from __future__ import annotations

import pytest
import torch
from _block_attention_before_split import _block_attention_kernel as kernel_before_split
from _devices import DEVICE_DTYPES

from draftsmith.contract import ShapeError
from draftsmith.kernels._launch import block_size
from draftsmith.kernels.block_attention import (
    SPLIT_COLS,
    _launch_sizes,
    block_attention,
    block_attention_reference,
    context_splits,
    visible,
)

VISIBILITY = [(False, None), (True, None), (False, 5), (True, 3)]
"""``(causal, window)``: every visibility rule."""

SPLIT_VISIBILITY = [(False, None), (True, None), (True, 150), (False, 7)]
"""``(causal, window)`` for the split: a causal window wider than a forced split (it crosses
split boundaries) and a narrow one (most splits see no column of their run)."""

SPLIT_SHAPES = [
    # g, w, nh, nkv, hd, page, num_ctx, columns, split_cols
    (3, 4, 4, 2, 16, 16, [0, 37, 513], 513, 100),  # 6 splits; no context, within split 0
    (2, 5, 6, 2, 16, 8, [1100, 70], 1100, 256),  # 5 splits, 3 query heads per KV head
    (2, 3, 2, 1, 16, 32, [2049, 255], 2049, SPLIT_COLS),  # the default split: 9 splits
]
"""Widths whose last split holds 13 columns, 76, and one; ragged contexts of no column, fewer
than one split, the whole width and about half of it."""


def _tol(dtype):
    return dict(atol=2e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


def _case(device: str, g, w, nh, nkv, hd, page, num_ctx, columns, dtype=torch.float32, seed=0,
          strided=False):
    gen = torch.Generator().manual_seed(seed)
    max_pages = -(-columns // page)
    pages = g * max_pages + 3
    pool = torch.randn(pages, 2, nkv, page, hd, generator=gen).to(device, dtype)
    tables = torch.randperm(pages, generator=gen)[: g * max_pages].view(g, max_pages)
    q = torch.randn(g, w, nh, hd, generator=gen).to(device, dtype)
    if strided:  # k and v as views into one packed projection, as the drafter makes them
        kv = torch.randn(g, w, 2 * nkv, hd, generator=gen).to(device, dtype)
        k, v = kv[:, :, :nkv], kv[:, :, nkv:]
    else:
        k = torch.randn(g, w, nkv, hd, generator=gen).to(device, dtype)
        v = torch.randn(g, w, nkv, hd, generator=gen).to(device, dtype)
    nctx = torch.tensor(num_ctx, dtype=torch.int64)
    qpos = (nctx[:, None] + torch.arange(w)).to(device)
    return (q, k, v, pool, tables.to(device), nctx.to(device), qpos, columns)


SHAPES = [
    # g, w, nh, nkv, hd, page, num_ctx, columns
    (1, 8, 9, 3, 64, 16, [37], 64),
    (3, 5, 4, 1, 24, 4, [0, 13, 70], 77),
    (2, 1, 6, 2, 16, 8, [1, 129], 130),
]


@pytest.mark.parametrize("causal,window", VISIBILITY)
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matches_the_reference(device, shape, causal, window):
    g, w, nh, nkv, hd, page, num_ctx, columns = shape
    args = _case(device, g, w, nh, nkv, hd, page, num_ctx, columns, strided=g == 3)
    scale = hd ** -0.5
    want = block_attention_reference(*args, causal, window, scale)
    got = block_attention(*args, causal, window, scale)
    assert got.shape == (g, w, nh, hd) and got.dtype == want.dtype
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("split_cols", [SPLIT_COLS, 4])
def test_context_beyond_num_ctx_and_unused_pages_are_never_read(device, split_cols):
    """Poisoning every pool entry outside the advertised context changes nothing, split or not
    (4 columns a split: four splits, the first request's last ones past its context)."""
    args = list(_case(device, 2, 4, 4, 2, 16, 4, [6, 11], 16))
    want = block_attention(*args, False, None, 0.25, split_cols=split_cols)
    pool, tables, nctx = args[3], args[4], args[5]
    poisoned = torch.full_like(pool, float("nan"))
    for b in range(2):
        for c in range(int(nctx[b])):
            p, o = int(tables[b, c // 4]), c % 4
            poisoned[p, :, :, o] = pool[p, :, :, o]
    args[3] = poisoned
    got = block_attention(*args, False, None, 0.25, split_cols=split_cols)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_visibility_rule():
    q = torch.tensor([[5, 6]])
    k = torch.tensor([[0, 3, 5, 6, 7]])
    assert visible(q, k, True, None).tolist() == [[[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]]]
    assert visible(q, k, False, 2).tolist() == [[[0, 0, 1, 1, 0], [0, 0, 1, 1, 1]]]


def test_bad_shapes_are_refused(device):
    q, k, v, pool, tables, nctx, qpos, columns = _case(device, 1, 4, 6, 4, 16, 4, [3], 8)
    with pytest.raises(ShapeError, match="do not group"):
        block_attention(q, k, v, pool, tables, nctx, qpos, columns, False, None, 1.0)
    q, k, v, pool, tables, nctx, qpos, columns = _case(device, 1, 4, 4, 2, 16, 4, [3], 8)
    with pytest.raises(ShapeError, match="window"):
        block_attention(q, k, v, pool, tables, nctx, qpos, columns, False, 0, 1.0)
    with pytest.raises(ShapeError, match="split_cols"):
        block_attention(q, k, v, pool, tables, nctx, qpos, columns, False, None, 1.0,
                        split_cols=0)


def test_the_splits_depend_on_the_static_width_alone():
    """One launch up to ``split_cols`` columns (the graph of a narrow bucket keeps today's
    kernel), then one split per started run of ``split_cols``; ``None`` never splits."""
    assert context_splits(1) == context_splits(SPLIT_COLS) == 1
    assert context_splits(SPLIT_COLS + 1) == 2
    assert context_splits(4096) == 4096 // SPLIT_COLS
    assert context_splits(513, 100) == 6 and context_splits(100, 100) == 1
    assert context_splits(16384, None) == 1


def _before_split(q, k, v, pool, tables, nctx, qpos, columns, causal, window, scale):
    """The kernel from before the split, launched as its launcher did, at today's tiles."""
    g, w, nh, hd = q.shape
    nkv = k.shape[2]
    out = torch.empty(g, w, nh, hd, dtype=q.dtype, device=q.device)
    kernel_before_split[(g, nkv)](
        q, k, v, pool, tables, nctx, qpos, out,
        w, hd, int(columns), pool.shape[3], tables.shape[1], float(scale),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        pool.stride(0), pool.stride(1), pool.stride(2), pool.stride(3), tables.stride(0),
        out.stride(0), out.stride(1), out.stride(2),
        REP=nh // nkv, CAUSAL=bool(causal), WINDOW=int(window or 0),
        IEEE=q.dtype == torch.float32, BLOCK_M=block_size(w * (nh // nkv), lo=16),
        BLOCK_W=block_size(w, lo=16), BLOCK_D=block_size(hd, lo=16), PDL=False, num_warps=4,
        **_launch_sizes(hd, q.dtype))
    return out


@pytest.mark.parametrize("causal,window", VISIBILITY)
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_the_one_launch_path_keeps_the_bits_from_before_the_split(device, dtype, causal, window):
    """At or below the split width, and at any width with ``split_cols=None``."""
    for g, w, nh, nkv, hd, page, num_ctx, columns in SHAPES:
        args = _case(device, g, w, nh, nkv, hd, page, num_ctx, columns, dtype, strided=g == 3)
        want = _before_split(*args, causal, window, hd ** -0.5)
        assert torch.equal(block_attention(*args, causal, window, hd ** -0.5), want)
    args = _case(device, 2, 3, 4, 2, 16, 16, [600, 0], 600, dtype)
    want = _before_split(*args, causal, window, 0.25)
    assert torch.equal(block_attention(*args, causal, window, 0.25, split_cols=None), want)


@pytest.mark.parametrize("causal,window", SPLIT_VISIBILITY)
@pytest.mark.parametrize("shape", SPLIT_SHAPES)
@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_the_split_context_matches_the_reference(device, dtype, shape, causal, window):
    g, w, nh, nkv, hd, page, num_ctx, columns, split_cols = shape
    args = _case(device, g, w, nh, nkv, hd, page, num_ctx, columns, dtype, strided=g == 3)
    assert context_splits(columns, split_cols) > 1
    want = block_attention_reference(*args, causal, window, hd ** -0.5).float()
    got = block_attention(*args, causal, window, hd ** -0.5, split_cols=split_cols)
    assert got.shape == (g, w, nh, hd) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want, **_tol(dtype))


@pytest.mark.parametrize("device,dtype", DEVICE_DTYPES)
def test_the_split_context_gives_the_same_bits_on_every_call(device, dtype):
    """Fixed fold order, no atomics: the same bits however the programs were scheduled."""
    g, w, nh, nkv, hd, page, num_ctx, columns, split_cols = SPLIT_SHAPES[0]
    args = _case(device, g, w, nh, nkv, hd, page, num_ctx, columns, dtype)
    first = block_attention(*args, True, None, 0.25, split_cols=split_cols)
    for _ in range(2):
        assert torch.equal(block_attention(*args, True, None, 0.25, split_cols=split_cols),
                           first)


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True])
def test_a_captured_split_gives_the_eager_bits_at_every_context_below_its_width(pdl):
    """One CUDA graph per width serves every ``num_ctx`` under it (the splits come from the
    width), and under PDL (where the device has it) gives the plain launches' bits."""
    g, w, nh, nkv, hd, page, columns = 4, 8, 4, 2, 64, 16, 4100
    args = list(_case("cuda", g, w, nh, nkv, hd, page, [4100, 0, 700, 1], columns,
                      torch.bfloat16, strided=True))
    nctx, qpos = args[5], args[6]
    block_attention(*args, True, None, 0.125, pdl=pdl)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = block_attention(*args, True, None, 0.125, pdl=pdl)
    gen = torch.Generator().manual_seed(3)
    for _ in range(4):
        nctx.copy_(torch.randint(0, columns + 1, (g,), generator=gen))
        qpos.copy_(nctx[:, None] + torch.arange(w, device="cuda"))
        graph.replay()
        want = block_attention(*args, True, None, 0.125)
        assert torch.equal(out, want)
        ref = block_attention_reference(*args, True, None, 0.125)
        torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("split_cols", [None, SPLIT_COLS, 100])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_on_gpu(dtype, split_cols):
    args = _case("cuda", 5, 8, 9, 3, 64, 16, [0, 1, 300, 511, 64], 512, dtype=dtype, strided=True)
    want = block_attention_reference(*args, False, None, 0.125).float()
    got = block_attention(*args, False, None, 0.125, split_cols=split_cols).float()
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 1000)])
def test_long_contexts_on_gpu(causal, window):
    """The default split at a drafter's widths: 16k columns, ragged contexts."""
    args = _case("cuda", 3, 8, 4, 2, 128, 64, [16384, 5000, 0], 16384, dtype=torch.bfloat16,
                 strided=True)
    want = block_attention_reference(*args, causal, window, 128 ** -0.5).float()
    got = block_attention(*args, causal, window, 128 ** -0.5).float()
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
