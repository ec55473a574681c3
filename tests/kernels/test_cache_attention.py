"""cache_attention: the Triton kernel against its torch reference (interpreter on the CPU, fp32;
bf16 too on a GPU) on odd shapes and split counts, strided queries, rows of several tokens
sharing a program, and the property the target's exactness rests on: a token's output does not
change by a bit with the number of splits, the other tokens of the call, their order, or how
many tokens of its row share its program."""

from __future__ import annotations

import pytest
import torch

from draftsmith.contract import ShapeError
from draftsmith.kernels.cache_attention import (
    SPLIT,
    cache_attention,
    cache_attention_reference,
    chunk_tokens,
)


def _case(device: str, n, nq, nkv, hd, slots, length, dtype=torch.float32, seed=0, strided=False):
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(slots, nkv, length, hd, generator=gen).to(device, dtype)
    values = torch.randn(slots, nkv, length, hd, generator=gen).to(device, dtype)
    if strided:  # the queries as a view of a fused [q | k | v] projection, as the target makes it
        q = torch.randn(n, nq + 2 * nkv, hd, generator=gen).to(device, dtype)[:, :nq]
    else:
        q = torch.randn(n, nq, hd, generator=gen).to(device, dtype)
    rows = torch.randint(0, slots, (n,), generator=gen).to(device)
    return q, keys, values, rows


@pytest.mark.parametrize("shape", [
    # n, nq, nkv, hd, slots, length, columns, positions
    (5, 6, 2, 40, 4, 600, 600, [0, 255, 256, 599, 300]),
    (3, 9, 3, 64, 2, 130, 129, [0, 64, 128]),
    (4, 4, 4, 16, 3, 64, 17, [16, 3, 0, 9]),
    (2, 8, 1, 24, 1, 520, 520, [519, 511]),
])
def test_kernel_matches_the_reference(device, shape):
    n, nq, nkv, hd, slots, length, columns, positions = shape
    q, keys, values, rows = _case(device, n, nq, nkv, hd, slots, length, strided=n == 5)
    pos = torch.tensor(positions, device=device)
    scale = hd ** -0.5
    want = cache_attention_reference(q, keys, values, rows, pos, columns, scale)
    got = cache_attention(q, keys, values, rows, pos, columns, scale)
    assert got.shape == (n, nq, hd) and got.dtype == want.dtype
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_a_token_is_bit_identical_whatever_the_call(device):
    """Splits past a token's position, its neighbours and their order change none of its bits."""
    q, keys, values, rows = _case(device, 6, 6, 2, 32, 3, 3 * SPLIT, seed=4)
    pos = torch.tensor([5, SPLIT - 1, SPLIT, SPLIT + 7, 2 * SPLIT + 1, 0], device=device)
    scale = 0.2
    wide = cache_attention(q, keys, values, rows, pos, 3 * SPLIT, scale)
    for n in range(6):
        bound = int(pos[n]) + 1
        alone = cache_attention(q[n : n + 1], keys, values, rows[n : n + 1], pos[n : n + 1],
                                bound, scale)
        assert torch.equal(alone[0], wide[n]), n
    order = torch.tensor([3, 0, 5, 1, 4, 2], device=device)
    shuffled = cache_attention(q[order], keys, values, rows[order], pos[order], 3 * SPLIT, scale)
    assert torch.equal(shuffled, wide[order])


def _rows_of(device: str, g, q, slots, length, gen):
    """Slots and positions of ``g`` rows of ``q`` consecutive tokens each (a verification)."""
    slot = torch.randint(0, slots, (g,), generator=gen)
    start = torch.randint(0, length - q + 1, (g,), generator=gen)
    rows = slot.repeat_interleave(q).to(device)
    pos = (start[:, None] + torch.arange(q)).reshape(-1).to(device)
    return rows, pos


@pytest.mark.parametrize("shape", [
    # g rows, q tokens a row, nq, nkv, hd, slots, length
    (3, 8, 9, 3, 64, 4, 300),   # SmolLM2's heads, K + 1 = 8: one chunk a row
    (2, 11, 6, 2, 40, 3, 600),  # more tokens than a chunk: two chunks a row, the last short
    (4, 5, 4, 4, 16, 2, 70),    # one query head per key/value head: 32 tokens a chunk
    (2, 3, 16, 2, 24, 2, 530),  # eight query heads per key/value head
])
def test_rows_of_tokens_match_the_reference_and_each_token_alone(device, shape):
    g, q_len, nq, nkv, hd, slots, length = shape
    gen = torch.Generator().manual_seed(g * q_len)
    q, keys, values, _ = _case(device, g * q_len, nq, nkv, hd, slots, length, strided=True, seed=3)
    rows, pos = _rows_of(device, g, q_len, slots, length, gen)
    scale = hd ** -0.5
    got = cache_attention(q, keys, values, rows, pos, length, scale, tokens_per_row=q_len)
    want = cache_attention_reference(q, keys, values, rows, pos, length, scale)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    one_each = cache_attention(q, keys, values, rows, pos, length, scale)
    assert torch.equal(got, one_each)
    for n in (0, q_len - 1, g * q_len - 1):
        alone = cache_attention(q[n : n + 1], keys, values, rows[n : n + 1], pos[n : n + 1],
                                int(pos[n]) + 1, scale)
        assert torch.equal(alone[0], got[n]), n


def test_a_chunk_has_one_tile_height_per_group_and_dtype():
    """The tile height depends on the group and dtype alone (a token's bits must not depend on
    Q)."""
    bf16, fp32 = torch.bfloat16, torch.float32
    assert chunk_tokens(3, bf16) == (8, 32) and chunk_tokens(1, bf16) == (32, 32)
    assert chunk_tokens(8, bf16) == (4, 32) and chunk_tokens(64, bf16) == (1, 64)
    assert chunk_tokens(3, fp32) == (4, 16) and chunk_tokens(16, fp32) == (1, 16)


def test_bad_shapes_and_values_are_refused(device):
    q, keys, values, rows = _case(device, 2, 6, 4, 16, 2, 32)
    pos = torch.zeros(2, dtype=torch.int64, device=device)
    with pytest.raises(ShapeError, match="do not group"):
        cache_attention(q, keys, values, rows, pos, 32, 1.0)
    q, keys, values, rows = _case(device, 2, 4, 2, 16, 2, 32)
    with pytest.raises(ShapeError, match="columns 33"):
        cache_attention(q, keys, values, rows, pos, 33, 1.0)
    with pytest.raises(ShapeError):
        cache_attention(q, keys, values, rows[:1], pos, 32, 1.0)
    with pytest.raises(ShapeError, match="slot ids outside 0 .. 1"):
        cache_attention(q, keys, values, torch.tensor([0, 2], device=device), pos, 32, 1.0)
    with pytest.raises(ShapeError, match="positions must lie in 0 .. 15"):
        cache_attention(q, keys, values, rows, torch.tensor([3, 16], device=device), 16, 1.0)
    with pytest.raises(ShapeError, match="rows of tokens_per_row = 3"):
        cache_attention(q, keys, values, rows, pos, 32, 1.0, tokens_per_row=3)
    with pytest.raises(ShapeError, match="the 2 tokens of a row must read one slot"):
        cache_attention(q, keys, values, torch.tensor([0, 1], device=device), pos, 32, 1.0,
                        tokens_per_row=2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_on_a_gpu(dtype):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    q, keys, values, rows = _case("cuda", 37, 9, 3, 64, 8, 1100, dtype=dtype, strided=True)
    pos = torch.randint(0, 1100, (37,), device="cuda")
    want = cache_attention_reference(q, keys, values, rows, pos, 1100, 0.125)
    got = cache_attention(q, keys, values, rows, pos, 1100, 0.125)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-5
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    alone = cache_attention(q[:1], keys, values, rows[:1], pos[:1], int(pos[0]) + 1, 0.125)
    assert torch.equal(alone[0], got[0])
    gen = torch.Generator().manual_seed(1)
    rows, pos = _rows_of("cuda", 5, 8, 8, 1100, gen)
    q = q[:1].repeat(40, 1, 1) + torch.randn(40, 9, 64, generator=gen).to("cuda", dtype)
    packed = cache_attention(q, keys, values, rows, pos, 1100, 0.125, tokens_per_row=8)
    assert torch.equal(packed, cache_attention(q, keys, values, rows, pos, 1100, 0.125))
    want = cache_attention_reference(q, keys, values, rows, pos, 1100, 0.125)
    torch.testing.assert_close(packed.float(), want.float(), atol=tol, rtol=tol)
