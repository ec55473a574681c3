"""linear: the row-stable GEMM against torch's on odd shapes (fp32 on the interpreter), and the
property it exists for: a row's result is bit-identical whatever rows sit beside it."""

from __future__ import annotations

import pytest
import torch

from draftsmith.contract import ShapeError
from draftsmith.kernels import linear as linear_module
from draftsmith.kernels.linear import linear, linear_reference


def _data(device: str, m: int, n: int, k: int, dtype=torch.float32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(device, dtype)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(device, dtype)
    b = torch.randn(n, generator=gen).to(device, dtype)
    return x, w, b


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (1, 33, 70), (8, 48, 40), (19, 17, 100),
                                   (3, 130, 257), (2, 3, 4100)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_kernel_matches_the_reference(device, m, n, k, with_bias):
    x, w, b = _data(device, m, n, k)
    bias = b if with_bias else None
    got, want = linear(x, w, bias), linear_reference(x, w, bias)
    assert got.shape == want.shape == (m, n)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("m", [1, 2, 7, 8, 9, 17])
def test_each_row_is_bit_identical_at_any_row_count(device, m):
    x, w, b = _data(device, 24, 40, 70, seed=3)
    rows = sorted({0, m // 2, m - 1})  # the first, a middle and the last row, each alone
    alone = torch.cat([linear(x[i : i + 1], w, b) for i in rows])
    assert torch.equal(linear(x[:m], w, b)[rows], alone)
    # and with other rows than its own beside it
    mixed = torch.cat([x[:m], torch.randn(5, 70).to(device)])
    assert torch.equal(linear(mixed, w, b)[rows], alone)


@pytest.mark.parametrize("k", [70, 100, 4100])  # two tiles (64 + 16), one tile, a K loop
def test_rows_per_program_never_change_a_row(device, monkeypatch, k):
    """More rows per program (a larger launch's choice) leave each row's bits as they are."""
    monkeypatch.setattr(linear_module, "MIN_PROGRAMS", 1)
    x, w, b = _data(device, 21, 6, k, seed=4)
    assert linear_module._rows_per_program(21, 2) == 32  # one program holds every row
    alone = torch.cat([linear(x[i : i + 1], w, b) for i in range(21)])
    assert torch.equal(linear(x, w, b), alone)


def test_leading_dims_strides_and_out(device):
    x, w, b = _data(device, 12, 20, 33, seed=5)
    x3 = x.view(3, 4, 33)
    torch.testing.assert_close(linear(x3, w, b), linear_reference(x3, w, b), atol=1e-5,
                               rtol=1e-5)
    strided = torch.randn(12, 66).to(device)[:, :33]  # rows with a stride
    torch.testing.assert_close(linear(strided, w), linear_reference(strided, w), atol=1e-5,
                               rtol=1e-5)
    out = torch.full((12, 20), float("nan")).to(device)
    assert linear(x, w, b, out=out).data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, linear_reference(x, w, b), atol=1e-5, rtol=1e-5)
    assert linear(x[:0], w).shape == (0, 20)


def test_bad_shapes_say_what_is_wrong(device):
    x, w, _ = _data(device, 2, 5, 7)
    with pytest.raises(ShapeError, match=r"x \[\.\.\., K\] and weight \[N, K\]"):
        linear(x, w[:, :6])
    with pytest.raises(ShapeError, match="out must be"):
        linear(x, w, out=torch.empty(2, 4).to(device))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,n,k", [(1, 576, 576), (8, 192, 576), (13, 1536, 576),
                                   (64, 576, 1536), (5, 49152, 576)])
def test_half_precision_rows_and_rounding(dtype, m, n, k):
    x, w, b = _data("cuda", m, n, k, dtype=dtype)
    got = linear(x, w, b)
    want = linear_reference(x.float(), w.float(), b.float())
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2 ** -7)
    assert torch.equal(got[:1], linear(x[:1], w, b))


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(8, 576, 576), (8, 192, 576), (64, 576, 1536),
                                   (16, 49152, 576), (64, 49152, 576), (33, 3072, 576),
                                   (200, 300, 500), (9, 4096, 4100)])
def test_fp32_on_the_gpu_is_ieee_and_row_stable(m, n, k):
    x, w, b = _data("cuda", m, n, k)
    got = linear(x, w, b)
    want = linear_reference(x.double(), w.double(), b.double())
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)  # no TF32 rounding
    assert torch.equal(got[m - 1 :], linear(x[m - 1 :], w, b))
    assert torch.equal(got[:3], linear(x[:3], w, b))  # fewer rows per program there
