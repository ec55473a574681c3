"""RoPE of a packed ``[q | k | v]`` and its cache writes (``rope_store``) against the reference:
odd head counts and widths, Qwen3's per-head norm, a scaled RoPE, strided rows; fp32 on the CPU
(interpreter), bf16 and fp32 on a GPU. Nothing of the cache outside the written cells moves."""

from __future__ import annotations

import pytest
import torch
from _devices import DEVICE_DTYPES

from draftsmith.contract import ShapeError
from draftsmith.kernels.rope_store import rope_store, rope_store_reference

CASES = [(3, 4, 2, 16, False, 1.0), (5, 6, 2, 24, True, 1.0), (1, 3, 3, 64, False, 0.8),
         (7, 9, 3, 64, True, 1.0)]
"""Tokens, query heads, key/value heads, head width, per-head norm, cos/sin scale."""


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_rope_store_matches_the_reference(case, device, dtype):
    r, nq, nkv, hd, norm, scale = case
    g = torch.Generator().manual_seed(r * hd)
    slots, length = 4, 40
    rows = torch.randint(0, slots, (r,), generator=g)
    positions = torch.randperm(length, generator=g)[:r]  # one cell per token
    # rows of the packed projection 3 heads wider than the heads (a strided view)
    packed = (torch.randn(r, nq + 2 * nkv + 3, hd, generator=g) * 2).to(device, dtype)
    inv_freq = (1.0 / 10000 ** (torch.arange(0, hd, 2).float() / hd)).to(device)
    qk_norm = (1 + 0.1 * torch.randn(nq + nkv, hd, generator=g)).to(device, dtype) if norm \
        else None
    outs = []
    for op in (rope_store, rope_store_reference):
        qkv = packed.clone()[:, : nq + 2 * nkv]
        keys = torch.full((slots, nkv, length, hd), 7.0, device=device, dtype=dtype)
        values = keys.clone()
        op(qkv, positions.to(device), inv_freq, keys, values, rows.to(device), nq, scale,
           qk_norm, 1e-6)
        outs.append((qkv, keys, values))
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=2e-2)
    for got, want in zip(outs[0], outs[1], strict=True):
        torch.testing.assert_close(got, want, **tol)
    written = torch.zeros(slots, length, dtype=torch.bool)
    written[rows, positions] = True
    untouched = ~written.to(device)[:, None, :, None].expand_as(outs[0][1])
    assert bool((outs[0][1][untouched] == 7.0).all())
    assert torch.equal(outs[0][2][~untouched], outs[1][2][~untouched])  # values copied as is


def test_bad_shapes_are_refused():
    qkv = torch.randn(2, 8, 16)
    keys = torch.zeros(2, 2, 10, 16)
    pos, rows = torch.tensor([0, 1]), torch.tensor([0, 1])
    inv = torch.ones(8)
    with pytest.raises(ShapeError, match="heads"):
        rope_store(qkv, pos, inv, keys, keys.clone(), rows, 5)
    with pytest.raises(ShapeError):
        rope_store(qkv, pos, torch.ones(7), keys, keys.clone(), rows, 4)
    with pytest.raises(ShapeError):
        rope_store(qkv, pos.float(), inv, keys, keys.clone(), rows, 4)
