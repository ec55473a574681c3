"""Sequential Temperature Scaling (STS) of confidence-head scores: one temperature per draft
position, fitted left to right.

The confidence head emits raw logits ``raw: [G, K] fp32``; ``c_j = sigmoid(raw_j / tau_j)`` is the
calibrated probability that draft ``j`` survives given that drafts before it did, and the prefix
survival ``a_j = prod_{i <= j} c_i`` feeds the prefix scheduler. ``fit_sts`` learns the per-position
temperatures ``tau: [K]`` left to right on held-out rollouts by expected calibration error.

Pure tensor functions; positions are 0-based here (``j = 0 .. K-1``), 1-based in the spec.
"""

from __future__ import annotations

import math

import torch

from draftsmith.contract import ConfigError, ShapeError, check_tensor
from draftsmith.contract.checks import value_checks_enabled

STS_GRID_MIN = 0.25
"""Smallest temperature of the default fit grid."""
STS_GRID_MAX = 8.0
"""Largest temperature of the default fit grid."""
STS_GRID_POINTS = 200
"""Points of the default log-spaced fit grid."""
ECE_BINS = 20
"""Equal-width bins of the ECE (DeepSpec's recorder uses 20)."""


def default_grid() -> torch.Tensor:
    """The fit grid ``[200] float64``: log-spaced over ``[0.25, 8]`` (draftsmith's choice, 2.6)."""
    return torch.logspace(math.log10(STS_GRID_MIN), math.log10(STS_GRID_MAX), STS_GRID_POINTS,
                          dtype=torch.float64)


def check_temperatures(tau: object, num_positions: int | None = None) -> torch.Tensor:
    """Validate an STS table: a 1-D float tensor (or sequence) of finite entries ``> 0``, of
    length ``num_positions`` when given. Returns it as ``[K] float32``; raises ``ConfigError``."""
    try:
        table = torch.as_tensor(tau, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"STS temperatures must be a list of K floats, got {tau!r}") from exc
    if table.dim() != 1:
        raise ConfigError(f"STS temperatures must be 1-D [K], got shape {tuple(table.shape)}")
    if num_positions is not None and table.shape[0] != num_positions:
        raise ConfigError(
            f"STS table has {table.shape[0]} temperatures, the drafter needs one per block "
            f"position ({num_positions})"
        )
    if not value_checks_enabled(table):  # a captured round: the plan checked it at bind
        return table
    bad = ~(torch.isfinite(table) & (table > 0))
    if bool(bad.any()):
        index = int(bad.nonzero()[0, 0])
        raise ConfigError(
            f"STS temperature {index} is {table[index].item()!r}; every temperature must be a "
            "finite float > 0"
        )
    return table


def apply_sts(raw: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """Calibrated confidence ``c = sigmoid(raw / tau)``.

    ``raw: [G, K] float32`` raw confidence logits, ``tau: [K]`` temperatures (each finite and
    ``> 0``, else ``ConfigError``; ``K`` may exceed the columns of ``raw``, whose first columns are
    used) -> ``c: [G, K] float32``.
    """
    check_tensor("raw", raw, ("G", "K"), torch.float32)
    table = check_temperatures(tau).to(raw.device)
    k = raw.shape[1]
    if table.shape[0] < k:
        raise ShapeError(f"STS table has {table.shape[0]} temperatures for {k} draft positions")
    return torch.sigmoid(raw / table[:k])


def prefix_survival(c: torch.Tensor) -> torch.Tensor:
    """``a[:, j] = prod_{i <= j} c[:, i]``: ``c: [G, K] float`` -> ``a: [G, K]`` (same dtype)."""
    check_tensor("c", c, ("G", "K"), (torch.float32, torch.float64))
    return torch.cumprod(c, dim=1)


def ece(pred: torch.Tensor, label: torch.Tensor, bins: int = ECE_BINS) -> torch.Tensor:
    """Expected calibration error with equal-width bins over ``[0, 1]``.

    ``pred: [..., N] float`` predicted probabilities, ``label: [N]`` (bool or 0/1) outcomes ->
    ``[...] float64``: ``sum_bins |sum pred - sum label| / N`` over the samples in each bin (a
    prediction of exactly 1 falls in the last bin). Leading dims of ``pred`` are independent
    candidates scored against the same labels. ``N == 0`` gives 0.
    """
    if bins < 1:
        raise ConfigError(f"ECE needs bins >= 1, got {bins}")
    check_tensor("label", label, ("N",))
    if pred.dim() < 1 or pred.shape[-1] != label.shape[0]:
        raise ShapeError(f"pred {tuple(pred.shape)} must end in N = {label.shape[0]} samples")
    n = label.shape[0]
    lead = pred.shape[:-1]
    if n == 0:
        return torch.zeros(lead, dtype=torch.float64, device=pred.device)
    p = pred.reshape(-1, n).double()
    y = label.double().expand_as(p)
    index = (p * bins).floor().clamp(0, bins - 1).long()
    pred_sum = torch.zeros(p.shape[0], bins, dtype=torch.float64, device=p.device)
    label_sum = torch.zeros_like(pred_sum)
    pred_sum.scatter_add_(1, index, p)
    label_sum.scatter_add_(1, index, y)
    return ((pred_sum - label_sum).abs().sum(1) / n).reshape(lead)


def _check_rollouts(raw: torch.Tensor, proposed: torch.Tensor, accepted: torch.Tensor) -> None:
    sizes: dict[str, int] = {}
    check_tensor("raw", raw, ("R", "K"), torch.float32, sizes)
    check_tensor("proposed", proposed, ("R",), torch.int64, sizes)
    check_tensor("accepted", accepted, ("R",), torch.int64, sizes)
    k = raw.shape[1]
    if bool(((proposed < 0) | (proposed > k)).any()):
        raise ShapeError(f"proposed counts must lie in 0..{k} (K = raw.shape[1])")
    if bool(((accepted < 0) | (accepted > proposed)).any()):
        raise ShapeError("accepted counts must lie in 0..proposed for every rollout")


def fit_sts(
    raw: torch.Tensor,
    proposed: torch.Tensor,
    accepted: torch.Tensor,
    grid: torch.Tensor | None = None,
    bins: int = ECE_BINS,
) -> torch.Tensor:
    """Fit the STS table left to right, each temperature minimising its position's ECE.

    ``raw: [R, K] float32`` raw confidence logits of ``R`` held-out rollouts; ``proposed: [R]
    int64`` drafts each rollout proposed (cut at an accepted stop token); ``accepted: [R] int64``
    its leading accepted drafts. For position ``j`` (1-based) the samples are the rollouts with
    ``proposed >= j``, the label is ``accepted >= j`` and the prediction for a candidate ``tau`` is
    ``a_{j-1}^cal * sigmoid(raw_j / tau)``; ``tau_j`` is the grid point of least ECE (the smallest
    such point on ties), frozen before position ``j + 1``. A position no rollout proposed keeps
    ``tau = 1``. ``grid: [T] > 0`` defaults to :func:`default_grid`. Returns ``tau: [K] float32``.
    """
    _check_rollouts(raw, proposed, accepted)
    grid = default_grid() if grid is None else grid
    check_tensor("grid", grid, ("T",), (torch.float32, torch.float64))
    if grid.numel() == 0 or not bool((grid > 0).all()) or not bool(torch.isfinite(grid).all()):
        raise ConfigError("the STS grid must hold at least one finite temperature > 0")
    device = raw.device
    grid = grid.to(device=device, dtype=torch.float64)
    r, k = raw.shape
    tau = torch.ones(k, dtype=torch.float64, device=device)
    survival = torch.ones(r, dtype=torch.float64, device=device)  # a_{j-1}^cal per rollout
    logits = raw.double()
    for j in range(k):
        rows = proposed > j
        if bool(rows.any()):
            label = accepted[rows] > j
            pred = survival[rows][None, :] * torch.sigmoid(logits[rows, j][None, :] / grid[:, None])
            tau[j] = grid[int(torch.argmin(ece(pred, label, bins)))]
        survival = survival * torch.sigmoid(logits[:, j] / tau[j])
    return tau.float()


def sts_ece(
    raw: torch.Tensor,
    proposed: torch.Tensor,
    accepted: torch.Tensor,
    tau: torch.Tensor | None = None,
    bins: int = ECE_BINS,
) -> torch.Tensor:
    """Per-position ECE ``[K] float64`` of prefix survival against "drafts 1..j all accepted" over
    the rollouts that proposed position ``j`` (``tau = None``: raw ``sigmoid``). NaN where no rollout
    proposed the position. The score :func:`fit_sts` minimises, for reporting."""
    _check_rollouts(raw, proposed, accepted)
    k = raw.shape[1]
    table = torch.ones(k, device=raw.device) if tau is None else tau
    a = prefix_survival(apply_sts(raw, table).double())
    out = torch.full((k,), float("nan"), dtype=torch.float64)
    for j in range(k):
        rows = proposed > j
        if bool(rows.any()):
            out[j] = ece(a[rows, j], accepted[rows] > j, bins).cpu()
    return out


__all__ = [
    "ECE_BINS",
    "STS_GRID_MAX",
    "STS_GRID_MIN",
    "STS_GRID_POINTS",
    "apply_sts",
    "check_temperatures",
    "default_grid",
    "ece",
    "fit_sts",
    "prefix_survival",
    "sts_ece",
]
