"""A confidence-scheduled round (``plan.verify_schedule`` other than ``all``) in two phases:
:class:`ScheduledRound`.

Drafting ends with the scheduler choosing each row's admitted prefix; the admitted tokens are
packed first in a list of the block's tokens, and their count rounded up to a token bucket
``T`` is what the host reads; verification then computes those ``T`` tokens only (a packed
verify: its cost follows the admitted tokens, not ``rows * (K + 1)``). Placement, drafting,
verification and commit are the unscheduled round's own steps
(:class:`~draftsmith.runtime.round.Round`). Hot path: must not import pluggy, the registry or
bind.
"""

from __future__ import annotations

from typing import Any

import torch

from draftsmith.drafters.calibration import apply_sts, prefix_survival
from draftsmith.runtime.buckets import row_buckets, verify_token_counts, verify_widths
from draftsmith.runtime.buffers import BucketView
from draftsmith.runtime.scheduler import schedule_prefix, schedule_top_budget, schedule_width

_I64 = torch.int64


class ScheduledRound:
    """The two phases of a scheduled round over the steps of ``round`` (a
    :class:`~draftsmith.runtime.round.Round`)."""

    def __init__(self, round: Any) -> None:
        self.round = round
        plan, dev = round.plan, round.device
        k = plan.num_draft_tokens
        self.sts = torch.tensor(plan.sts_temperatures, dtype=torch.float32, device=dev)
        """The plan's STS table ``[K] fp32``."""
        costs = plan.verify_costs
        self.sps = torch.tensor(costs.sps if costs is not None else (), dtype=torch.float64,
                                device=dev)
        """The plan's ``sps`` table ``[max_batch * (K + 1) + 1] float64`` (empty without one)."""
        self.widths = torch.tensor(verify_widths(k), dtype=_I64, device=dev)
        """The ``width`` schedule's verify widths ``Q`` (ascending, ``K + 1`` last)."""
        self.token_counts = {g: torch.tensor(verify_token_counts(g, k), dtype=_I64, device=dev)
                             for g in row_buckets(plan.slot_capacity)}
        """By rows ``g``: the packed verify's token counts ``T`` (ascending, ``g * (K + 1)``
        last; :func:`~draftsmith.runtime.buckets.verify_token_counts`)."""
        self.block_index = torch.arange(plan.slot_capacity * (k + 1), dtype=_I64, device=dev)
        """``arange(slot_capacity * (K + 1))``: token indices of the largest block."""

    def covers(self, g: int) -> bool:
        """Whether a round over ``g`` rows runs the schedule: the plan's cost profile lists the
        rows buckets where it pays (``verify_costs.scheduled_rows``; none listed: every one)."""
        costs = self.round.plan.verify_costs
        rows = costs.scheduled_rows if costs is not None else None
        return rows is None or g in rows

    def draft(self, g: int, width: int, view: BucketView) -> None:
        """Place and draft as the unscheduled round does, then schedule (:meth:`admitted`) and
        pack.

        ``verify_rows[:g * (K+1)]`` lists the block's tokens ``b * (K+1) + j``: first every live
        row's bonus and admitted drafts (``j <= verify_len[b]``), in block order, then the
        others. ``T``, written to ``buffers.verify_count``, is the smallest of the rows'
        :func:`~draftsmith.runtime.buckets.verify_token_counts` holding the admitted tokens;
        the tokens after them in the list that fill ``T`` are computed too, but no reader looks
        at their results (acceptance stops at each row's admitted length and takes the bonus
        there), and their keys and values land past each row's admitted prefix or in a free
        slot, where the next round writes before it reads.
        """
        rnd, buffers = self.round, self.round.buffers
        placement, key = rnd.place(g, width, view)
        drafts, probs, hidden = rnd.draft(placement, key)
        if probs is not None:  # q, read back by the verify phase
            view.draft_probs.index_copy_(0, view.batch_to_slot, probs)
        view.verify_len.copy_(self.admitted(view, placement.bonus, drafts, hidden))
        view.verify_tokens[:, 0] = placement.bonus
        view.verify_tokens[:, 1:] = drafts
        live = view.batch_to_slot != buffers.dummy_slot
        admitted = (live[:, None] & (rnd.columns <= view.verify_len[:, None])).view(-1)
        ones = admitted.to(_I64)
        count = ones.sum()
        order = torch.where(admitted, torch.cumsum(ones, 0) - 1,
                            count + torch.cumsum(1 - ones, 0) - 1)
        buffers.verify_rows[: order.shape[0]].scatter_(0, order,
                                                       self.block_index[: order.shape[0]])
        counts = self.token_counts[g]
        buffers.verify_count.copy_(counts[torch.searchsorted(counts, count.view(1))])

    def verify(self, g: int, width: int, view: BucketView, t: int) -> None:
        """The target computes the first ``t`` tokens of ``verify_rows`` (every row's bonus and
        admitted drafts, then padding tokens whose results go unread; acceptance stops at each
        row's ``verify_len``), then accept and commit as the unscheduled round does."""
        tokens = view.verify_tokens
        draft_probs = None
        if view.draft_probs is not None:
            draft_probs = view.draft_probs[view.batch_to_slot]
        self.round.verify_commit(g, width, view, tokens, tokens[:, 1:].contiguous(), draft_probs,
                                 view.verify_len, self.round.buffers.verify_rows[:t])

    def admitted(self, view: BucketView, bonus: torch.Tensor, drafts: torch.Tensor,
                 hidden: torch.Tensor) -> torch.Tensor:
        """Admitted lengths ``[G] int64`` (drafted positions) of a round's rows.

        ``bonus: [G]``, ``drafts: [G, K]``, ``hidden: [G, K, H]`` the draft slots' hidden
        states. The drafter's raw confidence ``[G, K]`` is calibrated with the plan's STS table
        (:func:`apply_sts`) into prefix survival (:func:`prefix_survival`); it goes, with the
        live-row mask, to :func:`schedule_prefix` or :func:`schedule_width` with the plan's
        ``sps`` table, or to :func:`schedule_top_budget` with ``verify_budget`` per live row.
        Padding rows get 0.
        """
        plan = self.round.plan
        prev = torch.cat([bonus[:, None], drafts[:, :-1]], dim=1)
        raw = self.round.drafter.confidence(hidden, prev).float()
        survival = prefix_survival(apply_sts(raw, self.sts))
        # the live-row mask: the same lengths as scheduling the live rows alone, no host read
        live = view.batch_to_slot != self.round.buffers.dummy_slot
        if plan.verify_schedule == "prefix":
            return schedule_prefix(survival, self.sps, live)
        if plan.verify_schedule == "width":
            return schedule_width(survival, self.sps, self.widths, live)
        return schedule_top_budget(survival, plan.verify_budget * live.sum(), live=live)


__all__ = ["ScheduledRound"]
