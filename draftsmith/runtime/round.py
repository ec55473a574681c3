"""One decoding round as device computation: :class:`Round`, of the components bind built
(``runtime/reference_loop.py`` is the same round written plainly, one request at a time). It
reads and writes only device state (no host reads, no persistent allocation: a CUDA graph
captures it): place the block and store the new context -> block forward -> head logits ->
draft chain -> target forward of [bonus, drafts] -> accept -> commit. A confidence-scheduled
round is :class:`~draftsmith.runtime.round_scheduled.ScheduledRound`'s two phases around the
same steps; :class:`~draftsmith.runtime.decoder.SpecDecoder` owns a ``Round`` and the request
lifecycle. Hot path: must not import pluggy, the registry or bind.
"""

from __future__ import annotations

import dataclasses

import torch

from draftsmith.contract import (
    Collectives,
    DraftBlockInputs,
    DraftBlockPlacement,
    Drafter,
    SamplingKey,
    TargetModel,
    values_trusted,
)
from draftsmith.kernels import pdl_scope
from draftsmith.kernels.logit_summary import logit_summary, logit_summary_reference
from draftsmith.kernels.round_commit import round_commit, round_commit_reference
from draftsmith.runtime.acceptance import Acceptance
from draftsmith.runtime.buffers import BucketView, DecoderBuffers
from draftsmith.runtime.markov import DraftChain
from draftsmith.runtime.paging import ContextPager
from draftsmith.runtime.plan import DraftPlan
from draftsmith.runtime.round_ops import scatter_rows, unpack
from draftsmith.runtime.round_scheduled import ScheduledRound


class Round:
    """The round over rows ``0 .. g-1`` of the bind-time buffers."""

    def __init__(self, *, plan: DraftPlan, target: TargetModel, drafter: Drafter,
                 collectives: Collectives, buffers: DecoderBuffers, pager: ContextPager,
                 chain: DraftChain, acceptance: Acceptance, mask_token_id: int) -> None:
        self.plan, self.target, self.drafter = plan, target, drafter
        self.collectives, self.buffers, self.pager = collectives, buffers, pager
        self.chain, self.acceptance = chain, acceptance
        self.device = buffers.ctx_len.device
        fused = plan.kernels == "fused"
        self._summarize = logit_summary if fused else logit_summary_reference
        self._commit = round_commit if fused else round_commit_reference
        self.target_embedding = target.input_embedding()
        self.head = target.output_head()
        self.length = 0  # target positions per slot the rounds are prepared for (0: not yet)
        self.columns = torch.arange(plan.num_draft_tokens + 1, device=self.device)
        # the block's token ids: the mask token past column 0, once (column 0, the bonus, is
        # written by every placement: ContextPager.place)
        buffers.block_ids.fill_(mask_token_id)
        self.schedule = ScheduledRound(self) if plan.drafting and plan.verify_schedule != "all" else None

    def run(self, g: int, width: int) -> None:
        """One round over rows ``0 .. g-1`` at context ``width`` (every real row's position
        plus ``K + 1`` at least); padding rows (the dummy slot) touch no live state. A scheduled
        round reads its token count between its phases (the decoder captures each instead)."""
        with values_trusted():
            view = self.buffers.view(g)
            if self.schedule is not None and self.schedule.covers(g):
                self.schedule.draft(g, width, view)
                self.schedule.verify(g, width, view, int(self.buffers.verify_count[0]))
                return
            draft_probs = None
            if self.plan.drafting:
                placement, key = self.place(g, width, view)
                # the verification's tokens: the bonus, then the drafts the chain writes beside it
                tokens = torch.empty(g, self.plan.num_draft_tokens + 1, dtype=torch.int64,
                                     device=self.device)
                drafts, probs, _ = self.draft(placement, key, tokens_out=tokens)
                draft_probs = self.slot_probs(probs, view)
            else:
                drafts = view.accepted[:, :0]
                tokens = view.accepted  # K = 0: the last committed token
            self.verify_commit(g, width, view, tokens, drafts, draft_probs, None)

    def place(self, g: int, width: int,
              view: BucketView) -> tuple[DraftBlockPlacement, SamplingKey | None]:
        """Place the block of rows ``0 .. g-1`` at context ``width`` and store the context
        entries the last round committed (paging); returns the placement and the drafts' key."""
        k = self.plan.num_draft_tokens
        placement = self.pager.place(view.batch_to_slot, view.accepted, view.num_accepted)
        placement = dataclasses.replace(placement, context_width=width)
        with pdl_scope(self.plan.round_pdl):
            entries = self.drafter.project_context(view.features.reshape(g * (k + 1), -1),
                                                   placement.ctx_positions.reshape(-1))
        self.pager.store(placement, entries)
        key = None if self.plan.greedy else SamplingKey(view.seeds, placement.new_ctx_len + 1)
        return placement, key

    def draft(self, placement: DraftBlockPlacement, key: SamplingKey | None,
              tokens_out: torch.Tensor | None = None,
              ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Block forward, head, chain and selection: drafts ``[G, K]``, ``q`` ``[G, K, V]`` (for
        rejection) and the draft slots' hidden states ``[G, K, H]`` (for a confidence head).
        ``placement`` comes from :meth:`ContextPager.place`, which wrote each row's bonus into
        the block's token ids. ``tokens_out: [G, K + 1] int64`` receives the bonus and the
        drafts (:meth:`DraftChain.run`)."""
        plan = self.plan
        g, k, first = placement.num_requests, plan.num_draft_tokens, plan.first_draft_slot
        ids = self.buffers.block_ids[:g]
        with pdl_scope(plan.round_pdl):  # the built-in drafters' kernels (the chain has its own)
            emb = self.drafter.embed_block(ids, self.target_embedding)
            inputs = DraftBlockInputs(token_ids=ids, positions=placement.query_positions,
                                      embeddings=emb)
            hidden = self.drafter.forward_block(inputs, placement,
                                                self.buffers.cache)[:, first:first + k]
            logits = self.drafter.block_logits(hidden.reshape(g * k, -1), self.head)
        probs = (torch.empty(g, k, plan.vocab_size, dtype=torch.float32, device=self.device)
                 if self.buffers.draft_probs is not None else None)
        drafts, _ = self.chain.run(logits.logits.view(g, k, -1), logits.vocab_start,
                                   placement.bonus, key, hidden=hidden, probs_out=probs,
                                   want_corrected=False, tokens_out=tokens_out)
        return drafts, probs, hidden

    def slot_probs(self, probs: torch.Tensor | None, view: BucketView) -> torch.Tensor | None:
        """``q [G, K, V]`` kept at each row's slot of the bind-time table and read from there."""
        if probs is None or view.draft_probs is None:
            return None
        view.draft_probs.index_copy_(0, view.batch_to_slot, probs)  # padding: the dummy's row
        return view.draft_probs[view.batch_to_slot]

    def verify_commit(self, g: int, width: int, view: BucketView, tokens: torch.Tensor,
                      drafts: torch.Tensor, draft_probs: torch.Tensor | None,
                      verify_len: torch.Tensor | None, rows: torch.Tensor | None = None) -> None:
        """Target forward of ``tokens: [G, Q]`` (bonus and drafts ``[G, Q-1]``, ``q``
        ``[G, Q-1, V]`` for rejection) at each row's position, accept (up to ``verify_len``
        drafts per row when given), commit and write the host's result row. ``rows: [T]``:
        a packed verify of those tokens only (``b * Q + j``; the others' results are unread)."""
        plan, k = self.plan, self.plan.num_draft_tokens
        starts = view.target_len.clamp(max=self.length - (k + 1))
        q = tokens.shape[1]
        out = (self.target.forward_rows(tokens, starts, width) if rows is None else
               self.target.forward_rows(tokens, starts, width, compute_rows=rows))
        key = None if plan.greedy else SamplingKey(view.seeds, starts)
        accepted, n = self.acceptance.accept(out.logits, drafts, key, draft_probs=draft_probs,
                                             verify_len=verify_len, rows=rows)
        if plan.drafting:
            scatter_rows(view.features[:, :q], out.features, rows)
        # a committed token chosen from logits holding NaN ends its request (checked by the
        # host); the margins go out as fp32 bit patterns, so the one read carries them
        nan, margins = self.summary(out.logits.logits)
        nan = unpack(nan, rows, g * q)
        margins = None if margins is None else unpack(margins, rows, g * q)
        # columns past q keep an earlier round's values: every reader stops at n <= q
        self._commit(accepted, n, starts, nan, margins, view.accepted, view.num_accepted,
                     view.target_len, view.result, k + 3)

    def summary(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(nan [rows] int64, top2 [rows, 2] fp32 | None)`` of this rank's logits ``[rows,
        S]``: 1 where a row holds NaN, summed over the ranks (a NaN wins selection, as in
        ``torch.argmax``), and with ``record_margins`` each row's winning logit and margin
        (:func:`~draftsmith.kernels.logit_summary.logit_summary`, one launch)."""
        nan, top2 = self._summarize(logits, self.plan.record_margins)
        return (self.collectives.all_reduce(nan) if self.plan.tp_size > 1 else nan), top2


__all__ = ["Round"]
