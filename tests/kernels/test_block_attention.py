"""block_attention: the Triton kernel against its torch reference (interpreter on the CPU, fp32;
bf16 on a GPU), on odd shapes, every visibility rule, ragged contexts and shuffled pages."""

from __future__ import annotations

import pytest
import torch

from draftsmith.contract import ShapeError
from draftsmith.kernels.block_attention import (
    block_attention,
    block_attention_reference,
    visible,
)


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


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (False, 5), (True, 3)])
@pytest.mark.parametrize("shape", [
    # g, w, nh, nkv, hd, page, num_ctx, columns
    (1, 8, 9, 3, 64, 16, [37], 64),
    (3, 5, 4, 1, 24, 4, [0, 13, 70], 77),
    (2, 1, 6, 2, 16, 8, [1, 129], 130),
])
def test_kernel_matches_the_reference(device, shape, causal, window):
    g, w, nh, nkv, hd, page, num_ctx, columns = shape
    args = _case(device, g, w, nh, nkv, hd, page, num_ctx, columns, strided=g == 3)
    scale = hd ** -0.5
    want = block_attention_reference(*args, causal, window, scale)
    got = block_attention(*args, causal, window, scale)
    assert got.shape == (g, w, nh, hd) and got.dtype == want.dtype
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_context_beyond_num_ctx_and_unused_pages_are_never_read(device):
    """Poisoning every pool entry outside the advertised context changes nothing."""
    args = list(_case(device, 2, 4, 4, 2, 16, 4, [6, 11], 16))
    want = block_attention(*args, False, None, 0.25)
    pool, tables, nctx = args[3], args[4], args[5]
    poisoned = torch.full_like(pool, float("nan"))
    for b in range(2):
        for c in range(int(nctx[b])):
            p, o = int(tables[b, c // 4]), c % 4
            poisoned[p, :, :, o] = pool[p, :, :, o]
    args[3] = poisoned
    torch.testing.assert_close(block_attention(*args, False, None, 0.25), want, atol=0, rtol=0)


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


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_on_gpu(dtype):
    args = _case("cuda", 5, 8, 9, 3, 64, 16, [0, 1, 300, 511, 64], 512, dtype=dtype, strided=True)
    want = block_attention_reference(*args, False, None, 0.125).float()
    got = block_attention(*args, False, None, 0.125).float()
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
