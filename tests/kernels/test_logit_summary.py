"""``logit_summary``: each logit row's NaN flag and top-2 margin in one launch, equal to the
torch reference (``torch.topk``'s values) exactly on odd shapes, ties, infinities
and NaN rows."""

from __future__ import annotations

import pytest
import torch

from draftsmith.contract import ShapeError
from draftsmith.kernels.logit_summary import logit_summary, logit_summary_reference

SHAPES = [(1, 1), (1, 111), (3, 4097), (7, 9000), (99, 37)]


def _check(logits: torch.Tensor, margins: bool = True) -> None:
    nan_k, top_k = logit_summary(logits, margins)
    nan_r, top_r = logit_summary_reference(logits.clone(), margins)
    assert torch.equal(nan_k, nan_r)
    if not margins:
        assert top_k is None and top_r is None
        return
    clean = nan_r == 0
    # exact, a NaN margin (inf - inf) matching a NaN whatever its bits
    torch.testing.assert_close(top_k[clean], top_r[clean], rtol=0, atol=0, equal_nan=True)
    assert bool(torch.isnan(top_k[~clean]).all()) and bool(torch.isnan(top_r[~clean]).all())


@pytest.mark.parametrize("rows,width", SHAPES)
def test_random_rows_equal_the_reference(device: str, rows: int, width: int) -> None:
    g = torch.Generator().manual_seed(rows * 1000 + width)
    _check(torch.randn(rows, width, generator=g).to(device))


def test_topk_values_are_what_it_reports() -> None:
    x = torch.randn(5, 300, generator=torch.Generator().manual_seed(3))
    _, top2 = logit_summary(x)
    values = torch.topk(x, 2).values
    assert torch.equal(top2[:, 0], values[:, 0])
    assert torch.equal(top2[:, 1], values[:, 0] - values[:, 1])


def test_ties_infinities_and_nans(device: str) -> None:
    # three chunks of 8192 columns: a column and the one 8192 after it share a lane
    width, lane = 20000, 8192
    x = torch.randn(10, width, generator=torch.Generator().manual_seed(1))
    x[0, 10] = x[0, 10 + lane] = 50.0       # a tie within one lane, across chunks: margin 0
    x[1, 7] = x[1, 8] = 50.0                # a tie across lanes
    x[2, width - 1] = float("inf")          # one +inf: margin +inf
    x[3, 1] = x[3, 1 + 2 * lane] = float("inf")  # two: inf - inf is NaN, as in torch
    x[4] = float("-inf")                    # every logit -inf: margin NaN
    x[5, 123] = float("nan")                # NaN rows: flagged, NaN reported
    x[6, width - 1] = float("nan")
    x[6, 0] = float("inf")
    x[7, 100 + lane] = 40.0                 # the runner-up in the winner's own lane
    x[7, 100] = 39.0
    x[8, :] = 2.0                           # every value equal
    x[9, 5] = 40.0                          # the runner-up in another lane
    x[9, 6 + lane] = 38.5
    _check(x.to(device))
    nan, top2 = logit_summary(x.to(device))
    assert nan.tolist() == [0, 0, 0, 0, 0, 1, 1, 0, 0, 0]
    assert top2[0, 1].item() == 0.0 and top2[1, 1].item() == 0.0
    assert top2[2, 1].item() == float("inf")
    assert top2[7].tolist() == [40.0, 1.0]
    assert top2[8].tolist() == [2.0, 0.0]
    assert top2[9].tolist() == [40.0, 1.5]


def test_without_margins_only_the_flags(device: str) -> None:
    x = torch.randn(4, 333)
    x[2, 5] = float("nan")
    _check(x.to(device), margins=False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_dtypes_and_a_vocabulary(dtype: torch.dtype) -> None:
    x = torch.randn(64, 49152, generator=torch.Generator().manual_seed(5)).to("cuda", dtype)
    x[3, 17] = float("nan")
    x[9, 5] = x[9, 40000] = x[9].max() + 1
    _check(x)


def test_a_strided_row_view_is_read_in_place() -> None:
    base = torch.randn(6, 200)
    _check(base[::2, 10:150])


def test_bad_input_is_refused() -> None:
    with pytest.raises(ShapeError, match="S >= 1"):
        logit_summary(torch.empty(2, 0))
    with pytest.raises(ShapeError, match="logits"):
        logit_summary(torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(ShapeError, match="logits"):
        logit_summary(torch.zeros(3, 4).t())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_reference_is_topks_values_and_leaves_the_logits_as_they_were(dtype) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 37, generator=g).to(dtype)
    x[1, [3, 20]] = 5.0  # a tie for the lead: margin 0
    x[2, 7] = float("nan")  # NaN leads
    x[3] = float("-inf")  # nothing but -inf
    x[4, 0] = float("inf")
    x[5, [0, 36]] = float("inf")
    x[6, :] = 1.0  # all tied
    x[7, [2, 9]] = float("nan")
    before = x.clone()
    nan, got = logit_summary_reference(x)
    want = torch.topk(before.float(), 2, dim=-1).values
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    assert torch.equal(x.view(bits), before.view(bits))
    assert got.dtype == torch.float32 and got.shape == (9, 2)
    torch.testing.assert_close(got[:, 0], want[:, 0], equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(got[:, 1], want[:, 0] - want[:, 1], equal_nan=True, rtol=0,
                               atol=0)
    assert got[1, 1] == 0 and got[6, 1] == 0 and torch.isnan(got[2]).all()
    assert nan.tolist() == [0, 0, 1, 0, 0, 0, 0, 1, 0]
