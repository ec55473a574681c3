"""RoPE's cos/sin tables (``kernels.rope_cos_sin``) against their reference: odd position shapes,
odd and one-frequency halves, a scaled RoPE, large positions; fp32 on the CPU (interpreter), bf16
and fp32 on a GPU. The angles are the reference's fp32 products; ``cos`` and ``sin`` are
Triton's, so the tables agree to rounding, not bit for bit."""

from __future__ import annotations

import pytest
import torch
from _devices import DEVICE_DTYPES

from draftsmith.contract import ShapeError
from draftsmith.kernels.rope_cos_sin import rope_cos_sin, rope_cos_sin_reference

CASES = [((3, 5), 7, 1.0), ((11,), 1, 1.0), ((2, 1, 3), 33, 0.7), ((4,), 64, 1.25)]
"""Positions' shape, frequencies (half the head width), scale."""


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_rope_cos_sin_matches_the_reference(case, device, dtype):
    shape, half, scale = case
    g = torch.Generator().manual_seed(half)
    positions = torch.randint(0, 40000, shape, generator=g).to(device)
    inv_freq = (1.0 / 10000 ** (torch.arange(half).float() / half)).to(device)
    cos, sin = rope_cos_sin(positions, inv_freq, dtype, scale)
    want_cos, want_sin = rope_cos_sin_reference(positions, inv_freq, dtype, scale)
    assert cos.shape == sin.shape == (*shape, 2 * half)
    assert cos.dtype == sin.dtype == dtype
    # the same fp32 angles (up to 4e4 radians) in both; Triton's cos and sin differ from
    # torch's in the last bits
    tol = {"atol": 1e-5, "rtol": 0} if dtype == torch.float32 else {"atol": 1e-2, "rtol": 0}
    torch.testing.assert_close(cos, want_cos, **tol)
    torch.testing.assert_close(sin, want_sin, **tol)
    # the halves repeat (HF layout)
    assert torch.equal(cos[..., :half], cos[..., half:])
    assert torch.equal(sin[..., :half], sin[..., half:])


def test_rope_cos_sin_of_no_positions_is_empty():
    inv_freq = torch.ones(3)
    cos, sin = rope_cos_sin(torch.zeros(0, 4, dtype=torch.int64), inv_freq, torch.float32)
    assert cos.shape == sin.shape == (0, 4, 6)


def test_rope_cos_sin_refuses_float_positions_and_int_tables():
    with pytest.raises(ShapeError):
        rope_cos_sin(torch.zeros(3), torch.ones(2), torch.float32)
    with pytest.raises(ShapeError, match="fp32, bf16 or fp16"):
        rope_cos_sin(torch.zeros(3, dtype=torch.int64), torch.ones(2), torch.int32)
