"""``round_commit``: a round's outcome written to the round state and the host's result row in
one launch, equal (``torch.equal``) to the torch reference on every buffer it writes."""

from __future__ import annotations

import pytest
import torch

from draftsmith.contract import ShapeError
from draftsmith.kernels.round_commit import round_commit, round_commit_reference

_I64 = torch.int64


def _inputs(g: int, q: int, k1: int, width: int, margins: bool, seed: int, device: str):
    gen = torch.Generator().manual_seed(seed)
    accepted = torch.randint(0, 50000, (g, q), generator=gen, dtype=_I64)
    n = torch.randint(1, q + 1, (g,), generator=gen, dtype=_I64)
    starts = torch.randint(0, 900, (g,), generator=gen, dtype=_I64)
    nan = (torch.rand(g * q, generator=gen) < 0.3).to(_I64) * torch.randint(1, 3, (g * q,),
                                                                           generator=gen)
    top2 = torch.randn(g * q, 2, generator=gen) if margins else None
    if top2 is not None:
        top2[0, 1] = float("inf")
        top2[-1, 0] = -0.0
    # the state buffers are wider than the round (a bucket's view of the bind-time table), the
    # result row holds the margins after K + 3 columns
    state = torch.full((g + 2, k1 + 3), -7, dtype=_I64)
    result = torch.full((g + 2, width), -9, dtype=_I64)
    num = torch.full((g + 2,), -5, dtype=_I64)
    length = torch.full((g + 2,), -6, dtype=_I64)
    tensors = [accepted, n, starts, nan, top2, state, num, length, result]
    return [None if t is None else t.to(device) for t in tensors]


def _views(t, g: int, q: int):
    accepted, n, starts, nan, top2, state, num, length, result = t
    return [accepted, n, starts, nan, top2, state[:g, : q + 1], num[:g], length[:g], result[:g]]


@pytest.mark.parametrize("g,q,margins", [(1, 1, True), (1, 8, True), (5, 8, False),
                                         (33, 6, True), (3, 17, True)])
def test_kernel_writes_what_the_reference_writes(device: str, g: int, q: int,
                                                 margins: bool) -> None:
    k1 = q
    width = k1 + 3 + (2 * q if margins else 0)
    kern = _inputs(g, q, k1, width, margins, g * 100 + q, device)
    ref = [None if t is None else t.clone() for t in kern]
    round_commit(*_views(kern, g, q), margin_col=k1 + 2)
    round_commit_reference(*_views(ref, g, q), margin_col=k1 + 2)
    for a, b in zip(kern, ref, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)
    # rows past the view and columns past its width are untouched
    state, result = kern[5], kern[8]
    assert bool((state[g:] == -7).all()) and bool((state[:, q + 1 :] == -7).all())
    assert bool((result[g:] == -9).all())


def test_the_nan_flag_counts_committed_tokens_only() -> None:
    g, q = 2, 4
    accepted = torch.arange(g * q, dtype=_I64).view(g, q)
    n = torch.tensor([2, 4])
    nan = torch.tensor([0, 0, 1, 0,    # row 0: a NaN after its two committed tokens
                        0, 0, 0, 1])   # row 1: a NaN in its fourth
    result = torch.zeros(g, q + 2, dtype=_I64)
    state = torch.zeros(g, q, dtype=_I64)
    round_commit(accepted, n, torch.zeros(g, dtype=_I64), nan, None, state,
                 torch.zeros(g, dtype=_I64), torch.zeros(g, dtype=_I64), result, 0)
    assert result[:, 1].tolist() == [0, 1]
    assert result[:, 0].tolist() == [2, 4]


def test_bad_layouts_are_refused() -> None:
    g, q = 2, 3
    t = _inputs(g, q, q, q + 3 + 2 * q, True, 0, "cpu")
    views = _views(t, g, q)
    with pytest.raises(ShapeError, match="margins"):
        round_commit(*views, margin_col=1)  # the margins would overwrite the tokens
    short = list(views)
    short[8] = t[8][:g, : q + 2]
    with pytest.raises(ShapeError, match="result has"):
        round_commit(*short, margin_col=q + 3)
    bad = list(views)
    bad[3] = t[3][: g * q - 1]
    with pytest.raises(ShapeError, match="nan"):
        round_commit(*bad, margin_col=q + 3)
