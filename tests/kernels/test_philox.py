"""Philox4x32-10: known-answer vectors, keyed uniforms, the kernels' device helpers == the
reference bit for bit."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError
from draftsmith.kernels.philox import (
    centred_uniform_reference,
    philox4x32_10_reference,
    philox_uniform,
    philox_uniform_reference,
)

M = 0xFFFFFFFF

# Random123 kat_vectors for philox4x32_10: (counter, key) -> output
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((M, M, M, M), (M, M), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_known_answer_vectors(counter, key, expected) -> None:
    out = philox4x32_10_reference(
        tuple(torch.tensor(c) for c in counter), tuple(torch.tensor(k) for k in key)
    )
    assert tuple(int(w) for w in out) == expected


def test_wide_products_are_exact() -> None:
    # the reference relies on int64 multiply wrapping modulo 2**64 for 32x32-bit products
    from draftsmith.kernels.philox import _mulhilo32

    a = torch.randint(0, 2**32, (4096,), generator=torch.Generator().manual_seed(0))
    a[:2] = torch.tensor([M, 2**31])
    for b in (0xD2511F53, 0xCD9E8D57):
        hi, lo = _mulhilo32(a, b)
        want = [int(x) * b for x in a.tolist()]
        assert hi.tolist() == [w >> 32 for w in want]
        assert lo.tolist() == [w & M for w in want]


@triton.jit
def _triton_randint_kernel(out_ptr, seed, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, tl.randint(seed, offs).to(tl.int32, bitcast=True))


def test_matches_triton_randint_word0() -> None:
    # tl.randint(seed, i) is word 0 of Philox4x32-10 with counter (i, 0, 0, 0), key = seed
    seed, n = 0x1234_5678_9ABC, 64
    out = torch.empty(n, dtype=torch.int32)
    _triton_randint_kernel[(1,)](out, seed, N=n)
    ids = torch.arange(n)
    zero = torch.zeros_like(ids)
    ref = philox4x32_10_reference((ids, zero, zero, zero),
                                  (torch.tensor(seed & M), torch.tensor(seed >> 32)))[0]
    assert torch.equal(out.to(torch.int64) & M, ref)


def _keys(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rows)
    seeds = torch.randint(-(2**62), 2**62, (rows,), generator=g)
    seeds[0] = 0
    offsets = torch.randint(0, 2**40, (rows,), generator=g)
    offsets[-1] = 2**33 + 7  # offset hi word in use
    return seeds, offsets


@pytest.mark.parametrize("stream", [0, 1, 2])
@pytest.mark.parametrize("shared_ids", [True, False])
def test_device_helpers_equal_reference(stream: int, shared_ids: bool) -> None:
    seeds, offsets = _keys(5)
    ids = torch.arange(3000) if shared_ids else torch.randint(0, 2**24, (5, 777))
    ref = philox_uniform_reference(seeds, offsets, ids, stream)
    out = philox_uniform(seeds, offsets, ids, stream)
    assert torch.equal(out.view(torch.int32), ref.view(torch.int32))


def test_four_ids_share_one_call() -> None:
    """Ids ``4q .. 4q+3`` take the four words of Philox call ``q`` in order; id 0 (the acceptance
    uniform) is word 0 of counter ``(0, offset, stream)``, as before the four-word keying."""
    seeds, offsets = _keys(3)
    q = torch.tensor([0, 1, 12345, 2**22 - 1])
    ids = (4 * q[:, None] + torch.arange(4)).reshape(-1)
    got = philox_uniform_reference(seeds, offsets, ids, 2).view(3, len(q), 4)
    col = (slice(None), None)
    words = philox4x32_10_reference(
        (q[None, :], (offsets & M)[col], (offsets >> 32)[col], torch.full((1, len(q)), 2)),
        ((seeds & M)[col], (seeds >> 32)[col]))
    for j in range(4):
        assert torch.equal(got[:, :, j], centred_uniform_reference(words[j]))


def test_words_of_one_call_are_jointly_uniform() -> None:
    """The four words of one call: each pair of lanes of 20000 calls falls evenly into an 8 x 8
    grid (chi-square, 63 degrees of freedom, well inside 5 sigma), and no lane repeats
    another."""
    seeds = torch.arange(20_000) * 7919 + 11
    offsets = torch.arange(20_000) * 3
    u = philox_uniform_reference(seeds, offsets, torch.arange(4), 1)
    for a in range(4):
        for b in range(a + 1, 4):
            assert not torch.equal(u[:, a], u[:, b])
            cell = (u[:, a] * 8).long() * 8 + (u[:, b] * 8).long()
            counts = torch.bincount(cell, minlength=64).double()
            expected = u.shape[0] / 64
            stat = float(((counts - expected) ** 2 / expected).sum())
            assert stat < 63 + 5 * (2 * 63) ** 0.5, (a, b, stat)


def test_uniform_grid_and_range() -> None:
    seeds, offsets = _keys(4)
    u = philox_uniform_reference(seeds, offsets, torch.arange(50_000), 0)
    assert u.dtype == torch.float32
    assert float(u.min()) >= 2.0**-24 and float(u.max()) <= 1 - 2.0**-24
    k = u * 2**23 - 0.5  # exact: integers in [0, 2**23)
    assert torch.equal(k, k.round())
    # roughly uniform: 16 equal bins within 5 sigma
    counts = torch.histc(u, bins=16, min=0, max=1)
    expected = u.numel() / 16
    assert float((counts - expected).abs().max()) < 5 * expected**0.5


def test_streams_offsets_and_seeds_decorrelate() -> None:
    seeds, offsets = _keys(2)
    ids = torch.arange(256)
    base = philox_uniform_reference(seeds, offsets, ids, 0)
    assert torch.equal(base, philox_uniform_reference(seeds, offsets, ids, 0))
    for other in (
        philox_uniform_reference(seeds, offsets, ids, 1),
        philox_uniform_reference(seeds, offsets + 1, ids, 0),
        philox_uniform_reference(seeds + 1, offsets, ids, 0),
        philox_uniform_reference(seeds, offsets + 2**32, ids, 0),
    ):
        assert float((other == base).float().mean()) < 0.05


def test_offsets_per_element_and_strided_ids() -> None:
    """``offsets: [rows, n]`` (rejection sampling's ``offset + j``) and ids with a zero stride:
    kernel and reference agree bit for bit, and one offset per element is the per-row form
    column by column."""
    seeds, offsets = _keys(4)
    off = offsets[:, None] + torch.arange(9)
    ids = torch.zeros(9, dtype=torch.int64)
    ref = philox_uniform_reference(seeds, off, ids, 2)
    assert torch.equal(philox_uniform(seeds, off, ids, 2).view(torch.int32),
                       ref.view(torch.int32))
    for j in range(9):
        column = philox_uniform_reference(seeds, offsets + j, ids[:1], 2)[:, 0]
        assert torch.equal(ref[:, j], column)


@pytest.mark.parametrize("seeds,offsets,ids", [
    ((3,), (3,), (2, 4)),      # ids of another row count
    ((3,), (3, 5), (4,)),      # offsets of another width
    ((3,), (2,), (4,)),        # offsets of another row count
    ((), (3,), (4,)),          # a scalar seed
    ((3,), (3,), (1, 3, 4)),   # ids of three dims
])
def test_the_kernel_refuses_shapes_it_would_read_past(seeds, offsets, ids) -> None:
    with pytest.raises(ShapeError, match="philox_uniform needs seeds"):
        philox_uniform(torch.zeros(seeds, dtype=torch.int64), torch.zeros(offsets, dtype=torch.int64),
                       torch.zeros(ids, dtype=torch.int64), 0)


@pytest.mark.parametrize("draw", [philox_uniform, philox_uniform_reference])
def test_uniforms_validate_the_stream(draw) -> None:
    seeds, offsets = _keys(3)
    with pytest.raises(ShapeError, match="stream"):
        draw(seeds, offsets, torch.arange(4), -1)


@pytest.mark.gpu
def test_device_helpers_equal_reference_gpu() -> None:
    seeds, offsets = _keys(7)
    ids = torch.randint(0, 2**24, (7, 100_003))
    ref = philox_uniform_reference(seeds, offsets, ids, 1)
    out = philox_uniform(seeds.cuda(), offsets.cuda(), ids.cuda(), 1).cpu()
    assert torch.equal(out.view(torch.int32), ref.view(torch.int32))
