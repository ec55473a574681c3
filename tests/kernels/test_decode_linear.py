"""The few-row product (``decode_linear``) against its reference: odd shapes, bias, the residual
add (in place too), the gate, fp32 logits of a 16-bit product; every row bit for bit the same
whatever the rows beside it; the split of ``K`` (``Blocks.split_k``) the same ways, bit for bit
the same on every call and graph replay, and the whole-``K`` launch bit for bit the kernel from
before the split; fp32 on the CPU (interpreter), bf16 and fp32 on a GPU."""

from __future__ import annotations

import pytest
import torch
import triton
from _decode_linear_before_split import _decode_linear_kernel as kernel_before_split
from _devices import DEVICE_DTYPES

from draftsmith.contract import DraftsmithError, ShapeError
from draftsmith.kernels.decode_linear import (
    BLOCK_M,
    Blocks,
    decode_linear,
    decode_linear_blocks,
    decode_linear_reference,
    split_parts,
    split_workspace,
)

SHAPES = [(1, 37, 75), (5, 64, 576), (17, 100, 129), (16, 48, 40), (3, 1026, 600)]
"""Rows x output columns x input columns: below and above one tile of rows, widths that are
not powers of two, one input tile and several."""


def _tol(dtype):
    return dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=2e-2)


def _inputs(m, n, k, device, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) / k ** 0.5
    b = torch.randn(n, generator=g)
    r = torch.randn(m, n // 2 if n % 2 == 0 else n, generator=g)
    return (t.to(device, dtype) for t in (x, w, b, r))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_every_form_matches_the_reference(shape, device, dtype):
    m, n, k = shape
    x, w, b, r = _inputs(m, n, k, device, dtype, sum(shape))
    forms = [{}, {"bias": b}, {"out_dtype": torch.float32}]
    if n % 2 == 0:
        forms += [{"gated": True}, {"gated": True, "residual": r}]
    else:
        forms += [{"residual": r}, {"bias": b, "residual": r}]
    for kwargs in forms:
        got = decode_linear(x, w, **kwargs)
        want = decode_linear_reference(x, w, **kwargs)
        assert got.dtype == want.dtype and got.shape == want.shape, kwargs
        torch.testing.assert_close(got, want, **_tol(dtype), msg=lambda m, kw=kwargs: f"{kw}: {m}")


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_a_row_does_not_depend_on_the_rows_beside_it(device, dtype):
    """Verifying K + 1 tokens must round as decoding them one by one: each row alone, in a
    block of 8, and in a block of 21 (two tiles of rows) gives the same bits."""
    x, w, _, _ = _inputs(21, 96, 200, device, dtype, 5)
    for kwargs in ({}, {"gated": True}, {"out_dtype": torch.float32}):
        whole = decode_linear(x, w, **kwargs)
        assert torch.equal(decode_linear(x[:8], w, **kwargs), whole[:8])
        alone = torch.cat([decode_linear(x[i : i + 1], w, **kwargs) for i in range(21)])
        assert torch.equal(alone, whole), kwargs


def test_the_residual_may_be_the_output():
    x, w, _, _ = _inputs(3, 40, 70, "cpu", torch.float32, 9)
    h = torch.randn(3, 40)
    want = decode_linear_reference(x, w, residual=h.clone())
    got = decode_linear(x, w, residual=h, out=h)
    assert got.data_ptr() == h.data_ptr()
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


def test_launch_sizes_follow_the_weight_not_the_rows():
    small, large = decode_linear_blocks(960, 576, torch.bfloat16), \
        decode_linear_blocks(49152, 576, torch.bfloat16)
    assert small.block_n < large.block_n and BLOCK_M == 16
    gated = decode_linear_blocks(14336, 4096, torch.bfloat16, gated=True)
    stage = (BLOCK_M + 2 * gated.block_n) * gated.block_k * 2
    assert gated.num_stages * stage <= 227 * 1024  # what an H100 / H200 block may hold


def test_bad_inputs_are_refused():
    x, w, b, _ = _inputs(2, 8, 16, "cpu", torch.float32, 1)
    with pytest.raises(ShapeError):
        decode_linear(x, w[:, :15])
    with pytest.raises(ShapeError, match="even number of weight rows"):
        decode_linear(x, w[:7], gated=True)
    with pytest.raises(ShapeError, match="no bias with gated"):
        decode_linear(x, w, b, gated=True)
    with pytest.raises(ShapeError):
        decode_linear(x, w, residual=torch.zeros(2, 9))
    with pytest.raises(ShapeError, match="fp32, bf16 or fp16"):
        decode_linear(x, w, out_dtype=torch.int32)
    assert decode_linear(x[:0], w).shape == (0, 8)


SPLITS = (2, 4, 8)
"""Parts of ``K`` the split tests force (8 exceeds the tiles of the smaller ``K``: fewer parts
run, none empty)."""


def _split_blocks(split_k: int, block_k: int = 32) -> Blocks:
    """Small tiles, so the small shapes of the interpreter still cut ``K`` into several parts."""
    return Blocks(block_n=16, block_k=block_k, num_warps=4, num_stages=1, split_k=split_k)


@pytest.mark.parametrize("split_k", SPLITS)
@pytest.mark.parametrize("shape", [(1, 37, 75), (17, 100, 129), (5, 64, 576), (3, 26, 40)])
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_a_split_product_matches_the_reference(split_k, shape, device, dtype):
    """``N`` and ``K`` not multiples of the tiles, ``K`` under ``split_k * block_k`` (75 and 40
    columns in tiles of 32), every form of the epilogue."""
    m, n, k = shape
    x, w, b, r = _inputs(m, n, k, device, dtype, sum(shape) + split_k)
    forms = [{"bias": b, "out_dtype": torch.float32}, {"bias": b}]
    if n % 2 == 0:
        forms += [{"gated": True}, {"gated": True, "residual": r, "out_dtype": torch.float32}]
    else:
        forms += [{"residual": r}, {"bias": b, "residual": r}]
    for kwargs in forms:
        got = decode_linear(x, w, **kwargs, blocks=_split_blocks(split_k))
        want = decode_linear_reference(x, w, **kwargs)
        assert got.dtype == want.dtype and got.shape == want.shape, kwargs
        torch.testing.assert_close(got, want, **_tol(dtype), msg=lambda m, kw=kwargs: f"{kw}: {m}")


@pytest.mark.parametrize("split_k", (1, *SPLITS))
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_a_split_row_does_not_depend_on_the_rows_beside_it(split_k, device, dtype):
    """Each part's sums run in one order per row and the parts add in the order 0, 1, ..:
    rows 1, 3, 16, 17 and 33 at a time, and a row of each tile of rows alone, give the same
    bits."""
    x, w, _, r = _inputs(33, 96, 200, device, dtype, 7)
    blocks = _split_blocks(split_k)
    for kwargs in ({"gated": True, "residual": r}, {"out_dtype": torch.float32}):
        def run(rows, kw=kwargs):
            kw = dict(kw, residual=kw["residual"][rows]) if "residual" in kw else kw
            return decode_linear(x[rows], w, **kw, blocks=blocks)

        whole = run(slice(0, 33))
        for m in (1, 3, 16, 17):
            assert torch.equal(run(slice(0, m)), whole[:m]), (kwargs, m)
        for i in (2, 16, 32):
            assert torch.equal(run(slice(i, i + 1)), whole[i : i + 1]), (kwargs, i)


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_a_split_product_gives_the_same_bits_on_every_call(device, dtype):
    """The arrival counts are back at zero after each launch, and nothing depends on which
    program of a tile arrives last (on a GPU that order changes from call to call)."""
    x, w, _, _ = _inputs(5, 64, 576, device, dtype, 3)
    calls = 2 if device == "cpu" else 20
    for split_k in SPLITS:
        for kwargs in ({}, {"gated": True}):
            first = decode_linear(x, w, **kwargs, blocks=_split_blocks(split_k))
            for _ in range(calls - 1):
                again = decode_linear(x, w, **kwargs, blocks=_split_blocks(split_k))
                assert torch.equal(first, again), (split_k, kwargs)
    _, counts = split_workspace(x.device, 0, 0)
    assert not counts.any()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_the_whole_k_launch_keeps_the_bits_from_before_the_split(shape, device, dtype):
    """``split_k = 1`` (every default) runs the kernel whose ``K`` loop and epilogue became
    helpers shared with the split kernel: the same bits as the kernel before that change."""
    m, n, k = shape
    x, w, b, r = _inputs(m, n, k, device, dtype, sum(shape))
    forms = [{}, {"bias": b}, {"out_dtype": torch.float32}]
    forms += [{"gated": True, "residual": r}] if n % 2 == 0 else [{"bias": b, "residual": r}]
    for kwargs in forms:
        got = decode_linear(x, w, **kwargs)
        gated, res = kwargs.get("gated", False), kwargs.get("residual")
        bias, cols = kwargs.get("bias"), n // 2 if kwargs.get("gated") else n
        want = torch.empty(m, cols, dtype=kwargs.get("out_dtype", dtype), device=device)
        blocks = decode_linear_blocks(cols, k, dtype, gated)
        assert blocks.split_k == 1
        kernel_before_split[(triton.cdiv(m, BLOCK_M), triton.cdiv(cols, blocks.block_n))](
            x, w, w if bias is None else bias, want if res is None else res, want,
            m, cols, k, x.stride(0), w.stride(0), 0 if res is None else res.stride(0),
            want.stride(0), HAS_BIAS=bias is not None, GATED=gated, RESIDUAL=res is not None,
            IEEE=dtype == torch.float32, BLOCK_M=BLOCK_M, BLOCK_N=blocks.block_n,
            BLOCK_K=blocks.block_k, num_warps=blocks.num_warps, num_stages=blocks.num_stages)
        assert torch.equal(got, want), kwargs


def test_the_parts_of_k_depend_on_k_block_and_split_alone():
    """Whole tiles per part, every part non-empty, the parts covering ``K`` exactly once."""
    for k in (1, 16, 40, 75, 511, 512, 513, 2048, 8192, 14336):
        for block_k in (16, 32, 256, 512):
            for split_k in (1, 2, 3, 4, 8):
                parts, k_part = split_parts(k, block_k, split_k)
                assert 1 <= parts <= split_k and k_part % block_k == 0
                assert (parts - 1) * k_part < k <= parts * k_part, (k, block_k, split_k)
    assert split_parts(8192, 512, 4) == (4, 2048)
    assert split_parts(75, 32, 8) == (3, 32)


def test_the_default_launch_splits_k_only_where_few_tiles_leave_sms_idle():
    """Measured on an H200: a 1B model's ``down`` (64 tiles of 32 columns) splits in four
    parts of 2048 columns; the 8B layers, small weights and fp32 keep the whole ``K``."""
    down_1b = decode_linear_blocks(2048, 8192, torch.bfloat16)
    assert (down_1b.block_n, down_1b.block_k, down_1b.split_k) == (32, 256, 4)
    assert split_parts(8192, down_1b.block_k, down_1b.split_k) == (4, 2048)
    for n, k in ((576, 576), (960, 576), (3072, 2048), (6144, 4096), (4096, 14336),
                 (49152, 4096), (49152, 576)):
        assert decode_linear_blocks(n, k, torch.bfloat16).split_k == 1, (n, k)
    for n, k in ((576, 576), (2048, 8192), (49152, 4096)):
        for gated in (False, True):
            assert decode_linear_blocks(n, k, torch.float32, gated).split_k == 1
    for n, k in ((2048, 2048), (2048, 6144), (2048, 8192), (1024, 16384)):
        blocks = decode_linear_blocks(n, k, torch.bfloat16)
        parts, k_part = split_parts(k, blocks.block_k, blocks.split_k)
        assert k_part >= 2048 and parts * triton.cdiv(n, blocks.block_n) <= 2 * 132, (n, k)
    with pytest.raises(ShapeError, match="split_k"):
        Blocks(block_n=16, block_k=32, num_warps=4, num_stages=1, split_k=0)


def test_the_split_workspace_grows_and_keeps_what_it_outgrew():
    """Reused while it is large enough; grown to a power of two, the outgrown buffer kept
    alive (a graph captured with it still writes there), the counts zero."""
    device = torch.device("cpu")
    partials, counts = split_workspace(device, 1000, 5)
    assert partials.numel() >= 1000 and counts.numel() >= 5 and not counts.any()
    again, same_counts = split_workspace(device, partials.numel(), counts.numel())
    assert again is partials and same_counts is counts
    grown, _ = split_workspace(device, 2 * partials.numel() + 1, 1)
    assert grown.numel() == 4 * partials.numel()
    from draftsmith.kernels.decode_linear import _WORKSPACES

    assert any(t is partials for t in _WORKSPACES[device].retired)


@pytest.mark.gpu
@pytest.mark.parametrize("split_k", SPLITS)
@pytest.mark.parametrize(("n", "k", "kwargs"), [
    (3072, 2048, {}), (2048, 8192, {"residual": True}), (2 * 8192, 2048, {"gated": True}),
    (6144, 4096, {}), (49152, 576, {"out_dtype": torch.float32})])
def test_a_split_product_replays_in_a_cuda_graph(split_k, n, k, kwargs):
    """Layer shapes in bf16 with the default tiles split: the reference's tolerance, row 0
    alone as in 16 rows, and a CUDA graph of three launches replayed twice gives the eager
    bits both times."""
    dtype = torch.bfloat16
    x, w, _, _ = _inputs(16, n, k, "cuda", dtype, split_k)
    kw = dict(kwargs)
    cols = n // 2 if kw.get("gated") else n
    if kw.pop("residual", False):
        kw["residual"] = torch.randn(16, cols, device="cuda", dtype=dtype)
    base = decode_linear_blocks(cols, k, dtype, bool(kw.get("gated")))
    blocks = Blocks(base.block_n, base.block_k, base.num_warps, base.num_stages, split_k)
    eager = decode_linear(x, w, **kw, blocks=blocks)
    torch.testing.assert_close(eager, decode_linear_reference(x, w, **kw), **_tol(dtype))
    first = {k: v[:1] if k == "residual" else v for k, v in kw.items()}
    assert torch.equal(decode_linear(x[:1], w, **first, blocks=blocks), eager[:1])  # M = 1
    outs = [torch.empty_like(eager) for _ in range(3)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        decode_linear(x, w, **kw, blocks=blocks, out=outs[0])  # warm: compiled, workspace grown
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for o in outs:
            decode_linear(x, w, **kw, blocks=blocks, out=o)
    for _ in range(2):
        for o in outs:
            o.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(o, eager) for o in outs)


@pytest.mark.gpu
def test_the_split_workspace_refuses_to_grow_inside_a_capture():
    device = torch.device("cuda", torch.cuda.current_device())
    partials, counts = split_workspace(device, 1, 1)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(DraftsmithError, match="eagerly first"), torch.cuda.graph(graph):
        split_workspace(device, 2 * partials.numel(), 1)
