"""The packed ``[q | k | v]`` product with RoPE and the cache writes in its epilogue
(``qkv_rope``): bit for bit ``decode_linear`` followed by ``rope_store`` (the launches it
replaces on the few-row path), and close to its reference; odd head counts and widths (pairs of
one program spanning heads), 1 to 17 rows, bias, a scaled RoPE, under PDL; nothing of the cache
outside the written cells moves. fp32 on the CPU (interpreter), bf16 and fp16 on a GPU."""

from __future__ import annotations

import pytest
import torch

from draftsmith.contract import ShapeError
from draftsmith.kernels import interpreted
from draftsmith.kernels.decode_linear import decode_linear
from draftsmith.kernels.qkv_rope import qkv_rope, qkv_rope_reference
from draftsmith.kernels.rope_store import rope_store

DEVICE_DTYPES = [
    pytest.param("cpu", torch.float32, id="cpu-fp32"),
    pytest.param("cuda", torch.bfloat16, marks=pytest.mark.gpu, id="cuda-bf16"),
    pytest.param("cuda", torch.float16, marks=pytest.mark.gpu, id="cuda-fp16"),
]
"""The dtypes of the few-row path: fp32 only under the interpreter."""

CASES = [(1, 64, 4, 2, 16, True, 1.0), (3, 96, 3, 1, 10, False, 0.8),
         (8, 256, 8, 2, 64, True, 1.0), (17, 75, 2, 2, 6, True, 1.0),
         (5, 576, 9, 3, 64, False, 1.0)]
"""Rows, input columns, query heads, key/value heads, head width, bias, cos/sin scale."""


def _case(case, device, dtype):
    r, k, nq, nkv, hd, bias, scale = case
    g = torch.Generator().manual_seed(r * hd + k)
    n = (nq + 2 * nkv) * hd
    x = torch.randn(r, k, generator=g).to(device, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(device, dtype)
    b = torch.randn(n, generator=g).to(device, dtype) if bias else None
    slots, length = 4, 40
    cells = torch.randperm(slots * length, generator=g)[:r]  # one cell per row
    rows, positions = (cells // length).to(device), (cells % length).to(device)
    inv_freq = (1.0 / 10000 ** (torch.arange(0, hd, 2).float() / hd)).to(device)
    cache = torch.full((slots, nkv, length, hd), 7.0, device=device, dtype=dtype)
    return x, w, b, rows, positions, inv_freq, cache, nq, scale


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_the_bits_of_the_product_then_rope_store(case, device, dtype):
    x, w, b, rows, positions, inv_freq, cache, nq, scale = _case(case, device, dtype)
    for pdl in (False, True):
        keys, values = cache.clone(), cache.clone()
        q = qkv_rope(x, w, b, positions, inv_freq, keys, values, rows, nq, scale, pdl=pdl,
                     prefetch=1)
        want_k, want_v = cache.clone(), cache.clone()
        qkv = decode_linear(x, w, b)
        heads = qkv.view(x.shape[0], -1, cache.shape[-1])
        rope_store(heads, positions, inv_freq, want_k, want_v, rows, nq, scale)
        assert torch.equal(q, heads[:, :nq].reshape(x.shape[0], -1)), pdl
        assert torch.equal(keys, want_k) and torch.equal(values, want_v), pdl


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_qkv_rope_matches_the_reference(case, device, dtype):
    x, w, b, rows, positions, inv_freq, cache, nq, scale = _case(case, device, dtype)
    outs = []
    for op in (qkv_rope, qkv_rope_reference):
        keys, values = cache.clone(), cache.clone()
        outs.append((op(x, w, b, positions, inv_freq, keys, values, rows, nq, scale),
                     keys, values))
    tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=2e-2)
    for got, want in zip(outs[0], outs[1], strict=True):
        torch.testing.assert_close(got, want, **tol)
    written = torch.zeros(cache.shape[0], cache.shape[2], dtype=torch.bool, device=device)
    written[rows, positions] = True
    untouched = ~written[:, None, :, None].expand(cache.shape)
    assert (outs[0][1][untouched] == 7.0).all() and (outs[0][2][untouched] == 7.0).all()


def test_bad_shapes_are_refused_with_what_to_change():
    x, w, b, rows, positions, inv_freq, cache, nq, scale = _case(CASES[0], "cpu",
                                                                 torch.float32)
    with pytest.raises(ShapeError, match="weight"):
        qkv_rope(x, w[:-2], None, positions, inv_freq, cache, cache.clone(), rows, nq)
    odd = torch.zeros(4, 2, 40, 15)
    with pytest.raises(ShapeError, match="even width"):
        qkv_rope(x, torch.zeros((nq + 4) * 15, x.shape[1]), None, positions,
                 torch.zeros(7), odd, odd.clone(), rows, nq)
    with pytest.raises(ShapeError, match="inv_freq"):
        qkv_rope(x, w, b, positions, inv_freq[:-1], cache, cache.clone(), rows, nq)


@pytest.mark.gpu
def test_fp32_is_refused_on_a_gpu():
    if interpreted():
        pytest.skip("the interpreter takes fp32 on any device; the GPU suite runs without it")
    x, w, b, rows, positions, inv_freq, cache, nq, scale = _case(CASES[0], "cuda",
                                                                 torch.float32)
    with pytest.raises(ShapeError, match="x must have dtype bfloat16 or float16, got float32"):
        qkv_rope(x, w, b, positions, inv_freq, cache, cache.clone(), rows, nq)
