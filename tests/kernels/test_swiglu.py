"""silu_mul: the Triton kernel against its reference on odd shapes (fp32 on the interpreter)."""

from __future__ import annotations

import pytest
import torch

from draftsmith.contract import ShapeError
from draftsmith.kernels.swiglu import silu_mul, silu_mul_reference


@pytest.mark.parametrize("shape", [(1, 2), (3, 5, 26), (7, 3074), (2, 0, 8)])
def test_kernel_matches_the_reference(device, shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(device) * 4
    got, want = silu_mul(x), silu_mul_reference(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_strided_rows_and_bad_shapes(device):
    x = torch.randn(6, 40).to(device)[::2, :10]  # rows with a stride, last dim contiguous
    torch.testing.assert_close(silu_mul(x), silu_mul_reference(x), atol=1e-6, rtol=1e-6)
    with pytest.raises(ShapeError, match=r"\[\.\.\., 2I\]"):
        silu_mul(torch.zeros(3, 5).to(device))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_within_one_rounding(dtype):
    x = (torch.randn(33, 3072, device="cuda") * 3).to(dtype)
    got, want = silu_mul(x).float(), silu_mul_reference(x).float()
    torch.testing.assert_close(got, want, atol=0, rtol=2 ** -7)
