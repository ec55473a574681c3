"""The plan's verify-schedule decisions: whether a drafter can drive the confidence-scheduled
verification (``runtime.verify_schedule``) and what the plan records for it.

Pure functions over declared capabilities and bind-time values; imports neither pluggy nor
``bind`` nor ``plan`` (``plan`` imports this module).
"""

from __future__ import annotations

from collections.abc import Callable

from draftsmith.contract import DrafterCapabilities, PlanError
from draftsmith.runtime.costs import VerifyCosts


def plan_confidence(caps: DrafterCapabilities) -> str:
    """The ``confidence`` value without a schedule: ``score-only`` with a head, else ``none``."""
    return "score-only" if caps.confidence_head else "none"


def check_verify_schedule(schedule: str, caps: DrafterCapabilities, k: int, tp: int,
                          sts: tuple[float, ...] | None, sts_known: bool = True) -> None:
    """:class:`PlanError` naming what a verify schedule other than ``all`` is missing: a
    confidence head, an STS table covering ``K`` positions, ``K > 0``, one rank."""
    if schedule == "all":
        return
    what = f"runtime.verify_schedule = {schedule!r}"
    if not caps.confidence_head:
        raise PlanError(f"{what} needs a drafter with a confidence head; family {caps.family!r} "
                        "declares none (confidence_head = false): set verify_schedule = 'all' "
                        "or load a DSpark drafter with a confidence head")
    if k == 0:
        raise PlanError(f"{what} needs drafts to schedule, but K = 0: set num_draft_tokens > 0 "
                        "or verify_schedule = 'all'")
    if tp > 1:
        raise PlanError(f"{what} runs on one rank for now (TP = {tp}): set verify_schedule = "
                        "'all' under tensor parallelism")
    if sts_known and sts is None:
        raise PlanError(f"{what} needs the drafter's calibration table (sts_temperatures, one "
                        "temperature per block position; fit it with "
                        "draftsmith.drafters.calibration.fit_sts and install it with set_sts or "
                        "in config.json); this drafter has none")
    if sts_known and sts is not None and len(sts) < k:
        raise PlanError(f"{what}: the drafter's STS table covers {len(sts)} positions, fewer "
                        f"than K = {k}; lower num_draft_tokens or refit the table")


def decide_verify_schedule(schedule: str, verify_budget: int | None, costs: VerifyCosts | None,
                           sts: tuple[float, ...] | None, drafter_built: bool,
                           caps: DrafterCapabilities, k: int, tp: int,
                           decide: Callable[[str, object, str], object], *,
                           auto_chose_zero: bool = False) -> tuple[str, int]:
    """Record the ``confidence``, ``verify_schedule`` and ``sps`` decisions through ``decide``
    (``name, value, reason``); returns the schedule the plan runs and the top-budget per-row
    budget (0 otherwise). ``auto_chose_zero``: the cost model chose ``K = 0`` for this bucket,
    so there is nothing to schedule and the plan says so.

    :raises PlanError: see :func:`check_verify_schedule`."""
    if schedule == "all" or auto_chose_zero:
        decide("confidence", plan_confidence(caps),
               "the confidence head is scored only; runtime.verify_schedule = 'all'"
               if caps.confidence_head else "no confidence head")
        decide("verify_schedule", "all",
               f"runtime.verify_schedule = {schedule!r}, but the cost model chose K = 0 for this "
               "bucket: nothing is drafted, nothing to schedule" if schedule != "all"
               else "every row verifies its bonus and all K drafts")
        return "all", 0
    check_verify_schedule(schedule, caps, k, tp, sts, drafter_built)
    decide("confidence", "scheduler",
           "calibrated prefix survival (confidence head, STS table) feeds the verify scheduler")
    budget = 0
    if schedule == "prefix":
        how = ("Algorithm 1 (DSpark): admit drafted positions by survival while the expected "
               "tokens per second rise")
    elif schedule == "width":
        how = ("width: one verify width Q per round, the one of most expected tokens per second "
               "at live rows * Q verify tokens; every live row verifies Q - 1 drafts")
    else:
        budget = k // 2 if verify_budget is None else verify_budget
        if budget > k:
            raise PlanError(f"runtime.verify_budget {budget} exceeds K = {k} drafted positions "
                            "per row; lower it")
        how = (f"top-budget: the {budget} drafted positions per live row of highest survival "
               "(runtime.verify_budget" + (")" if verify_budget is not None
                                           else " unset: K // 2)"))
    decide("verify_schedule", schedule,
           f"{how}; each row verifies its admitted prefix, packed: the target computes only the "
           "admitted tokens, padded to the smallest token count T in 1, 2, 3, 4, 6, 8, 12, ... "
           "rows * (K + 1) holding them; acceptance is capped at "
           "each row's admitted length (lossless)")
    if schedule in ("prefix", "width") or costs is not None:
        if costs is None:
            decide("sps", "measured at bind",
                   "rounds per second by verify-token count: measured on the target when it is "
                   "bound (this plan was made without it)")
        else:
            shown = ", ".join(f"{b}: {costs.sps[b]:.1f}" for b in sorted(
                {1, 2, 4, 8, 16, 32, 64, len(costs.sps) - 1}) if b < len(costs.sps))
            decide("sps", f"{len(costs.sps)} entries",
                   f"rounds per second by verify-token count ({shown}): {costs.source}")
    if costs is None:
        decide("scheduled_rows", "decided at bind",
               "the rows buckets that run the schedule are decided from the cost profile when "
               "the target is bound (this plan was made without it)")
    else:
        rows = costs.scheduled_rows
        decide("scheduled_rows", "all" if rows is None else
               ", ".join(map(str, rows)) or "none", costs.rows_reason)
    return schedule, budget


__all__ = ["check_verify_schedule", "decide_verify_schedule", "plan_confidence"]
