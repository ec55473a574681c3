"""The round's top-2 of the target logits (recorded margins) against ``torch.topk``."""

from __future__ import annotations

import pytest
import torch

from draftsmith.runtime.round_ops import top2 as _top2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top2_is_topks_values_on_ties_nan_and_infinities(dtype):
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
    got = _top2(x)
    want = torch.topk(before.float(), 2, dim=-1).values
    assert torch.equal(x.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       before.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
    assert got.dtype == torch.float32 and got.shape == (9, 2)
    torch.testing.assert_close(got[:, 0], want[:, 0], equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(got[:, 1], want[:, 0] - want[:, 1], equal_nan=True, rtol=0,
                               atol=0)
    assert got[1, 1] == 0 and got[6, 1] == 0 and torch.isnan(got[2]).all()
