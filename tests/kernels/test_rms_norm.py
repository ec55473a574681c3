"""Fused RMSNorm and per-head RMSNorm + rotate-half RoPE against their references: odd widths and
row counts, strided rows, fp32 on the CPU (interpreter), bf16 and fp32 on a GPU, and the
drafters' own composition (norm then ``apply_rope_neox``)."""

from __future__ import annotations

import pytest
import torch
from _devices import DEVICE_DTYPES

from draftsmith.contract import ShapeError
from draftsmith.drafters.nn import apply_rope_neox, rope_cos_sin, rope_inv_freq
from draftsmith.drafters.nn import rms_norm as drafter_rms_norm
from draftsmith.kernels.head_norm_rope import (
    head_norm_rope,
    head_norm_rope_at,
    head_norm_rope_at_reference,
    head_norm_rope_reference,
    rotate_half_rope,
    rotate_half_rope_reference,
)
from draftsmith.kernels.rms_norm import rms_norm, rms_norm_reference
from draftsmith.kernels.rope_cos_sin import rope_cos_sin as rope_tables

SHAPES = [(1, 64), (7, 576), (33, 111), (5, 3, 96)]
"""Rows x width, a width that is not a power of two, and a leading batch of two dims."""


def _tol(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_rms_norm_matches_reference(shape, device, dtype):
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=g) * 3).to(device, dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(device, dtype)
    want = rms_norm_reference(x, w, 1e-6)
    got = rms_norm(x, w, 1e-6)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, **_tol(dtype))
    # the drafters' rms_norm is this kernel on a GPU (its fp32 sum runs in another order than
    # torch's) and the reference elsewhere
    assert torch.equal(drafter_rms_norm(x, w, 1e-6), got if x.is_cuda else want)


def test_rms_norm_strided_rows_and_empty():
    x = torch.randn(6, 2, 80)[:, 1]  # rows 160 floats apart
    w = torch.randn(80)
    torch.testing.assert_close(rms_norm(x, w, 1e-5), rms_norm_reference(x, w, 1e-5),
                               atol=1e-5, rtol=1e-5)
    assert rms_norm(torch.empty(0, 8), torch.ones(8), 1e-6).shape == (0, 8)
    with pytest.raises(ShapeError):
        rms_norm(torch.randn(3, 8), torch.ones(7), 1e-6)


@pytest.mark.parametrize(("tokens", "heads", "width"), [(1, 9, 64), (13, 3, 64), (5, 2, 30)])
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_head_norm_rope_matches_the_drafters_composition(tokens, heads, width, device, dtype):
    g = torch.Generator().manual_seed(tokens * heads + width)
    x = (torch.randn(tokens, heads, width, generator=g) * 2).to(device, dtype)
    w = (1 + 0.1 * torch.randn(width, generator=g)).to(device, dtype)
    positions = torch.randint(0, 5000, (tokens,), generator=g).to(device)
    cos, sin = rope_cos_sin(positions, rope_inv_freq(width, 10000.0).to(device), dtype)
    want = apply_rope_neox(drafter_rms_norm(x, w, 1e-6), cos, sin)
    if not x.is_cuda:  # the drafters run the references there: the same rounding points
        assert torch.equal(head_norm_rope_reference(x, w, 1e-6, cos, sin), want)
    got = head_norm_rope(x, w, 1e-6, cos, sin)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, **_tol(dtype))


@pytest.mark.parametrize(("tokens", "heads", "width"), [(1, 9, 64), (13, 3, 64), (5, 2, 30)])
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_rotate_half_rope_equals_its_reference_in_place_on_packed_heads(tokens, heads, width,
                                                                       device, dtype):
    """The target's packed ``[q | k | v]`` rows: RoPE on the first ``heads`` heads in place,
    bit for bit the reference's (every product rounds where the reference rounds); the other
    heads untouched."""
    g = torch.Generator().manual_seed(tokens * heads + width)
    packed = (torch.randn(tokens, heads + 2, width, generator=g) * 2).to(device, dtype)
    positions = torch.randint(0, 5000, (tokens,), generator=g).to(device)
    cos, sin = rope_cos_sin(positions, rope_inv_freq(width, 10000.0).to(device), dtype)
    want = rotate_half_rope_reference(packed[:, :heads], cos, sin)
    assert torch.equal(rotate_half_rope(packed[:, :heads], cos, sin), want)
    rest = packed[:, heads:].clone()
    rotate_half_rope(packed[:, :heads], cos, sin, out=packed[:, :heads])
    assert torch.equal(packed[:, :heads], want) and torch.equal(packed[:, heads:], rest)
    with pytest.raises(ShapeError):
        rotate_half_rope(packed[:, :heads], cos[:, :-1], sin[:, :-1])


@pytest.mark.parametrize(("tokens", "heads", "width", "group"),
                         [(1, 9, 64, 1), (6, 3, 64, 2), (5, 2, 30, 5)])
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_head_norm_rope_at_positions_is_the_launch_fed_the_tables(tokens, heads, width, group,
                                                                  device, dtype):
    """Cos and sin made inside the launch from the positions (scaled, one position per
    ``group`` rows, a per-layer weight) give the bits of the launch fed ``rope_cos_sin``'s
    tables; the reference is the tables' reference fed to the norm's."""
    g = torch.Generator().manual_seed(tokens * heads + width + group)
    x = (torch.randn(tokens * group, heads, width, generator=g) * 2).to(device, dtype)
    w = (1 + 0.1 * torch.randn(group, heads, width, generator=g)).to(device, dtype)
    positions = torch.randint(0, 70000, (tokens,), generator=g).to(device)
    inv_freq = rope_inv_freq(width, 10000.0).to(device)
    cos, sin = rope_tables(positions, inv_freq, dtype, 0.8)
    want = head_norm_rope(x, w, 1e-6, cos, sin, cos_group=group)
    got = head_norm_rope_at(x, w, 1e-6, positions, inv_freq, 0.8, cos_group=group)
    inplace = x.clone()
    head_norm_rope_at(inplace, w, 1e-6, positions, inv_freq, 0.8, group, out=inplace)
    assert torch.equal(inplace, got) and torch.equal(got, want)
    ref = head_norm_rope_at_reference(x, w, 1e-6, positions, inv_freq, 0.8, cos_group=group)
    torch.testing.assert_close(got, ref, **_tol(dtype))
    with pytest.raises(ShapeError, match="positions"):
        head_norm_rope_at(x, w, 1e-6, positions[:-1], inv_freq, cos_group=group)


def test_head_norm_rope_refuses_what_it_cannot_do():
    x, w = torch.randn(2, 3, 8), torch.ones(8)
    cos = torch.ones(2, 8)
    with pytest.raises(ShapeError, match="even, non-zero head width"):
        head_norm_rope(torch.randn(2, 3, 7), torch.ones(7), 1e-6, torch.ones(2, 7),
                       torch.ones(2, 7))
    with pytest.raises(ShapeError, match="normalised dtype"):
        head_norm_rope(x, w, 1e-6, cos.bfloat16(), cos.bfloat16())
    with pytest.raises(ShapeError):
        head_norm_rope(x, w, 1e-6, torch.ones(3, 8), torch.ones(3, 8))


@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_head_norm_rope_per_head_and_per_layer_weights(device, dtype):
    """Per-head weights ``[n, d]`` (q and k heads of one packed projection), and ``[L, n, d]``
    over rows that interleave L layers of one token (``cos_group = L``), written in place."""
    g = torch.Generator().manual_seed(4)
    tokens, layers, heads, width = 5, 3, 2, 16
    cos, sin = rope_cos_sin(torch.randint(0, 900, (tokens,), generator=g).to(device),
                            rope_inv_freq(width, 10000.0).to(device), dtype)
    x = torch.randn(tokens, 7, width, generator=g).to(device, dtype)
    w = (1 + 0.1 * torch.randn(7, width, generator=g)).to(device, dtype)
    want = torch.stack([head_norm_rope_reference(x[:, h:h + 1], w[h], 1e-6, cos, sin)[:, 0]
                        for h in range(7)], dim=1)
    assert torch.equal(head_norm_rope_reference(x, w, 1e-6, cos, sin), want)
    torch.testing.assert_close(head_norm_rope(x, w, 1e-6, cos, sin), want, **_tol(dtype))

    packed = torch.randn(tokens, layers, 2, heads, width, generator=g).to(device, dtype)
    wl = (1 + 0.1 * torch.randn(layers, heads, width, generator=g)).to(device, dtype)
    keys = packed[:, :, 0].reshape(tokens * layers, heads, width)  # a strided view
    want = torch.stack([head_norm_rope_reference(packed[:, i, 0], wl[i], 1e-6, cos, sin)
                        for i in range(layers)], dim=1)
    assert torch.equal(head_norm_rope_reference(packed[:, :, 0].reshape(-1, heads, width), wl,
                                                1e-6, cos, sin, cos_group=layers),
                       want.reshape(-1, heads, width))
    values = packed[:, :, 1].clone()
    out = head_norm_rope(keys, wl, 1e-6, cos, sin, cos_group=layers, out=keys)
    assert out.data_ptr() == packed.data_ptr()
    torch.testing.assert_close(packed[:, :, 0], want, **_tol(dtype))
    assert torch.equal(packed[:, :, 1], values)  # the other plane untouched
    with pytest.raises(ShapeError, match="cos_group"):
        head_norm_rope(keys, wl, 1e-6, cos, sin, cos_group=4)
    with pytest.raises(ShapeError, match="divid"):
        head_norm_rope(x, wl[:, :1].expand(3, 7, width), 1e-6, cos, sin)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_add_rms_norm_matches_reference(shape, device, dtype):
    from draftsmith.kernels.add_rms_norm import add_rms_norm, add_rms_norm_reference

    g = torch.Generator().manual_seed(len(shape))
    x = torch.randn(shape, generator=g).to(device, dtype)
    r = torch.randn(shape, generator=g).to(device, dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(device, dtype)
    total, normed = add_rms_norm(x, r, w, 1e-6)
    want_total, want = add_rms_norm_reference(x, r, w, 1e-6)
    assert torch.equal(total, want_total)
    torch.testing.assert_close(normed, want, **_tol(dtype))
