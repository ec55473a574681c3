"""Helpers shared by the selection tests: a chi-square p-value, a thread-emulated TP group, and
logits with the cases order T pins down."""

from __future__ import annotations

import math

import torch
from _threads import run_threaded  # noqa: F401 - re-exported to the tests

from draftsmith.contract import LogitsShard


def chi_square_pvalue(observed: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value of counts ``observed`` against ``probs`` (bins with p > 0).

    Uses scipy when installed, else the Wilson-Hilferty normal approximation of the chi-square
    tail (accurate to well under 1e-3 absolute for the degrees of freedom used here).
    """
    observed = observed.double()
    probs = probs.double()
    assert float(observed[probs == 0].sum()) == 0, "samples fell outside the support"
    keep = probs > 0
    expected = probs[keep] / probs[keep].sum() * observed.sum()
    stat = float(((observed[keep] - expected) ** 2 / expected).sum())
    dof = int(keep.sum()) - 1
    try:
        from scipy.stats import chi2
    except ImportError:  # pragma: no cover - scipy is in the test extras
        z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
        return 0.5 * math.erfc(z / math.sqrt(2))
    return float(chi2.sf(stat, dof))


def shard_of(full: torch.Tensor, rank: int, tp: int) -> LogitsShard:
    """Rank ``rank``'s contiguous shard of ``full: [rows, V]``."""
    v = full.shape[1]
    s = v // tp
    return LogitsShard(full[:, rank * s:(rank + 1) * s].contiguous(), rank * s, v)


def nan_with(payload: int) -> float:
    return float(torch.tensor([payload], dtype=torch.int32).view(torch.float32)[0])


def tp_adversarial_logits(rows: int, v: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Random bf16-rounded rows, then the order-T cases on shard borders of TP 2, 4 and 8."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, v, generator=g) * 3).to(torch.bfloat16).float()
    q = v // 8  # every TP in {2, 4, 8} has a shard border at a multiple of q
    x[0, 3 * q + 2] = nan_with(0x7FC00001)
    x[0, 6 * q] = float("nan")  # first NaN (rank 1 of 2 / rank 1 of 4) wins
    x[1] = float("-inf")  # -> 0
    x[2, [4 * q - 1, 4 * q, 2 * q, v - 1]] = 50.0  # ties across shard borders -> 2q
    x[3] = -1.0
    x[3, 4 * q] = -0.0
    x[3, 6 * q + 1] = 0.0  # -0.0 == +0.0 across ranks -> the lower rank
    x[4, 0] = float("inf")
    x[4, 7 * q] = float("nan")  # NaN on the last rank beats +inf on rank 0
    x[5] = 0.5  # all equal -> 0
    x[6, v - 1] = float("inf")
    x[6, q] = float("inf")  # +inf ties -> q
    return x.to(dtype)
