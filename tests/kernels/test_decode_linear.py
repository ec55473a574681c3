"""The few-row product (``decode_linear``) against its reference: odd shapes, bias, the residual
add (in place too), the gate, fp32 logits of a 16-bit product; every row bit for bit the same
whatever the rows beside it; fp32 on the CPU (interpreter), bf16 and fp32 on a GPU."""

from __future__ import annotations

import pytest
import torch
from _devices import DEVICE_DTYPES

from draftsmith.contract import ShapeError
from draftsmith.kernels.decode_linear import (
    BLOCK_M,
    decode_linear,
    decode_linear_blocks,
    decode_linear_reference,
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
    small, large = decode_linear_blocks(2048, 2048, torch.bfloat16), \
        decode_linear_blocks(49152, 4096, torch.bfloat16)
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
