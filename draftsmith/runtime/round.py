"""One decoding round as device computation: :class:`RoundComputation`.

Owns what a round reads and writes on the device (no host reads, no persistent allocation, so a
CUDA graph captures it)::

    place block + store new context (paging) -> block forward -> head logits -> draft chain
    -> target forward of [bonus, drafts] at each row's position -> accept -> commit

A confidence-scheduled round (``plan.verify_schedule`` other than ``all``) runs in two phases:
drafting ends with the scheduler choosing each row's admitted prefix; the admitted tokens are
packed first in a list of the block's tokens, and their count rounded up to a token bucket
``T`` is what the host reads; verification then computes those ``T`` tokens only (a packed
verify: its cost follows the admitted tokens, not ``rows * (K + 1)``).

:class:`draftsmith.runtime.decoder.SpecDecoder` mixes it in and owns the request lifecycle
around it (admission, the host reads, stop and budget rules). Hot path: must not import
pluggy, the registry or bind.
"""

from __future__ import annotations

import dataclasses

import torch

from draftsmith.contract import (
    Collectives,
    DraftBlockInputs,
    DraftBlockPlacement,
    Drafter,
    OutputHead,
    SamplingKey,
    TargetModel,
    TokenSelector,
    values_trusted,
)
from draftsmith.drafters.calibration import apply_sts, prefix_survival
from draftsmith.runtime.acceptance import Acceptance
from draftsmith.runtime.buffers import BucketView, DecoderBuffers
from draftsmith.runtime.markov import DraftChain
from draftsmith.runtime.paging import ContextPager
from draftsmith.runtime.plan import DraftPlan
from draftsmith.runtime.scheduler import schedule_prefix, schedule_top_budget, schedule_width

_I64 = torch.int64



def _top2(logits: torch.Tensor) -> torch.Tensor:
    """``[rows, 2] fp32``: each row's largest logit and its margin over the second largest
    (``torch.topk(logits, 2)``'s values: a tie gives margin 0, a NaN leads).

    Two max passes, the winner masked between them and put back (``logits`` is left as it
    was), instead of ``topk``'s radix select: that took 0.58 ms of a 1024-row verify round of
    SmolLM2's vocabulary on an H200, and the max passes are not among that round's eight
    costliest kernels (each under 0.13 ms; ``benchmarks/rows.py``)."""
    with torch.inference_mode():  # the logits may be inference tensors (written in place)
        x = logits.float()
        first, where = x.max(-1, keepdim=True)
        held = x.gather(-1, where)
        x.scatter_(-1, where, float("-inf"))
        second = x.max(-1, keepdim=True).values
        x.scatter_(-1, where, held)
        return torch.cat((first, first - second), dim=-1)




def _unpack(values: torch.Tensor, rows: torch.Tensor | None, total: int) -> torch.Tensor:
    """``values: [T, ...]`` of a packed verify's ``rows`` placed in ``[total, ...]`` zeros (as is
    when ``rows`` is ``None``)."""
    if rows is None:
        return values
    return values.new_zeros(total, *values.shape[1:]).index_copy_(0, rows, values)


def _scatter_rows(dest: torch.Tensor, values: torch.Tensor, rows: torch.Tensor | None) -> None:
    """Write ``values`` (``[G * Q, F]``, or with ``rows: [T]`` those rows' ``[T, F]``) into
    ``dest: [G, Q, F]`` (contiguous when ``rows`` is given); rows not listed keep their values."""
    if rows is None:
        dest.copy_(values.view(dest.shape))
    else:
        dest.view(-1, dest.shape[-1]).index_copy_(0, rows, values.to(dest.dtype))


class RoundComputation:
    """The round over rows ``0 .. g-1`` of the bind-time buffers (mixed into the decoder, which
    sets these attributes)."""

    plan: DraftPlan
    target: TargetModel
    drafter: Drafter
    selector: TokenSelector
    collectives: Collectives
    buffers: DecoderBuffers
    pager: ContextPager
    chain: DraftChain
    acceptance: Acceptance
    mask_token_id: int
    device: torch.device
    target_embedding: torch.Tensor
    head: OutputHead
    _length: int
    _columns: torch.Tensor
    _sts: torch.Tensor
    """The plan's STS table ``[K] fp32`` on the device (empty without a schedule)."""
    _sps: torch.Tensor
    """The plan's ``sps`` table ``[max_batch * (K + 1) + 1] float64`` (empty without one)."""
    _verify_widths: torch.Tensor
    """The ``width`` schedule's verify widths ``Q`` (ascending, ``int64``, ``K + 1`` last)."""
    _token_counts: dict[int, torch.Tensor]
    """By rows ``g``: the packed verify's token counts ``T`` (ascending, ``int64``,
    ``g * (K + 1)`` last; :func:`~draftsmith.runtime.buckets.verify_token_counts`)."""
    _block_index: torch.Tensor
    """``arange(slot_capacity * (K + 1))``: token indices of the largest block."""

    def _scheduled(self, g: int) -> bool:
        """A round over ``g`` rows runs in two phases: it drafts, ``plan.verify_schedule`` is
        not ``all``, and the plan's cost profile puts ``g`` among the rows buckets that run the
        schedule (``verify_costs.scheduled_rows``); otherwise it verifies every draft."""
        plan = self.plan
        if not plan.drafting or plan.verify_schedule == "all":
            return False
        rows = plan.verify_costs.scheduled_rows if plan.verify_costs is not None else None
        return rows is None or g in rows

    def _any_nan(self, logits: torch.Tensor) -> torch.Tensor:
        """``[rows] int64``: 1 where a row of this rank's logits ``[rows, S]`` holds NaN, summed
        over the ranks (a NaN wins selection, as in ``torch.argmax``: it decided that row's
        token)."""
        nan = torch.isnan(logits).any(-1).to(_I64)
        return self.collectives.all_reduce(nan) if self.plan.tp_size > 1 else nan

    def round_core(self, g: int, width: int) -> None:
        """One round over rows ``0 .. g-1``, reading and writing only device state.

        ``width``: context columns the target and the drafter attend to, at least every real
        row's position plus ``K + 1``. Padding rows (``batch_to_slot`` = dummy) compute at
        clamped positions of their own free slots and touch no live state. No host reads, no
        persistent allocation: a CUDA graph captures it. Where ``g`` rows run the schedule
        (:meth:`_scheduled`) the round is its two phases with the token count read back between
        them (:meth:`draft_phase_core`, :meth:`verify_phase_core`); the decoder captures each
        phase instead.
        """
        with values_trusted():
            view = self.buffers.view(g)
            if self._scheduled(g):
                self._draft_scheduled(g, width, view)
                self._verify_scheduled(g, width, view, int(self.buffers.verify_count[0]))
            else:
                self._round(g, width, view)

    def draft_phase_core(self, g: int, width: int) -> None:
        """A scheduled round's first phase over rows ``0 .. g-1``: place, draft, score the
        drafts' confidence and schedule; writes ``verify_tokens``, ``verify_len``,
        ``verify_rows`` and the token count ``T`` (``buffers.verify_count``, the host reads
        it). No host reads: captured per ``(rows, width)``."""
        with values_trusted():
            self._draft_scheduled(g, width, self.buffers.view(g))

    def verify_phase_core(self, g: int, width: int, t: int) -> None:
        """A scheduled round's second phase: the target computes the first ``t`` tokens of
        ``verify_rows`` (every row's bonus and admitted drafts, then padding tokens whose
        results go unread; acceptance stops at each row's ``verify_len``), then accept and
        commit as :meth:`round_core`. No host reads: captured per ``(rows, width, t)``."""
        with values_trusted():
            self._verify_scheduled(g, width, self.buffers.view(g), t)

    def _round(self, g: int, width: int, view: BucketView) -> None:
        """Every row verifies its bonus and all ``K`` drafts (or, with ``K = 0``, its last
        committed token)."""
        draft_probs = None
        if self.plan.drafting:
            placement, key = self._place(g, width, view)
            drafts, draft_probs = self._draft(placement, key, view)
            tokens = torch.cat([placement.bonus[:, None], drafts], dim=1)
        else:
            drafts = view.accepted[:, :0]
            tokens = view.accepted  # K = 0: the last committed token
        self._verify_commit(g, width, view, tokens, drafts, draft_probs, None)

    def _draft_scheduled(self, g: int, width: int, view: BucketView) -> None:
        """Place and draft as :meth:`_round` does, then schedule (:meth:`schedule_rows`) and
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
        placement, key = self._place(g, width, view)
        drafts, probs, hidden = self.draft_block(placement, key)
        if probs is not None:  # q, read back by the verify phase
            view.draft_probs.index_copy_(0, view.batch_to_slot, probs)
        view.verify_len.copy_(self.schedule_rows(view, placement.bonus, drafts, hidden))
        view.verify_tokens[:, 0] = placement.bonus
        view.verify_tokens[:, 1:] = drafts
        live = view.batch_to_slot != self.buffers.dummy_slot
        admitted = (live[:, None] & (self._columns <= view.verify_len[:, None])).view(-1)
        ones = admitted.to(_I64)
        count = ones.sum()
        order = torch.where(admitted, torch.cumsum(ones, 0) - 1,
                            count + torch.cumsum(1 - ones, 0) - 1)
        index = self._block_index[: order.shape[0]]
        self.buffers.verify_rows[: order.shape[0]].scatter_(0, order, index)
        counts = self._token_counts[g]
        self.buffers.verify_count.copy_(counts[torch.searchsorted(counts, count.view(1))])

    def _verify_scheduled(self, g: int, width: int, view: BucketView, t: int) -> None:
        tokens = view.verify_tokens
        draft_probs = None
        if view.draft_probs is not None:
            draft_probs = view.draft_probs[view.batch_to_slot]
        self._verify_commit(g, width, view, tokens, tokens[:, 1:].contiguous(), draft_probs,
                            view.verify_len, self.buffers.verify_rows[:t])

    def _verify_commit(self, g: int, width: int, view: BucketView, tokens: torch.Tensor,
                       drafts: torch.Tensor, draft_probs: torch.Tensor | None,
                       verify_len: torch.Tensor | None,
                       rows: torch.Tensor | None = None) -> None:
        """Target forward of ``tokens: [G, Q]`` (bonus and drafts ``[G, Q-1]``, ``q``
        ``[G, Q-1, V]`` for rejection) at each row's position, accept (up to ``verify_len``
        drafts per row when given), commit and write the host's result row. ``rows: [T]``
        (with ``Q = K + 1``): a packed verify of those tokens only (``b * Q + j``); the
        results of the others are zero (token 0, no NaN) and never read."""
        plan, k = self.plan, self.plan.num_draft_tokens
        starts = view.target_len.clamp(max=self._length - (k + 1))
        q = tokens.shape[1]
        out = (self.target.forward_rows(tokens, starts, width) if rows is None else
               self.target.forward_rows(tokens, starts, width, compute_rows=rows))
        key = None if plan.greedy else SamplingKey(view.seeds, starts)
        accepted, n = self.acceptance.accept(out.logits, drafts, key, draft_probs=draft_probs,
                                             verify_len=verify_len, rows=rows)
        # columns past q keep an earlier round's values: every reader stops at n <= q
        view.accepted[:, :q].copy_(accepted)
        view.num_accepted.copy_(n)
        if plan.drafting:
            _scatter_rows(view.features[:, :q], out.features, rows)
        torch.add(starts, n, out=view.target_len)
        # a committed token chosen from logits holding NaN ends its request (checked by the host)
        nan_rows = _unpack(self._any_nan(out.logits.logits), rows, g * q).view(g, q)
        view.result[:, 0] = n
        view.result[:, 1] = (nan_rows * (self._columns[:q] < n[:, None])).amax(-1)
        view.result[:, 2 : q + 2] = accepted
        if plan.record_margins:  # fp32 bit patterns, so the one read carries them
            bits = _unpack(_top2(out.logits.logits).view(torch.int32).to(_I64), rows, g * q)
            view.result[:, k + 3 : k + 3 + 2 * q] = bits.view(g, 2 * q)

    def _place(self, g: int, width: int,
               view: BucketView) -> tuple[DraftBlockPlacement, SamplingKey | None]:
        """Place the block of rows ``0 .. g-1`` at context ``width`` and store the context
        entries the last round committed (paging); returns the placement and the drafts' key."""
        plan, k = self.plan, self.plan.num_draft_tokens
        placement = self.pager.place(view.batch_to_slot, view.accepted, view.num_accepted)
        placement = dataclasses.replace(placement, context_width=width)
        entries = self.drafter.project_context(view.features.reshape(g * (k + 1), -1),
                                               placement.ctx_positions.reshape(-1))
        self.pager.store(placement, entries)
        key = None if plan.greedy else SamplingKey(view.seeds, placement.new_ctx_len + 1)
        return placement, key

    def schedule_rows(self, view: BucketView, bonus: torch.Tensor, drafts: torch.Tensor,
                      hidden: torch.Tensor) -> torch.Tensor:
        """Admitted lengths ``[G] int64`` (drafted positions) of a round's rows.

        ``bonus: [G]``, ``drafts: [G, K]``, ``hidden: [G, K, H]`` the draft slots' hidden
        states. The drafter's raw confidence ``[G, K]`` is calibrated with the plan's STS table
        (:func:`apply_sts`) into prefix survival (:func:`prefix_survival`); it goes, with the
        live-row mask, to :func:`schedule_prefix` or :func:`schedule_width` with the plan's
        ``sps`` table, or to :func:`schedule_top_budget` with ``verify_budget`` per live row.
        Padding rows get 0.
        """
        plan = self.plan
        prev = torch.cat([bonus[:, None], drafts[:, :-1]], dim=1)
        raw = self.drafter.confidence(hidden, prev).float()
        survival = prefix_survival(apply_sts(raw, self._sts))
        # the live-row mask: the same lengths as scheduling the live rows alone, no host read
        live = view.batch_to_slot != self.buffers.dummy_slot
        if plan.verify_schedule == "prefix":
            return schedule_prefix(survival, self._sps, live)
        if plan.verify_schedule == "width":
            return schedule_width(survival, self._sps, self._verify_widths, live)
        return schedule_top_budget(survival, plan.verify_budget * live.sum(), live=live)

    def _draft(
        self, placement: DraftBlockPlacement, key: SamplingKey | None, view: BucketView
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Block forward, head, chain and selection: drafts ``[G, K]`` and ``q`` ``[G, K, V]``."""
        drafts, probs = self.draft_core(placement, key)
        return drafts, self._slot_probs(probs, view)

    def _slot_probs(self, probs: torch.Tensor | None, view: BucketView) -> torch.Tensor | None:
        """``q`` ``[G, K, V]`` stored at each row's slot of the bind-time table and read back
        from there (``None`` without rejection sampling)."""
        if probs is None:
            return None
        table = view.draft_probs
        assert table is not None
        table.index_copy_(0, view.batch_to_slot, probs)  # padding rows land on dummy_slot_row
        return table[view.batch_to_slot]

    def draft_core(
        self, placement: DraftBlockPlacement, key: SamplingKey | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The drafting computation: drafts ``[G, K]`` and, for rejection, ``q`` ``[G, K, V]``."""
        drafts, probs, _ = self.draft_block(placement, key)
        return drafts, probs

    def draft_block(
        self, placement: DraftBlockPlacement, key: SamplingKey | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """:meth:`draft_core` plus the draft slots' hidden states ``[G, K, H]`` (what the
        confidence head reads)."""
        plan = self.plan
        g, k, first = placement.num_requests, plan.num_draft_tokens, plan.first_draft_slot
        ids = self.buffers.block_ids[:g]
        ids.fill_(self.mask_token_id)
        ids[:, 0] = placement.bonus
        emb = self.drafter.embed_block(ids, self.target_embedding)
        inputs = DraftBlockInputs(token_ids=ids, positions=placement.query_positions, embeddings=emb)
        hidden = self.drafter.forward_block(inputs, placement, self.buffers.cache)
        draft_hidden = hidden[:, first : first + k]
        logits = self.drafter.block_logits(draft_hidden.reshape(g * k, -1), self.head)
        base = logits.logits.view(g, k, -1)
        probs = None
        if self.buffers.draft_probs is not None:
            probs = torch.empty(g, k, plan.vocab_size, dtype=torch.float32, device=self.device)
        drafts, _ = self.chain.run(base, logits.vocab_start, placement.bonus, key,
                                   hidden=draft_hidden, probs_out=probs)
        return drafts, probs, draft_hidden


__all__ = ["RoundComputation"]
