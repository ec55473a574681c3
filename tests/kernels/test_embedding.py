"""The embedding kernels against their references: the table's rows bit for bit, the norm
bit for bit against ``rms_norm`` on those rows, odd widths and row counts, fp32 on the CPU
(interpreter), bf16 and fp32 on a GPU."""

from __future__ import annotations

import pytest
import torch
from _devices import DEVICE_DTYPES

from draftsmith.contract import ShapeError
from draftsmith.kernels.embedding import (
    embed_rms_norm,
    embed_rms_norm_reference,
    embed_rows,
    embed_rows_reference,
)
from draftsmith.kernels.rms_norm import rms_norm


def _tol(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(("rows", "vocab", "width"), [(1, 50, 64), (8, 301, 576), (13, 7, 111)])
@pytest.mark.parametrize(("device", "dtype"), DEVICE_DTYPES)
def test_embed_rms_norm_has_the_bits_of_the_lookup_then_the_norm(rows, vocab, width, device,
                                                                  dtype):
    """The rows are the table's, bit for bit; the norm is :func:`rms_norm` of them, bit for
    bit (the same row code), and the reference to rounding."""
    g = torch.Generator().manual_seed(rows * width)
    table = (torch.randn(vocab, width, generator=g) * 2).to(device, dtype)
    w = (1 + 0.1 * torch.randn(width, generator=g)).to(device, dtype)
    ids = torch.randint(0, vocab, (rows,), generator=g).to(device)
    ids[0] = vocab - 1
    h, y = embed_rms_norm(ids, table, w, 1e-6)
    want_h, want_y = embed_rms_norm_reference(ids, table, w, 1e-6)
    assert torch.equal(h, want_h)
    assert torch.equal(embed_rows(ids, table), embed_rows_reference(ids, table))
    assert torch.equal(embed_rows(ids, table[:, 1:]), want_h[:, 1:])  # rows of a strided table
    column = torch.stack([ids, ids.flip(0)], dim=1)[:, 0]  # ids two apart, read in place
    assert not column.is_contiguous() or rows == 1
    assert torch.equal(embed_rows(column, table), want_h)
    assert torch.equal(embed_rms_norm(column, table, w, 1e-6)[1], y)
    assert torch.equal(y, rms_norm(want_h, w, 1e-6))
    torch.testing.assert_close(y, want_y, **_tol(dtype))


def test_the_embedding_kernels_refuse_bad_shapes_and_take_no_rows():
    table, w = torch.randn(10, 8), torch.ones(8)
    h, y = embed_rms_norm(torch.empty(0, dtype=torch.int64), table, w, 1e-6)
    assert h.shape == y.shape == (0, 8)
    with pytest.raises(ShapeError):
        embed_rms_norm(torch.zeros(3, dtype=torch.int32), table, w, 1e-6)
    with pytest.raises(ShapeError):
        embed_rms_norm(torch.zeros(3, dtype=torch.int64), table, torch.ones(7), 1e-6)
    with pytest.raises(ShapeError):
        embed_rms_norm(torch.zeros(3, dtype=torch.int64), table.t(), torch.ones(10), 1e-6)
    with pytest.raises(ShapeError):
        embed_rows(torch.zeros(3, dtype=torch.int64), table.t())
    assert embed_rows(torch.empty(0, dtype=torch.int64), table).shape == (0, 8)
