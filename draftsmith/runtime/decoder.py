"""The batched, lossless speculative decoding loop: :class:`SpecDecoder`.

Owns the request lifecycle (admission, prefill, per-step draft / verify / accept / emit, stop and
budget rules) over the components that ``bind`` built from the plan: the paging component, the
draft chain (Markov or plain selection), acceptance, and the bind-time buffers. One step::

    prepare slots -> place block + store new context (paging) -> block forward -> head logits
    -> draft chain -> target verify -> accept -> commit target cache -> emit

A failed step rolls ``ctx_len`` back. With ``plan.cuda_graphs`` the drafting part (block forward,
head, chain and selection) is captured per batch size and replayed. Hot path: must not import
pluggy, the registry or bind.
"""

from __future__ import annotations

import contextlib
import operator
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from draftsmith.contract import (
    Collectives,
    ConfigError,
    DraftBlockInputs,
    DraftBlockPlacement,
    Drafter,
    SamplingKey,
    TargetModel,
    TokenSelector,
)
from draftsmith.runtime.acceptance import TARGET_STREAM, Acceptance
from draftsmith.runtime.buffers import DecoderBuffers
from draftsmith.runtime.markov import DraftChain
from draftsmith.runtime.paging import ContextPager, SlotManager
from draftsmith.runtime.plan import DraftPlan

_I64 = torch.int64


@dataclass(frozen=True)
class GenerationResult:
    """One request's output.

    ``tokens``: generated ids (the first comes from the prefill); ``accepted_lengths``: per
    verify round, the committed tokens including the bonus, cut at the first stop token and at the
    budget (section 9, item 19); ``finish_reason``: ``stop`` or ``length``.
    """

    tokens: tuple[int, ...]
    accepted_lengths: tuple[int, ...]
    finish_reason: str
    prefill_s: float
    decode_s: float

    @property
    def num_rounds(self) -> int:
        """Verify rounds run for this request."""
        return len(self.accepted_lengths)

    @property
    def mean_accepted_length(self) -> float:
        """``tau``: mean committed tokens per round (bonus included)."""
        return sum(self.accepted_lengths) / max(len(self.accepted_lengths), 1)


@dataclass
class _Request:
    rid: int
    prompt: list[int]
    max_new: int
    stops: frozenset[int]
    seed: int
    slot: int = -1
    start: int = 0
    """Position of the anchor (the last committed token, not yet in the target cache)."""
    tokens: list[int] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    pending_accepted: torch.Tensor | None = None
    """``[K+1] int64`` on the device: the last round's accepted row (read by the next placement)."""
    pending_count: torch.Tensor | None = None
    """``[] int64`` on the device: how many tokens that round committed (bonus included)."""
    pending_bonus: int = 0
    """The last committed token (a host copy of the bonus the next placement reads)."""
    pending_features: torch.Tensor | None = None
    finish: str = ""
    t_admit: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0

    def emit(self, committed: Sequence[int]) -> int:
        """Append committed tokens under the budget and stop rules; return how many were kept."""
        room = self.max_new - len(self.tokens)
        kept = list(committed[:room])
        for i, tok in enumerate(kept):
            if tok in self.stops:
                kept = kept[: i + 1]
                self.finish = "stop"
                break
        self.tokens.extend(kept)
        if not self.finish and len(self.tokens) >= self.max_new:
            self.finish = "length"
        return len(kept)


def _token_ids(what: str, ids: Iterable[object], vocab_size: int) -> list[int]:
    """``ids`` as a list of ints, each in ``0..vocab_size-1``; :class:`ConfigError` naming
    ``what`` otherwise (an out-of-range id would index the embedding out of bounds)."""
    try:
        out = [operator.index(t) for t in ids]
    except TypeError:
        raise ConfigError(f"{what} must be integer token ids") from None
    bad = [t for t in out if not 0 <= t < vocab_size]
    if bad:
        raise ConfigError(f"{what} hold {bad[:4]}, outside the vocabulary 0..{vocab_size - 1}")
    return out


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
        self.target_embedding = target.input_embedding()
        self.head = target.output_head()
        self._graphs: dict[int, DraftGraph] = {}
        self._ctx_snapshot = torch.empty_like(buffers.ctx_len)
        self._count_one = torch.ones((), dtype=_I64, device=self.device)

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
        config's seed plus the request index); ``progress``: called after every step with the
        tokens generated so far, one list per prompt.
        """
        reqs = self._requests(prompts, max_new_tokens, stop_token_ids, seeds)
        waiting = list(reqs)
        active: list[_Request] = []
        try:
            while waiting or active:
                if waiting and self.slots.num_free:
                    admitted = waiting[: self.slots.num_free]
                    waiting = waiting[len(admitted):]
                    active.extend(r for r in self._admit(admitted) if not r.finish)
                if active:
                    self.step(active)
                    active = [r for r in active if not r.finish]
                    if progress is not None:
                        progress([list(r.tokens) for r in reqs])
        except BaseException:
            # an error (or an interrupt) must not leave slots held: the decoder stays usable
            self._abandon(reqs)
            raise
        return [
            GenerationResult(tuple(r.tokens), tuple(r.lengths), r.finish, r.prefill_s, r.decode_s)
            for r in reqs
        ]

    # ---- request lifecycle --------------------------------------------------------------

    def _requests(self, prompts, max_new_tokens, stop_token_ids, seeds) -> list[_Request]:
        n = len(prompts)
        budgets = [max_new_tokens] * n if isinstance(max_new_tokens, int) else list(max_new_tokens)
        if stop_token_ids is None:
            stops: list[frozenset[int]] = [frozenset()] * n
        elif all(isinstance(x, int) for x in stop_token_ids):
            stops = [frozenset(stop_token_ids)] * n  # type: ignore[arg-type]
        else:
            stops = [frozenset(s) for s in stop_token_ids]  # type: ignore[arg-type]
        seed_list = list(seeds) if seeds is not None else [self.default_seed + i for i in range(n)]
        if not len(budgets) == len(stops) == len(seed_list) == n:
            raise ConfigError("max_new_tokens, stop_token_ids and seeds need one entry per prompt")
        vocab = self.plan.vocab_size
        stops = [frozenset(_token_ids(f"stop token ids of prompt {i}", s, vocab))
                 for i, s in enumerate(stops)]
        for i, seed in enumerate(seed_list):
            try:
                seed_list[i] = seed = operator.index(seed)
            except TypeError:
                seed = None
            if seed is None or not 0 <= seed < 2**63:
                raise ConfigError(
                    f"the seed of prompt {i} must be an int in 0..2**63-1, got {seed_list[i]!r}"
                    + ("" if seeds is not None else " (the default is selection.seed plus the "
                       "prompt index: lower selection.seed)"))
        # checked here, before admission: the target itself would refuse mid-generation
        target_limit = getattr(self.target, "max_position_embeddings", None)
        out = []
        for i, prompt in enumerate(prompts):
            if not len(prompt):
                raise ConfigError(f"prompt {i} is empty")
            prompt = _token_ids(f"prompt {i}", prompt, vocab)
            if budgets[i] < 1:
                raise ConfigError(f"max_new_tokens of prompt {i} must be >= 1")
            need = len(prompt) + budgets[i] + self.plan.num_draft_tokens + 1
            if target_limit is not None and need > target_limit:
                raise ConfigError(
                    f"prompt {i} ({len(prompt)} tokens) plus {budgets[i]} new tokens and a verify "
                    f"block of {self.plan.num_draft_tokens + 1} needs {need} positions, more than "
                    f"the target's max_position_embeddings {target_limit}; lower max_new_tokens "
                    "or shorten it"
                )
            if need > self.plan.max_ctx:
                raise ConfigError(
                    f"prompt {i} ({len(prompt)} tokens) plus {budgets[i]} new tokens and a verify "
                    f"block of {self.plan.num_draft_tokens + 1} needs {need} positions, more than "
                    f"max_ctx {self.plan.max_ctx}; raise runtime.max_context or shorten it"
                )
            out.append(_Request(i, prompt, budgets[i], stops[i], seed_list[i]))
        return out

    def _key(self, seeds: list[int], offsets: torch.Tensor) -> SamplingKey | None:
        if self.plan.greedy:
            return None
        return SamplingKey(seeds=torch.tensor(seeds, dtype=_I64, device=self.device),
                           offsets=offsets.to(self.device, _I64))

    def _admit(self, reqs: list[_Request]) -> list[_Request]:
        """Prefill new requests, sample their first token, store their context (4.7)."""
        t0 = time.perf_counter()
        for r in reqs:
            r.slot = self.slots.assign(r.rid)
            r.t_admit = t0
        out = self.target.prefill([r.slot for r in reqs],
                                  [torch.tensor(r.prompt, dtype=_I64) for r in reqs])
        ends = torch.tensor([len(r.prompt) for r in reqs]).cumsum(0) - 1
        last = out.logits.logits[ends.to(out.logits.logits.device)]
        key = self._key([r.seed for r in reqs], torch.tensor([len(r.prompt) for r in reqs]))
        first = self.selector.select(type(out.logits)(last, out.logits.vocab_start,
                                                      out.logits.vocab_size),
                                     key, TARGET_STREAM, self.collectives).tolist()
        k1 = self.plan.num_draft_tokens + 1
        starts = [int(e) - len(r.prompt) + 1 for r, e in zip(reqs, ends, strict=True)]
        if self.plan.drafting:
            # positions 0..P-2 now; position P-1 is stored by the first step's placement, exactly
            # like a verify row with n = 1, so fresh and running requests share one step.
            rows = torch.cat([torch.arange(s0, s0 + len(r.prompt) - 1)
                              for r, s0 in zip(reqs, starts, strict=True)]).to(out.features.device)
            positions = torch.cat([torch.arange(len(r.prompt) - 1) for r in reqs]).to(self.device)
            entries = (self.drafter.project_context(out.features[rows], positions)
                       if rows.numel() else None)
        row0 = 0
        for r, tok, s0 in zip(reqs, first, starts, strict=True):
            p = len(r.prompt)
            feats = out.features[s0 : s0 + p]
            r.start = p
            if self.plan.drafting:
                if p > 1 and entries is not None:
                    self.pager.store_prefill(r.slot, entries[row0 : row0 + p - 1], start=0)
                row0 += p - 1
                pend = torch.zeros(k1, feats.shape[1], dtype=feats.dtype, device=feats.device)
                pend[0] = feats[p - 1]
                r.pending_features = pend
            acc = torch.zeros(k1, dtype=_I64, device=self.device)
            acc[0] = tok
            r.pending_accepted, r.pending_count = acc, self._count_one
            r.pending_bonus = tok
            r.emit([tok])
            r.prefill_s = time.perf_counter() - t0
            if r.finish:
                self._finish(r)
        return reqs

    def _abandon(self, reqs: list[_Request]) -> None:
        """Release the slots of every admitted request that did not finish."""
        held = [r for r in reqs if r.slot >= 0 and not r.finish]
        for r in held:
            with contextlib.suppress(Exception):
                self.slots.release(r.rid)
        if held:
            with contextlib.suppress(Exception):
                self.target.release([r.slot for r in held])

    def _finish(self, r: _Request) -> None:
        self.target.release([r.slot])
        self.slots.release(r.rid)
        r.decode_s = time.perf_counter() - r.t_admit - r.prefill_s

    # ---- one step -----------------------------------------------------------------------

    def step(self, active: list[_Request]) -> None:
        """One speculative step over the ``active`` requests (all in the generation phase).

        The host reads the device once per step (the accepted counts and tokens, one copy);
        everything the next step needs on the device stays there.
        """
        g, k, plan = len(active), self.plan.num_draft_tokens, self.plan
        greedy = self.plan.greedy
        view = self.buffers.view(g)
        self.slots.prepare([r.rid for r in active], view.batch_to_slot)
        slots = [r.slot for r in active]
        seeds = [r.seed for r in active]
        snapshot = self._ctx_snapshot.copy_(self.pager.ctx_len)
        try:
            if plan.drafting:
                torch.stack([r.pending_accepted for r in active], out=view.accepted)
                torch.stack([r.pending_count for r in active], out=view.num_accepted)
                placement = self.pager.place(view.batch_to_slot, view.accepted, view.num_accepted)
                features = (active[0].pending_features if g == 1
                            else torch.cat([r.pending_features for r in active]))
                entries = self.drafter.project_context(features, placement.ctx_positions.reshape(-1))
                self.pager.store(placement, entries)
                draft_key = None if greedy else self._key(seeds, placement.new_ctx_len + 1)
                drafts, draft_probs = self._draft(placement, draft_key, view.batch_to_slot)
                # the placement already holds each bonus (accepted[n - 1]) on the device
                verify_tokens = torch.cat([placement.bonus[:, None], drafts], dim=1)
            else:
                drafts = torch.empty(g, 0, dtype=_I64, device=self.device)
                draft_probs = None
                verify_tokens = torch.tensor([[r.pending_bonus] for r in active], dtype=_I64,
                                             device=self.device)
            out = self.target.verify(slots, verify_tokens)
            accept_key = None if greedy else self._key(
                seeds, torch.tensor([r.start for r in active], dtype=_I64))
            accepted, n = self.acceptance.accept(out.logits, drafts, accept_key,
                                                 draft_probs=draft_probs)
        except BaseException:
            # leave the step retryable: drafter lengths as before, target cropped to the anchors
            self.pager.ctx_len.copy_(snapshot)
            with contextlib.suppress(Exception):
                self.target.commit(slots, [r.start for r in active])
            raise
        # one device-to-host copy per step: row b is [n_b, accepted_b...]
        rows = torch.cat([n[:, None], accepted], dim=1).tolist()
        # the target cache holds positions 0 .. start + K; keep the anchor and accepted drafts
        self.target.commit(slots, [r.start + row[0] for r, row in zip(active, rows, strict=True)])
        feats = out.features.view(g, k + 1, -1)
        for b, r in enumerate(active):
            nb = rows[b][0]
            committed = rows[b][1 : nb + 1]
            r.lengths.append(r.emit(committed))
            if r.finish:
                self._finish(r)
                continue
            r.pending_accepted, r.pending_count = accepted[b], n[b]
            r.pending_bonus = committed[-1]
            r.pending_features = feats[b]
            r.start += nb

    def _draft(
        self, placement: DraftBlockPlacement, key: SamplingKey | None, batch_to_slot: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Block forward, head, chain and selection: drafts ``[G, K]`` and ``q`` ``[G, K, V]``."""
        g = placement.num_requests
        if self.plan.cuda_graphs:
            graph = self._graphs.get(g)
            if graph is None:
                graph = self._graphs[g] = DraftGraph(self, placement, key)
            drafts, probs = graph.replay(placement, key)
        else:
            drafts, probs = self.draft_core(placement, key)
        if probs is None:
            return drafts, None
        table = self.buffers.draft_probs
        assert table is not None
        table.index_copy_(0, batch_to_slot, probs)  # padding rows land on dummy_slot_row
        return drafts, table[batch_to_slot]

    def draft_core(
        self, placement: DraftBlockPlacement, key: SamplingKey | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The capturable drafting computation (no host syncs of its own)."""
        plan = self.plan
        g, k, first = placement.num_requests, plan.num_draft_tokens, plan.first_draft_slot
        ids = self.buffers.block_ids[:g]  # persistent: graph replays rewrite it in place
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
        return drafts, probs


def copy_grouped(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """``dst[i].copy_(src[i])`` for every ``i``, as one multi-tensor copy per dtype.

    A step's placement is a dozen small int64 tensors and one bool mask; one ``_foreach_copy_``
    per dtype launches one multi-tensor kernel where a ``copy_`` each would launch a dozen.
    """
    groups: dict[torch.dtype, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    for d, s in zip(dst, src, strict=True):
        to, frm = groups.setdefault(d.dtype, ([], []))
        to.append(d)
        frm.append(s)
    for to, frm in groups.values():
        torch._foreach_copy_(to, frm)


class DraftGraph:
    """The drafting step of one batch size captured in a CUDA graph (spec section 7).

    Static inputs are private copies of the first placement and key, with a static context width
    (``max_ctx``) so that no forward reads a length back to the host; each later step copies its
    placement and key into them and replays. Tensors created during capture stay in the graph's
    pool; only the static outputs are read, and they are cloned before they leave.
    """

    def __init__(self, decoder: SpecDecoder, placement: DraftBlockPlacement,
                 key: SamplingKey | None, warmup: int = 2) -> None:
        self.decoder = decoder
        self.placement = self.static_placement(placement, decoder.plan.max_ctx)
        self.key = (SamplingKey(seeds=key.seeds.clone(), offsets=key.offsets.clone())
                    if key is not None else None)
        self._tensor_fields = tuple(name for name in placement.__dataclass_fields__
                                    if isinstance(getattr(placement, name), torch.Tensor))
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):  # allocator and lazy kernel compilation, outside capture
                decoder.draft_core(self.placement, self.key)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.drafts, self.probs = decoder.draft_core(self.placement, self.key)

    @staticmethod
    def static_placement(placement: DraftBlockPlacement, context_width: int) -> DraftBlockPlacement:
        """A private copy of ``placement`` whose attention reads ``context_width`` columns."""
        values = {name: (v.clone() if isinstance(v := getattr(placement, name), torch.Tensor)
                         else v) for name in placement.__dataclass_fields__}
        values["context_width"] = context_width
        return DraftBlockPlacement(**values)

    def load(self, placement: DraftBlockPlacement, key: SamplingKey | None) -> None:
        """Copy a step's placement and key into the static inputs."""
        static = self.placement
        dst = [getattr(static, name) for name in self._tensor_fields]
        src = [getattr(placement, name) for name in self._tensor_fields]
        if key is not None and self.key is not None:
            dst += (self.key.seeds, self.key.offsets)
            src += (key.seeds, key.offsets)
        copy_grouped(dst, src)

    def replay(self, placement: DraftBlockPlacement, key: SamplingKey | None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Load and replay; returns clones of the static outputs."""
        self.load(placement, key)
        self.graph.replay()
        return self.drafts.clone(), (self.probs.clone() if self.probs is not None else None)


__all__ = ["DraftGraph", "GenerationResult", "SpecDecoder"]
