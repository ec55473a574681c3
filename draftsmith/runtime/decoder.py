"""The batched, lossless speculative decoding loop: :class:`SpecDecoder`.

Owns the request lifecycle (admission, prefill, rounds) over the components that ``bind`` built
from the plan: the paging component, the draft chain (Markov or plain selection), acceptance,
the target and the bind-time buffers. The checks of a call's inputs and each request's stop and
budget rules are :mod:`draftsmith.runtime.requests`'s. Request ``r`` lives in slot
``s`` of every per-slot state, and batch row ``s`` of a round is that slot: a round over ``G``
rows serves slots ``0 .. G-1`` (free slots among them are padding, routed to the dummy slot).

One round, :meth:`SpecDecoder.round_core` (the decoder's
:class:`~draftsmith.runtime.round.Round`), reads and writes only device state. Committing is
advancing the row's target position and keeping the round's accepted tokens, counts and target
features for the next placement. With ``plan.cuda_graphs`` the round is captured per (rows,
context width) bucket by :meth:`SpecDecoder.prepare` and replayed; the host then reads the
device once per round (counts and tokens, one copy). With ``plan.overlap``
:meth:`SpecDecoder.generate` keeps one round ahead: round ``t + 1`` is launched before the host
reads and commits round ``t``, so the host's work overlaps the device's (its inputs are device
state the round before wrote; the host's positions are one round stale, so its context width is
bounded by one more round's advance). A confidence-scheduled round is captured as its two
phases, drafting per (rows, width) and verification per (rows, width, token count ``T``), and
the host reads ``T`` between them: two reads per round. ``K = 0`` is plain decoding through the
same round: the target's one-token step. Prefill stays eager. Hot path: must not import
pluggy, the registry or bind.
"""

from __future__ import annotations

import contextlib
import gc
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from draftsmith.contract import (
    Collectives,
    ConfigError,
    Drafter,
    PlanError,
    SamplingKey,
    TargetModel,
    TokenSelector,
    values_trusted,
)
from draftsmith.runtime.acceptance import TARGET_STREAM, Acceptance
from draftsmith.runtime.buckets import (
    MIN_CONTEXT_BUCKET,
    PREFILL_WIDTHS,
    prefill_width,
    row_buckets,
    verify_token_counts,
    width_buckets,
)
from draftsmith.runtime.buckets import bucket as _bucket
from draftsmith.runtime.buffers import DecoderBuffers
from draftsmith.runtime.costs import RoundRecord
from draftsmith.runtime.graphs import CapturedCall
from draftsmith.runtime.markov import DraftChain
from draftsmith.runtime.paging import ContextPager, SlotManager
from draftsmith.runtime.plan import DraftPlan
from draftsmith.runtime.requests import GenerationResult, _Request, make_requests
from draftsmith.runtime.round import Round

_I64 = torch.int64


GROUP_ADMIT_POSITIONS = 16384
"""Padded prompt positions one grouped admission forward holds (``rows * width``)."""

YOUNG_GC_EVERY = 256
"""While :meth:`SpecDecoder.generate` runs, Python's automatic garbage collection is paused and
the two young generations are collected every this many steps instead. A full (oldest
generation) pass scans every object of a process that holds a model and a tokenizer (400000 and
more; 0.3 s on a 2-core host), and one that fell inside a run stalled one decoding step by that
long; a young pass takes well under a millisecond. The automatic collector resumes when
``generate`` returns."""


@dataclass
class _Launched:
    """A round launched and not yet committed: its requests, rows bucket, the pinned host rows
    its result is copied into and the event after that copy."""

    active: list[_Request]
    g: int
    host: torch.Tensor
    done: torch.cuda.Event | None
    start: float
    scheduled: bool


def _float_pairs(bits: list[int]) -> list[tuple[float, float]]:
    """fp32 values written into the int64 result as their 32-bit patterns, in pairs."""
    values = struct.unpack(f"<{len(bits)}f", struct.pack(f"<{len(bits)}i", *bits))
    return list(zip(values[::2], values[1::2], strict=True))


class SpecDecoder:
    """A bound speculative decoder: the plan plus the components built from it."""

    def __init__(
        self,
        *,
        plan: DraftPlan,
        target: TargetModel,
        drafter: Drafter,
        selector: TokenSelector,
        collectives: Collectives,
        buffers: DecoderBuffers,
        slots: SlotManager,
        pager: ContextPager,
        chain: DraftChain,
        acceptance: Acceptance,
        mask_token_id: int,
        default_seed: int = 0,
    ) -> None:
        self.plan = plan
        self.target = target
        self.drafter = drafter
        self.selector = selector
        self.collectives = collectives
        self.buffers = buffers
        self.slots = slots
        self.pager = pager
        self.chain = chain
        self.acceptance = acceptance
        self.mask_token_id = mask_token_id
        self.default_seed = default_seed
        self.device = buffers.ctx_len.device
        self.round = Round(plan=plan, target=target, drafter=drafter, collectives=collectives,
                           buffers=buffers, pager=pager, chain=chain, acceptance=acceptance,
                           mask_token_id=mask_token_id)
        """The round's device computation (:mod:`draftsmith.runtime.round`)."""
        self.graphs: dict[tuple[int, int], CapturedCall] = {}
        """Captured rounds by ``(rows, context width)`` (a scheduled round: its drafting
        phase)."""
        self.verify_graphs: dict[tuple[int, int, int], CapturedCall] = {}
        """A scheduled round's captured verify phase by ``(rows, context width, T)``."""
        self._graph_pool = None
        self._graph_cache_version = -1
        self._rows = row_buckets(plan.slot_capacity)
        self._widths: tuple[int, ...] = ()
        self._pinned = self.device.type == "cuda"
        """Host staging buffers are pinned (copies from them to the device do not block the host)."""
        self._host_results = [torch.empty(buffers.result.shape, dtype=_I64,
                                          pin_memory=self._pinned) for _ in range(2)]
        """Two pinned copies of the result rows: a round in flight ahead copies into the other."""
        self._next_host = 0
        self._host_count = torch.zeros(1, dtype=_I64, pin_memory=self._pinned)
        self.admissions: dict[int, CapturedCall] = {}
        """Captured one-prompt admissions by prefill width."""
        cap = plan.slot_capacity
        self._adm_args = torch.zeros(cap, 3, dtype=_I64, device=self.device)
        """Per admitted prompt, ``[slot, prompt length, seed]`` (row 0 alone: one prompt)."""
        self._host_args = torch.zeros(cap, 3, dtype=_I64, pin_memory=self._pinned)
        self._adm_ids = torch.zeros(cap, 0, dtype=_I64, device=self.device)
        self._host_ids = torch.zeros(cap, 0, dtype=_I64, pin_memory=self._pinned)
        self._adm_rows = torch.arange(cap, dtype=_I64, device=self.device)
        self._adm_result = torch.zeros(cap, 4, dtype=_I64, device=self.device)
        """Per admitted prompt, ``[first token, nan, winning logit, margin]`` (the last two as
        fp32 bit patterns)."""
        self._host_adm = torch.zeros(cap, 4, dtype=_I64, pin_memory=self._pinned)
        self.clock: Callable[[], float] = time.perf_counter
        """What :meth:`step` times itself with (tests replace it)."""
        self.rounds: list[RoundRecord] = []
        """The rounds of the last :meth:`generate` call, in order: what the cost model's
        online correction reads (``runtime.costs.RoundTimes``)."""

    # ---- public API ---------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int | Sequence[int],
        stop_token_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
        seeds: Sequence[int] | None = None,
        progress: Callable[[list[list[int]]], None] | None = None,
    ) -> list[GenerationResult]:
        """Decode every prompt; requests beyond the slot capacity wait for a free slot.

        ``max_new_tokens``: one budget for all or one per prompt; ``stop_token_ids``: one set for
        all or one per prompt; ``seeds``: per-request sampling seeds (default: the selection
        config's seed plus the request index); ``progress``: called after every round with the
        tokens generated so far, one list per prompt. Calls :meth:`prepare` first (cheap when
        nothing new is needed); time a second call to leave graph capture out. Pauses Python's
        automatic garbage collection while it runs (:data:`YOUNG_GC_EVERY`). Leaves the record
        of every round it took in :attr:`rounds`.
        """
        reqs = make_requests(self.plan, self.target, self.default_seed, prompts,
                             max_new_tokens, stop_token_ids, seeds)
        self._prepare_requests(reqs)
        self.rounds = []
        waiting = list(reqs)
        active: list[_Request] = []
        collecting = gc.isenabled()
        gc.disable()  # no full pass inside the loop (YOUNG_GC_EVERY)
        steps = 0
        inflight: list[_Launched] = []
        since = 0.0
        try:
            while waiting or active or inflight:
                if waiting and self.slots.num_free:
                    admitted = waiting[: self.slots.num_free]
                    waiting = waiting[len(admitted):]
                    started, took = self._timed_admission(admitted, group=steps == 0)
                    active.extend(r for r in started if not r.finish)
                    since += took  # a round in flight is timed from the last commit, less this
                if not self.plan.overlap:
                    if not active:
                        continue
                    self.rounds.append(self.step(active))
                else:
                    if active and (not inflight or self._may_run_ahead(active, inflight)):
                        launched = self.launch(active, ahead=len(inflight))
                        if not inflight:
                            since = launched.start
                        inflight.append(launched)
                        if len(inflight) == 1 and self._may_run_ahead(active, inflight):
                            continue  # launch the next before waiting for this one
                    if not inflight:
                        continue
                    record = self.complete(inflight.pop(0), since)
                    since = self.clock()
                    self.rounds.append(record)
                active = [r for r in active if not r.finish]
                if progress is not None:
                    progress([list(r.tokens) for r in reqs])
                steps += 1
                if collecting and steps % YOUNG_GC_EVERY == 0:
                    gc.collect(1)
        except BaseException:
            # an error (or an interrupt) must not leave slots held: the decoder stays usable
            self._abandon(reqs)
            raise
        finally:
            if collecting:
                gc.enable()
        check = getattr(self.target, "check_kernels", None)
        if check is not None:  # a target whose kernels can fail without raising says so here
            check()
        return [
            GenerationResult(tuple(r.tokens), tuple(r.lengths), r.finish, r.prefill_s, r.decode_s,
                             r.error, tuple(r.margins) if self.plan.record_margins else None)
            for r in reqs
        ]

    def prepare(self, max_requests: int, max_positions: int, max_prompt: int = 0) -> None:
        """Size the target cache for ``max_positions`` positions per slot and, with
        ``plan.cuda_graphs``, capture the round for every (rows, width) bucket that
        ``max_requests`` requests of at most that many positions can use, and the admission
        for every prefill width a prompt of up to ``max_prompt`` tokens uses. Where some prompt
        takes the target's batched prefill instead, that prefill runs once at each width first.

        Must run while no request is active: capture runs the round on the buffers, and every
        per-slot state is reset afterwards.
        """
        plan = self.plan
        if not 1 <= max_positions <= plan.max_ctx:
            raise ConfigError(f"{max_positions} positions per request exceed max_ctx "
                              f"{plan.max_ctx}; raise runtime.max_context")
        if self.slots.num_free != plan.slot_capacity:
            raise PlanError("prepare() needs every slot free: it resets the per-slot state")
        want = min(max(1 << (max_positions - 1).bit_length(), MIN_CONTEXT_BUCKET), plan.max_ctx)
        if want > self.round.length:
            self.round.length = want
            self._widths = width_buckets(want)
            self._drop_graphs()  # their clamps and widths were for the shorter cache
            cap = plan.slot_capacity
            self._adm_ids = torch.zeros(cap, want, dtype=_I64, device=self.device)
            self._host_ids = torch.zeros(cap, want, dtype=_I64, pin_memory=self._pinned)
        self.target.reserve(plan.slot_capacity, self.round.length)
        if max_prompt and not (plan.cuda_graphs and self._admits_rows(
                prefill_width(max_prompt, self.round.length))):
            self.target.warm_prefill(max_prompt)  # some prompt takes the batched prefill
        if not plan.cuda_graphs:
            return
        version = self.target.cache_version
        if version != self._graph_cache_version:  # the target cache moved: graphs are stale
            self._drop_graphs()
            self._graph_cache_version = version
        rows = self._rows[: self._rows.index(_bucket(min(max_requests, plan.slot_capacity),
                                                     self._rows)) + 1]
        missing = [(g, w) for g in rows for w in self._widths if (g, w) not in self.graphs]
        top = prefill_width(max(max_prompt, 1), self.round.length)
        prefills = [w for w in PREFILL_WIDTHS
                    if w <= top and w not in self.admissions and self._admits_rows(w)]
        if not missing and not prefills:
            return
        if self._graph_pool is None:
            self._graph_pool = torch.cuda.graph_pool_handle()
        counter = self.acceptance.forced_counter.clone()
        # one eager call of each on this stream first: what a first forward builds and keeps
        # (packed weights, RoPE frequencies, compiled kernels) is made outside any capture
        self._adm_args[0].copy_(torch.tensor([0, 1, 0]))  # slot 0, a one-token prompt
        for w in prefills[-1:]:
            self.admit_core(w)
        if missing:
            self.round_core(*max(missing))
        for w in reversed(prefills):  # largest first: the rest reuse its memory
            self.admissions[w] = CapturedCall(lambda w=w: self.admit_core(w), self._graph_pool)
        for g, w in sorted(missing, reverse=True):
            if not self._scheduled(g):
                self.graphs[(g, w)] = CapturedCall(lambda g=g, w=w: self.round_core(g, w),
                                                   self._graph_pool)
                continue
            self.graphs[(g, w)] = CapturedCall(lambda g=g, w=w: self.draft_phase_core(g, w),
                                               self._graph_pool)
            for t in reversed(verify_token_counts(g, plan.num_draft_tokens)):
                self.verify_graphs[(g, w, t)] = CapturedCall(
                    lambda g=g, w=w, t=t: self.verify_phase_core(g, w, t), self._graph_pool)
        self.acceptance.forced_counter.copy_(counter)
        self.buffers.reset_slots()

    def prepare_for(self, prompts: Sequence[Sequence[int]],
                    max_new_tokens: int | Sequence[int]) -> None:
        """:meth:`prepare` for decoding ``prompts`` with these budgets (checked as
        :meth:`generate` checks them), so that a timed :meth:`generate` captures nothing."""
        self._prepare_requests(make_requests(self.plan, self.target, self.default_seed,
                                             prompts, max_new_tokens, None, None))

    def _prepare_requests(self, reqs: list[_Request]) -> None:
        k1 = self.plan.num_draft_tokens + 1
        self.prepare(len(reqs), max(len(r.prompt) + r.max_new for r in reqs) + k1,
                     max(len(r.prompt) for r in reqs))

    def _drop_graphs(self) -> None:
        """Forget every captured round and admission and their memory pool (a pool whose graphs
        are all gone cannot take a new capture)."""
        self.graphs.clear()
        self.verify_graphs.clear()
        self.admissions.clear()
        self._graph_pool = None

    # ---- request lifecycle --------------------------------------------------------------

    def _key(self, seeds: list[int], offsets: torch.Tensor) -> SamplingKey | None:
        if self.plan.greedy:
            return None
        return SamplingKey(seeds=torch.tensor(seeds, dtype=_I64, device=self.device),
                           offsets=offsets.to(self.device, _I64))

    def _admits_rows(self, width: int) -> bool:
        """Whether a prompt padded to ``width`` is admitted by :meth:`admit_core` (one rank,
        a ladder width that fits the prepared cache); otherwise by the batched prefill."""
        return (self.plan.tp_size == 1 and width in PREFILL_WIDTHS
                and width <= self._adm_ids.shape[1])

    def _timed_admission(self, reqs: list[_Request],
                         group: bool) -> tuple[list[_Request], float]:
        """:meth:`_admit_all` ``reqs``; returns what it returns and the seconds of the admission
        that a round in flight is not charged. On a GPU that is device time, between events
        recorded before and after it: the admission's read also waits for the rounds queued
        ahead of it, and their remaining time is theirs (its wall time would hand it to the
        admission and undercount the round). Elsewhere the work is synchronous: its wall time
        by :attr:`clock`."""
        if self.device.type != "cuda":
            t0 = self.clock()
            started = self._admit_all(reqs, group=group)
            return started, self.clock() - t0
        begin, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        begin.record()
        started = self._admit_all(reqs, group=group)
        end.record()
        end.synchronize()
        return started, begin.elapsed_time(end) / 1e3

    def _admit_all(self, reqs: list[_Request], group: bool = False) -> list[_Request]:
        """Admit ``reqs`` through :meth:`admit_core`: one prompt a forward (replayed when
        captured), or with ``group`` (a call's first admissions, every slot free) the prompts of
        one prefill width together, up to :data:`GROUP_ADMIT_POSITIONS` padded positions a
        forward; the rest (long prompts, several ranks) through the batched prefill."""
        batched: list[_Request] = []
        by_width: dict[int, list[_Request]] = {}
        for r in reqs:
            width = prefill_width(len(r.prompt), self.round.length)
            if not self._admits_rows(width):
                batched.append(r)
            elif group:
                by_width.setdefault(width, []).append(r)
            else:
                self._admit_rows([r], width)
        for width, same in by_width.items():
            step = max(1, GROUP_ADMIT_POSITIONS // width)
            for i in range(0, len(same), step):
                self._admit_rows(same[i : i + step], width)
        taken = {id(r) for r in batched}
        return [r for r in reqs if id(r) not in taken] + (self._admit(batched) if batched else [])

    def _admit_rows(self, reqs: list[_Request], width: int) -> None:
        """Admit ``reqs`` (prompts of at most ``width`` tokens) in one :meth:`admit_core`, read
        back once; one prompt replays its captured admission where there is one."""
        t0 = time.perf_counter()
        g = len(reqs)
        for i, r in enumerate(reqs):
            r.slot = self.slots.assign(r.rid)
            r.t_admit = t0
            self._host_ids[i, : len(r.prompt)] = torch.tensor(r.prompt, dtype=_I64)
            self._host_args[i] = torch.tensor([r.slot, len(r.prompt), r.seed])
        self._adm_ids[:g, :width].copy_(self._host_ids[:g, :width], non_blocking=True)
        self._adm_args[:g].copy_(self._host_args[:g], non_blocking=True)
        graph = self.admissions.get(width) if self.plan.cuda_graphs and g == 1 else None
        if graph is not None:
            graph.replay()
        else:
            self.admit_core(width, g)
        self._host_adm[:g].copy_(self._adm_result[:g])  # the admission's one read
        for r, (tok, nan, *bits) in zip(reqs, self._host_adm[:g].tolist(), strict=True):
            self._start(r, tok, bool(nan),
                        tuple(_float_pairs(bits)[0]) if self.plan.record_margins else (), t0)

    def admit_core(self, width: int, rows: int = 1) -> None:
        """Admit ``rows`` prompts, reading and writing only device state: prompt ``i`` is
        ``_adm_ids[i, :width]`` (then padding) at ``_adm_args[i] = [slot, length, seed]``.

        Prefills the slots' target caches (logits of each last prompt token only), selects
        the first tokens, stores the drafter context of positions ``0 .. length - 2`` and loads
        the slots' round state; writes ``[first, nan, winning logit, margin]`` to
        ``_adm_result[i]``. No host reads: a CUDA graph captures it per prefill width.
        """
        with values_trusted():
            self._admission(width, rows)

    def _admission(self, width: int, rows: int) -> None:
        plan, args = self.plan, self._adm_args[:rows]
        slot, length, seed = args[:, 0], args[:, 1], args[:, 2]
        last = self._adm_rows[:rows] * width + length - 1  # each prompt's last token's row
        out = self.target.forward_rows(self._adm_ids[:rows, :width], torch.zeros_like(slot),
                                       width, slots=slot, logit_rows=last)
        key = None if plan.greedy else SamplingKey(seed, length)
        first = self.selector.select(out.logits, key, TARGET_STREAM, self.collectives)
        features = None
        if plan.drafting:
            positions = torch.arange(width - 1, dtype=_I64, device=self.device)
            context = out.features.view(rows, width, -1)[:, : width - 1]
            entries = self.drafter.project_context(context.reshape(rows * (width - 1), -1),
                                                   positions.repeat(rows))
            self.pager.store_prompt(slot, entries, length - 1)
            features = out.features.index_select(0, last)
        self.buffers.load_slots(slot, first_tokens=first, positions=length, seeds=seed,
                                features=features)
        result = self._adm_result[:rows]
        result[:, 0] = first
        nan, top2 = self.round.summary(out.logits.logits)
        result[:, 1] = nan
        if top2 is not None:
            result[:, 2:] = top2.view(torch.int32).to(_I64)

    def _start(self, r: _Request, token: int, nan: bool, margin: tuple, t0: float) -> None:
        """Commit an admitted request's first token (or its NaN failure)."""
        r.start = len(r.prompt)
        if nan:
            r.fail_on_nan()
        elif r.emit([token]) and margin:
            r.margins.append(tuple(margin))
        r.prefill_s = time.perf_counter() - t0
        if r.finish:
            self._finish(r)

    def _admit(self, reqs: list[_Request]) -> list[_Request]:
        """Prefill new requests together, select their first token, store their drafter context
        (positions ``0 .. P-2``) and load their slots' round state."""
        t0 = time.perf_counter()
        for r in reqs:
            r.slot = self.slots.assign(r.rid)
            r.t_admit = t0
        out = self.target.prefill([r.slot for r in reqs],
                                  [torch.tensor(r.prompt, dtype=_I64) for r in reqs])
        lengths = torch.tensor([len(r.prompt) for r in reqs])
        ends = (lengths.cumsum(0) - 1).to(out.logits.logits.device)
        last = out.logits.logits[ends]
        key = self._key([r.seed for r in reqs], lengths)
        first = self.selector.select(type(out.logits)(last, out.logits.vocab_start,
                                                      out.logits.vocab_size),
                                     key, TARGET_STREAM, self.collectives)
        if self.plan.drafting:
            # positions 0..P-2 now; position P-1 is stored by the first round's placement,
            # exactly like a verify row with n = 1, so fresh and running requests share a round
            starts = [int(e) - len(r.prompt) + 1 for r, e in zip(reqs, ends.tolist(), strict=True)]
            rows = torch.cat([torch.arange(s0, s0 + len(r.prompt) - 1)
                              for r, s0 in zip(reqs, starts, strict=True)]).to(out.features.device)
            positions = torch.cat([torch.arange(len(r.prompt) - 1) for r in reqs]).to(self.device)
            entries = (self.drafter.project_context(out.features[rows], positions)
                       if rows.numel() else None)
            row0 = 0
            for r in reqs:
                p = len(r.prompt)
                if p > 1 and entries is not None:
                    self.pager.store_prefill(r.slot, entries[row0 : row0 + p - 1], start=0)
                row0 += p - 1
        slot_ids = torch.tensor([r.slot for r in reqs], dtype=_I64, device=self.device)
        self.buffers.load_slots(
            slot_ids, first_tokens=first, positions=lengths.to(self.device),
            seeds=torch.tensor([r.seed for r in reqs], dtype=_I64, device=self.device),
            features=out.features[ends] if self.plan.drafting else None)
        nan, top2 = self.round.summary(last)
        margins = top2.tolist() if top2 is not None else [()] * len(reqs)
        for r, (tok, bad), margin in zip(reqs, torch.stack((first, nan), 1).tolist(), margins,
                                         strict=True):
            self._start(r, tok, bool(bad), tuple(margin), t0)
        return reqs

    def _abandon(self, reqs: list[_Request]) -> None:
        """Release the slots of every admitted request that did not finish."""
        held = [r for r in reqs if r.slot >= 0 and not r.finish]
        for r in held:
            with contextlib.suppress(Exception):
                self._release(r)

    def _finish(self, r: _Request) -> None:
        self._release(r)
        r.decode_s = time.perf_counter() - r.t_admit - r.prefill_s

    def _release(self, r: _Request) -> None:
        self.target.release([r.slot])
        self.slots.release(r.rid)
        self.buffers.batch_to_slot[r.slot].fill_(self.buffers.dummy_slot)  # a kernel, no copy

    # ---- one round ----------------------------------------------------------------------

    def _scheduled(self, g: int) -> bool:
        """Whether a round over ``g`` rows runs the confidence schedule's two phases."""
        return self.round.schedule is not None and self.round.schedule.covers(g)

    def round_core(self, g: int, width: int) -> None:
        """One round over rows ``0 .. g-1`` at context ``width``, device state only
        (:meth:`Round.run <draftsmith.runtime.round.Round.run>`): what a CUDA graph captures
        per ``(rows, width)`` bucket."""
        self.round.run(g, width)

    def draft_phase_core(self, g: int, width: int) -> None:
        """A scheduled round's first phase over rows ``0 .. g-1``: place, draft, score the
        drafts' confidence and schedule; writes ``verify_tokens``, ``verify_len``,
        ``verify_rows`` and the token count ``T`` (``buffers.verify_count``, the host reads
        it). No host reads: captured per ``(rows, width)``."""
        assert self.round.schedule is not None
        with values_trusted():
            self.round.schedule.draft(g, width, self.buffers.view(g))

    def verify_phase_core(self, g: int, width: int, t: int) -> None:
        """A scheduled round's second phase: the target computes ``t`` tokens of
        ``verify_rows``, then accept and commit. No host reads: captured per
        ``(rows, width, t)``."""
        assert self.round.schedule is not None
        with values_trusted():
            self.round.schedule.verify(g, width, self.buffers.view(g), t)

    def step(self, active: list[_Request]) -> RoundRecord:
        """One round over the ``active`` requests (all in the generation phase).

        Runs (or replays) the round for the smallest captured bucket that holds their slots and
        contexts, then reads the device once: every row's count and accepted tokens, one copy.
        Returns its record: rows bucket, requests, tokens committed and its wall time by
        :attr:`clock`, from the call to the last request committed (the read waits for the
        device, so the time is the round's, host work included).
        """
        launched = self.launch(active, wait=True)
        return self.complete(launched, launched.start)

    def launch(self, active: list[_Request], ahead: int = 0, wait: bool = False) -> _Launched:
        """Run (or replay) the round over ``active`` and queue the copy of its result rows into
        pinned host memory; returns without waiting for the device unless the round is
        scheduled (its token count is read between its phases) or ``wait`` (the copy then
        waits for the round: :meth:`step`).

        ``ahead``: rounds in flight before this one, which the host has not committed: each can
        advance a row by ``K + 1`` positions, so the context width allows for that.
        """
        start = self.clock()
        g, width = self.bucket(active, ahead)
        if self.plan.cuda_graphs:
            graph = self.graphs.get((g, width))
            if self.target.cache_version != self._graph_cache_version:
                raise PlanError("the target's cache was replaced after the rounds were captured "
                                "(another decoder reserved more); call prepare() again")
            if graph is None:
                raise PlanError(f"no round was captured for {g} rows and context width {width}; "
                                "call prepare() with the largest batch and length first")
            graph.replay()
            if self._scheduled(g):  # the drafting phase chose the token count: read it, verify
                self._host_count.copy_(self.buffers.verify_count)
                self.verify_graphs[(g, width, int(self._host_count[0]))].replay()
        else:
            self.round_core(g, width)
        host = self._host_results[self._next_host]
        self._next_host ^= 1
        host[:g].copy_(self.buffers.result[:g], non_blocking=self._pinned and not wait)
        done = None
        if self.device.type == "cuda" and not wait:
            done = torch.cuda.Event()
            done.record()
        return _Launched(list(active), g, host, done, start, self._scheduled(g))

    def complete(self, launched: _Launched, since: float) -> RoundRecord:
        """Wait for a launched round's result and commit it to its requests that are still
        running (one that ended in an earlier round has this round's tokens thrown away).
        Returns its record, timed by :attr:`clock` from ``since`` (its launch, or the commit of
        the round before it when it was launched ahead)."""
        if launched.done is not None:
            launched.done.synchronize()
        g = launched.g
        rows = launched.host[:g].tolist()
        running = [r for r in launched.active if not r.finish]
        tokens = self._commit(rows, running)
        return RoundRecord(rows=g, live=len(running), tokens=tokens,
                           seconds=self.clock() - since, scheduled=launched.scheduled)

    def _may_run_ahead(self, active: list[_Request], inflight: list[_Launched]) -> bool:
        """Whether a round may be launched behind the one in flight: neither is scheduled (a
        scheduled round reads its token count between phases) and some request surely outlives
        the round in flight (its budget has room for more than one round's tokens)."""
        if len(inflight) != 1 or inflight[0].scheduled:
            return False
        if self._scheduled(self.bucket(active, 1)[0]):
            return False
        k1 = self.plan.num_draft_tokens + 1
        return any(r.max_new - len(r.tokens) > k1 for r in active)

    def bucket(self, active: list[_Request], ahead: int = 0) -> tuple[int, int]:
        """``(rows, context width)`` of the round that serves ``active``, launched behind
        ``ahead`` rounds the host has not committed (the widest width at most: a round clamps
        its positions into the prepared cache, so that width holds any row)."""
        k = self.plan.num_draft_tokens
        need = max(r.start for r in active) + (k + 1) * (ahead + 1)
        return (_bucket(max(r.slot for r in active) + 1, self._rows),
                _bucket(min(need, self._widths[-1]) if ahead else need, self._widths))

    def emit_round(self, active: list[_Request], g: int) -> int:
        """Read the round's counts and tokens (the one device-to-host read) and commit them to
        each request under its budget and stop rules; returns the tokens committed."""
        return self._commit(self._read_result(g), active)

    def _commit(self, rows: list[list[int]], active: list[_Request]) -> int:
        """Commit a round's result ``rows`` (by slot) to ``active``; returns tokens kept."""
        k3 = self.plan.num_draft_tokens + 3
        committed = 0
        for r in active:
            n, nan, *accepted = rows[r.slot][:k3]
            if nan:
                r.fail_on_nan()
            else:
                kept = r.emit(accepted[:n])
                committed += kept
                r.lengths.append(kept)
                if self.plan.record_margins:
                    r.margins += _float_pairs(rows[r.slot][k3 : k3 + 2 * kept])
                r.start += n
            if r.finish:
                self._finish(r)
        return committed

    def _read_result(self, g: int) -> list[list[int]]:
        """``[n_b, nan_b, accepted_b..., margins...]`` of rows ``0 .. g-1``: the round's one
        device-to-host read."""
        host = self._host_results[0][:g]
        host.copy_(self.buffers.result[:g])  # into pinned memory; waits for the round
        return host.tolist()


__all__ = ["GROUP_ADMIT_POSITIONS", "YOUNG_GC_EVERY", "GenerationResult", "SpecDecoder", "row_buckets", "width_buckets"]
