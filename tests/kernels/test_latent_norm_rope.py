"""latent_norm_rope: the Triton kernel against its torch reference (interpreter on the CPU, fp32;
fp32 and bf16 on a GPU) on odd widths, one weight or a stack of them, strided rows; the rotary
dims bit for bit; and the interleaved RoPE reference against complex rotation."""

from __future__ import annotations

import pytest
import torch
from _devices import DEVICE_DTYPES

from draftsmith.contract import ShapeError
from draftsmith.kernels.latent_norm_rope import (
    interleaved_rope_reference,
    latent_norm_rope,
    latent_norm_rope_at,
    latent_norm_rope_at_reference,
    latent_norm_rope_reference,
)
from draftsmith.kernels.rope_cos_sin import rope_cos_sin, rope_cos_sin_reference


def _case(rows, n, kv_lora, rope, stacked, device, dtype, seed=0, packed_width=0):
    """Latents ``[rows, n, kv_lora + rope]`` (a column slice of wider rows when
    ``packed_width``, as the drafter slices them out of a packed projection), weights, cos, sin."""
    gen = torch.Generator().manual_seed(seed)
    width = kv_lora + rope
    full = torch.randn(rows, n, packed_width + width, generator=gen) * 3
    latent = full.to(device, dtype)[..., packed_width:]
    shape = (n, kv_lora) if stacked else (kv_lora,)
    weight = (1 + 0.1 * torch.randn(shape, generator=gen)).to(device, dtype)
    positions = torch.randint(0, 9000, (rows,), generator=gen)
    inv_freq = 1.0 / (50.0 ** (torch.arange(0, rope, 2).float() / rope))
    cos, sin = rope_cos_sin_reference(positions, inv_freq, dtype, scale=1.3)
    return latent, weight, 1e-6, cos.to(device), sin.to(device)


def _tol(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(("rows", "n", "kv_lora", "rope", "stacked", "packed_width"), [
    (1, 1, 32, 8, False, 0),
    (13, 3, 111, 6, True, 0),     # a stack of three layers' weights, odd kv_lora
    (7, 1, 512, 64, False, 20),   # DeepSeek's widths, slices of packed rows
    (5, 2, 16, 2, False, 5),      # one rotary pair
])
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_kernel_matches_the_reference(rows, n, kv_lora, rope, stacked, packed_width, device,
                                      dtype):
    args = _case(rows, n, kv_lora, rope, stacked, device, dtype, seed=rows + n,
                 packed_width=packed_width)
    want = latent_norm_rope_reference(*args)
    got = latent_norm_rope(*args)
    assert got.shape == want.shape == (rows, n, kv_lora + rope) and got.dtype == want.dtype
    torch.testing.assert_close(got[..., :kv_lora], want[..., :kv_lora], **_tol(dtype))
    assert torch.equal(got[..., kv_lora:], want[..., kv_lora:])  # the rotation rounds as torch


@pytest.mark.parametrize(("rows", "n", "kv_lora", "rope"), [(1, 1, 32, 8), (13, 3, 111, 6),
                                                          (5, 2, 16, 2)])
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_angles_from_the_positions_are_the_launch_fed_the_tables(rows, n, kv_lora, rope, device,
                                                                 dtype):
    """Cos and sin made in the launch from the positions (scaled) give the bits of the launch
    fed ``rope_cos_sin``'s tables (neither launch contracts into FMAs)."""
    latent, weight, eps, _, _ = _case(rows, n, kv_lora, rope, n > 1, device, dtype, seed=rows)
    gen = torch.Generator().manual_seed(rows + 1)
    positions = torch.randint(0, 70000, (rows,), generator=gen).to(device)
    inv_freq = (1.0 / (50.0 ** (torch.arange(0, rope, 2).float() / rope))).to(device)
    cos, sin = rope_cos_sin(positions, inv_freq, dtype, 1.3)
    want = latent_norm_rope(latent, weight, eps, cos, sin)
    got = latent_norm_rope_at(latent, weight, eps, positions, inv_freq, 1.3)
    assert torch.equal(got, want)
    ref = latent_norm_rope_at_reference(latent, weight, eps, positions, inv_freq, 1.3)
    torch.testing.assert_close(got, ref, **_tol(dtype))
    with pytest.raises(ShapeError, match="inv_freq"):
        latent_norm_rope_at(latent, weight, eps, positions, inv_freq[:-1])


def test_interleaved_rope_is_a_complex_rotation():
    """Pair ``(x[2i], x[2i+1])`` turns by ``pos * inv_freq[i]``, scaled as cos and sin are."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 3, 10, generator=gen, dtype=torch.float64)
    positions = torch.tensor([0, 1, 7, 30, 400, 5000])
    inv_freq = 1.0 / (100.0 ** (torch.arange(0, 10, 2).double() / 10))
    cos, sin = rope_cos_sin_reference(positions, inv_freq, torch.float64, scale=0.7)
    angle = positions.double()[:, None] * inv_freq
    turn = torch.polar(torch.full_like(angle, 0.7), angle)[:, None, :]
    want = torch.view_as_real(torch.view_as_complex(x.view(6, 3, 5, 2)) * turn).flatten(-2)
    torch.testing.assert_close(interleaved_rope_reference(x, cos, sin), want, atol=1e-12,
                               rtol=1e-12)


def test_empty_rows_and_bad_shapes():
    latent, weight, eps, cos, sin = _case(0, 2, 16, 4, True, "cpu", torch.float32)
    assert latent_norm_rope(latent, weight, eps, cos, sin).shape == (0, 2, 20)
    latent, weight, eps, cos, sin = _case(3, 2, 16, 4, True, "cpu", torch.float32)
    with pytest.raises(ShapeError, match="dim 0"):
        latent_norm_rope(latent, weight[:1], eps, cos, sin)
    with pytest.raises(ShapeError, match="rotary dims"):
        latent_norm_rope(latent[..., :17], weight, eps, cos[:, :1], sin[:, :1])
    with pytest.raises(ShapeError, match="dtype"):
        latent_norm_rope(latent, weight.double(), eps, cos, sin)
    with pytest.raises(ShapeError, match="cos"):
        latent_norm_rope(latent, weight, eps, cos[:2], sin[:2])
