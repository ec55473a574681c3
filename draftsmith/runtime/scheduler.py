"""The hardware-aware prefix scheduler (DSpark paper, Algorithm 1) as pure functions.

Both schedulers take the calibrated prefix survival ``survival: [R, K]`` (``a[r, j] = prod_{i<=j}
c[r, i]``, non-increasing along ``j``; see ``draftsmith.drafters.calibration``) and return verify
lengths ``[R] int64`` in **drafted positions** (0..K): request ``r`` verifies its bonus
token plus its first ``lengths[r]`` drafts.

* :func:`schedule_prefix` is Algorithm 1 exactly, early break included: candidates ``(r, j)`` with
  ``a > 0`` are walked by ``a`` descending, ties by ``(j asc, r asc)``; each admission adds one
  verify token and ``a`` expected accepted tokens; the walk stops at the first admission that does
  not raise ``theta = expected_tokens * SPS(verify_tokens)``. It runs with fixed shapes on the
  survival's device (no host read-back), in float64.
* :func:`schedule_top_budget` is the production form (DSpark paper, section 5.2): the ``budget``
  drafted positions of highest survival are admitted (ties as above), no break.
* :func:`schedule_width`: one width ``Q`` for the whole batch, the one of largest expected
  tokens per second; every live row then verifies ``Q - 1`` drafts.

``sps`` is the profiled throughput table: a 1-D tensor indexed by verify-token count (``sps[B]`` =
target steps per second at ``B`` tokens; entries ``0 .. R * (K + 1)`` must exist) or a callable
mapping an int64 tensor of token counts to a tensor of the same shape (a plain ``int -> float``
function is also accepted and called per count).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from draftsmith.contract import ConfigError, ShapeError, check_tensor

SPSTable = torch.Tensor | Callable[[torch.Tensor], torch.Tensor] | Callable[[int], float]
"""Profiled steps-per-second table: ``sps[B]`` or ``sps(B)`` for ``B`` verify tokens."""

_SURVIVAL_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def sps_values(sps: SPSTable, counts: torch.Tensor, max_count: int | None = None) -> torch.Tensor:
    """``SPS(B)`` for ``counts: [N] int64`` token counts -> ``[N] float64`` on ``counts.device``.

    ``max_count`` is the largest count when the caller knows it (then nothing is read back)."""
    if isinstance(sps, torch.Tensor):
        check_tensor("sps", sps, (None,))
        if max_count is None:
            max_count = int(counts.max()) if counts.numel() else 0
        if sps.shape[0] <= max_count:
            raise ShapeError(
                f"sps table has {sps.shape[0]} entries; it must cover token counts up to "
                f"{max_count} (R * (K + 1)): index it by verify-token count from 0"
            )
        return sps.to(device=counts.device, dtype=torch.float64)[counts]
    if not callable(sps):
        raise ConfigError(f"sps must be a 1-D tensor or a callable, got {type(sps).__name__}")
    try:
        out = sps(counts)  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError):
        out = None
    if isinstance(out, torch.Tensor) and out.shape == counts.shape:
        return out.to(device=counts.device, dtype=torch.float64)
    values = [float(sps(int(b))) for b in counts.tolist()]  # type: ignore[arg-type]
    return torch.tensor(values, dtype=torch.float64, device=counts.device)


def _sorted_candidates(
    survival: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(a, r, j)`` of all ``R * K`` entries, ``a: [R*K] float64`` descending, ties by
    ``(j asc, r asc)`` (a stable sort over the position-major flattening); ``j`` is 1-based."""
    r, k = survival.shape
    flat = survival.t().reshape(-1).double()  # index j * R + r
    a, order = torch.sort(flat, descending=True, stable=True)
    return a, order % r, order // r + 1


def _check_survival(survival: torch.Tensor) -> None:
    check_tensor("survival", survival, ("R", "K"), _SURVIVAL_DTYPES)


def _live(survival: torch.Tensor, live: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(survival with padding rows zeroed [R, K] float64, live rows 0-d int64)`` for the
    ``live: [R] bool`` mask (``None``: every row), on the device, with no host read."""
    r = survival.shape[0]
    if live is None:
        return survival.double(), torch.full((), r, dtype=torch.int64, device=survival.device)
    live = live.to(survival.device)
    check_tensor("live", live, (r,), torch.bool)
    return torch.where(live[:, None], survival.double(), 0.0), live.sum()


def _lengths(rows: torch.Tensor, pos: torch.Tensor, admitted: torch.Tensor, r: int) -> torch.Tensor:
    """``len[r] = max j admitted for r`` (0 if none) -> ``[R] int64``."""
    out = torch.zeros(r, dtype=torch.int64, device=rows.device)
    return out.scatter_reduce(0, rows, torch.where(admitted, pos, 0), reduce="amax")


def schedule_prefix(survival: torch.Tensor, sps: SPSTable,
                    live: torch.Tensor | None = None) -> torch.Tensor:
    """Algorithm 1 (exact, with the early break): ``survival: [R, K]`` -> ``lengths: [R] int64``.

    ``theta_0 = R * SPS(R)``; admitting the ``n``-th sorted candidate gives ``theta_n = (R +
    sum_{m<=n} a_m) * SPS(R + n)`` (sums accumulated in sorted order, float64). Candidates
    ``1..n`` are admitted for the largest ``n`` with ``theta_0 < theta_1 < ... < theta_n`` and
    every ``a_m > 0``; ``lengths[r]`` is the largest admitted ``j`` of request ``r``.

    ``live: [R] bool`` marks the real rows when some are padding: padding rows are never
    admitted and ``R`` in ``theta`` counts the live rows, so the lengths equal those of the live
    rows alone (padding rows get 0), with no host read (a captured graph takes it).
    """
    _check_survival(survival)
    r, k = survival.shape
    device = survival.device
    if r == 0 or k == 0:
        return torch.zeros(r, dtype=torch.int64, device=device)
    survival, n = _live(survival, live)
    a, rows, pos = _sorted_candidates(survival)
    steps = torch.arange(r * k + 1, dtype=torch.int64, device=device)
    counts = n + steps  # verify tokens after 0, 1, ..., R*K admissions
    acc = torch.cumsum(torch.cat((n.to(torch.float64).view(1), a)), 0)
    theta = acc * sps_values(sps, counts, r * (k + 1))
    improves = (theta[1:] > theta[:-1]) & (a > 0)
    admitted = torch.cumprod(improves.to(torch.int64), 0).bool()  # stop at the first failure
    return _lengths(rows, pos, admitted, r)


def schedule_top_budget(
    survival: torch.Tensor,
    budget: int | torch.Tensor,
    floor: float = 0.0,
    min_len: int = 0,
    max_len: int | None = None,
    live: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fixed-shape top-``budget`` admission (the production form of Algorithm 1: no early break).

    ``survival: [R, K]``; ``budget``: drafted positions to admit over all requests (an int or a
    0-d int64 tensor, so a captured graph can take it from a buffer). Entries are sorted as in
    :func:`schedule_prefix`, those with ``a <= floor`` dropped (TensorRT-LLM uses ``1e-6``), and
    the first ``budget`` kept (prefix sums of the kept indicator). Each length is then clamped to
    ``[min_len, max_len]`` (``max_len = None``: ``K``). Returns ``lengths: [R] int64``; without
    the clamp their sum is ``min(budget, #entries above floor)`` and each request's admitted set
    is a prefix. ``live: [R] bool`` (as in :func:`schedule_prefix`): padding rows get 0.
    """
    _check_survival(survival)
    r, k = survival.shape
    device = survival.device
    max_len = k if max_len is None else max_len
    if not 0 <= min_len <= max_len <= k:
        raise ConfigError(f"need 0 <= min_len ({min_len}) <= max_len ({max_len}) <= K ({k})")
    if isinstance(budget, torch.Tensor):
        check_tensor("budget", budget, (), torch.int64)
        budget_t = budget.to(device)
    else:
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
            raise ConfigError(f"budget must be an int >= 0, got {budget!r}")
        budget_t = torch.tensor(budget, dtype=torch.int64, device=device)
    if r == 0 or k == 0:
        return torch.zeros(r, dtype=torch.int64, device=device).clamp(min_len, max_len)
    a, rows, pos = _sorted_candidates(_live(survival, live)[0])
    keep = a > floor
    admitted = keep & (torch.cumsum(keep.to(torch.int64), 0) <= budget_t)
    lengths = _lengths(rows, pos, admitted, r).clamp(min_len, max_len)
    return lengths if live is None else torch.where(live.to(device), lengths, 0)


def schedule_width(survival: torch.Tensor, sps: SPSTable, widths: torch.Tensor,
                   live: torch.Tensor | None = None) -> torch.Tensor:
    """One verify width for the batch: ``survival: [R, K]`` -> ``lengths: [R] int64``.

    ``widths: [W] int64`` the verify widths ``Q`` a round can take (ascending, each in
    ``1 .. K + 1``). ``Q`` maximises ``theta(Q) = (n + sum_r sum_{j < Q} a[r, j]) * SPS(n * Q)``:
    ``n`` the live rows (``live: [R] bool``, default all; padding rows' survival is not counted),
    ``n * Q`` the tokens they verify; ties go to the smaller ``Q``. Live rows get ``Q - 1``,
    padding rows 0. Fixed shapes, no host read.
    """
    _check_survival(survival)
    r, k = survival.shape
    device = survival.device
    check_tensor("widths", widths, ("W",), torch.int64)
    if r == 0 or k == 0:
        return torch.zeros(r, dtype=torch.int64, device=device)
    live = torch.ones(r, dtype=torch.bool, device=device) if live is None else live.to(device)
    a, n = _live(survival, live)
    widths = widths.to(device)
    # expected accepted drafts when every row verifies j drafts, j = 0 .. K
    drafts = torch.cat((a.new_zeros(1), torch.cumsum(a.sum(0), 0)))
    theta = (n + drafts[widths - 1]) * sps_values(sps, n * widths, r * (k + 1))
    # the first maximum (the smaller width on ties), indexed as a [1] tensor: a 0-d index
    # would be read back to the host
    best = widths[torch.argmax(theta).view(1)]
    return torch.where(live, best - 1, 0)


__all__ = ["SPSTable", "schedule_prefix", "schedule_top_budget", "schedule_width", "sps_values"]
