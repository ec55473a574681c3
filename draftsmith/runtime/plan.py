"""The frozen, hashable :class:`DraftPlan` that ``bind`` produces, and its text form.

Every "is this path eligible?" question is answered once, at bind time, and recorded here as a
:class:`Decision` ``(name, value, reason)``. The decoding step reads the plan and never probes.
This module also holds :func:`make_plan` (the pure decision function, no weights, no plugins:
it calls the rules of :mod:`draftsmith.runtime.plan_rules` in order) and :func:`format_plan`
(what ``draftsmith plan`` prints). It imports neither pluggy nor ``bind``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from draftsmith.contract import (
    BlockConvention,
    DrafterCapabilities,
    MarkovHeadKind,
    ParallelMapping,
    SelectorCapabilities,
    TargetInfo,
    TPFusion,
)
from draftsmith.runtime import plan_rules as rules
from draftsmith.runtime.buffers import pages_per_slot
from draftsmith.runtime.costs import AcceptanceEstimate, CostProfile, DraftTokensChoice
from draftsmith.runtime.costs import VerifyCosts as VerifyCosts
from draftsmith.runtime.head_layout import head_layout
from draftsmith.runtime.verify_plan import decide_verify_schedule, plan_confidence

_FROZEN = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

DecisionValue = str | int | float | bool | tuple[str, ...]


class Decision(BaseModel):
    """One recorded decision of the plan."""

    model_config = _FROZEN

    name: str
    """Stable identifier (``acceptance``, ``markov``, ``block_width``...)."""
    value: DecisionValue
    """What was chosen."""
    reason: str
    """Why, in words a user can act on."""


class DraftPlan(BaseModel):
    """Everything the decoding loop needs to know, decided once at bind.

    Frozen (assigning raises) and hashable, so graph captures and caches can key on it.
    """

    model_config = _FROZEN

    family: str
    """Drafter family name."""
    num_draft_tokens: int = Field(ge=0)
    """``K``: drafts per request per step (0: drafting is off)."""
    block_width: int = Field(ge=0)
    """``W``: ``K + 1`` (bonus-silent) or ``K`` (shift)."""
    block_convention: BlockConvention
    """How block slots map to drafts."""
    first_draft_slot: int = Field(ge=0)
    """Block slot that predicts draft 0."""
    vocab_size: int = Field(ge=1)
    """``V``."""
    shard_width: int = Field(ge=1)
    """``S = V / TP``: logit columns held by this rank."""
    vocab_start: int = Field(ge=0)
    """First global id of this rank's shard."""
    tp_size: int = Field(ge=1)
    """``TP``."""
    tp_rank: int = Field(ge=0)
    """``rho``."""
    greedy: bool
    """True when token selection is deterministic argmax."""
    temperature: float = Field(ge=0.0)
    """Sampling temperature (0 for greedy)."""
    acceptance: Literal["strict", "rejection", "forced"]
    """Verification rule: strict, rejection or forced."""
    forced_base: Literal["strict", "rejection"]
    """Rule that runs under forced acceptance (counts are then overridden)."""
    force_accepted: float = Field(ge=0.0)
    """Forced mean accepted length (benchmarks; 0 off)."""
    vocab_parallel: bool
    """Select tokens from per-rank (value, index) pairs without gathering logits."""
    markov: Literal["none", "eager", "fused"]
    """Where the Markov chain runs."""
    markov_kind: MarkovHeadKind
    """Head kind the drafter declares; its ``markov_head()`` weights are checked against it."""
    paging: Literal["eager", "fused"]
    """Paging preparation and context store: eager references or fused kernels."""
    kernels: Literal["eager", "fused"]
    """Acceptance kernels dispatch."""
    round_pdl: bool = False
    """The round's drafting kernels (the built-in drafters' kernels inside
    :func:`~draftsmith.kernels.pdl_scope`, and the fused Markov chain) launch with
    programmatic dependent launch."""
    tp_fusions: frozenset[TPFusion]
    """Drafter TP fusions taken."""
    record_margins: bool
    """Record each committed token's winning target logit and top-2 margin."""
    cuda_graphs: bool
    """Capture each round (drafting, target verification, acceptance, commit) in CUDA graphs."""
    overlap: bool
    """Launch round ``t + 1`` before the host commits round ``t`` (``generate``)."""
    capture_layers: tuple[int, ...]
    """Target layers captured for the drafter (set on the target, sizing the feature buffer)."""
    confidence: Literal["none", "score-only", "scheduler"]
    """Confidence head use: none, scored only, or feeding the verify scheduler."""
    slot_capacity: int = Field(ge=1)
    """Requests decoded at once; slot ``slot_capacity`` is the dummy."""
    max_ctx: int = Field(ge=1)
    """Largest drafter context length."""
    page_size: int = Field(ge=1)
    """``P_sz``."""
    pages_per_slot: int = Field(ge=1)
    """``ceil((max_ctx + max(W, 1)) / P_sz)``: drafter context pages per slot (the buffers')."""
    device: str
    """Device the decoder runs on."""
    draft_tokens_mode: Literal["fixed", "auto"] = "fixed"
    """``fixed``: ``K`` is the config's integer; ``auto``: chosen from :attr:`cost_profile` and
    :attr:`acceptance_estimate` for :attr:`draft_tokens_rows` rows."""
    draft_tokens_rows: int = Field(default=0, ge=0)
    """Under ``auto``: the rows bucket :attr:`num_draft_tokens` was chosen for (0: fixed)."""
    cost_profile: CostProfile | None = None
    """Under ``auto``: the measured round times the choice read."""
    acceptance_estimate: AcceptanceEstimate | None = None
    """Under ``auto``: the per-position acceptance the choice read, and its source."""
    verify_schedule: Literal["all", "prefix", "top-budget", "width"] = "all"
    """``all`` drafts, or the prefixes the scheduler admits (``prefix``, ``top-budget``)."""
    verify_budget: int = Field(default=0, ge=0)
    """Under ``top-budget``: drafted positions admitted per live row and round."""
    verify_costs: VerifyCosts | None = None
    """Under a schedule: the ``sps`` table (frozen values) and where it came from."""
    sts_temperatures: tuple[float, ...] = ()
    """Under a schedule: the drafter's STS table, ``tau`` per draft position."""
    decisions: tuple[Decision, ...]
    """Every decision, in the order it was made."""

    def decision(self, name: str) -> Decision:
        """The decision called ``name``; :class:`KeyError` listing the names otherwise."""
        for d in self.decisions:
            if d.name == name:
                return d
        raise KeyError(f"no decision {name!r}; recorded: {', '.join(d.name for d in self.decisions)}")

    @property
    def dummy_slot(self) -> int:
        """The scratch slot index (never handed out)."""
        return self.slot_capacity

    @property
    def drafting(self) -> bool:
        """False when ``K == 0``."""
        return self.num_draft_tokens > 0


class PlanInputs(BaseModel):
    """The sub-configs :func:`make_plan` reads (never the root config)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_draft_tokens: int
    selector: SelectorCapabilities
    """What the built selection strategy declares (greedy, temperature, acceptance, filters,
    vocab-parallel path)."""
    mapping: ParallelMapping
    max_batch: int
    max_context: int
    page_size: int
    kernels: Literal["auto", "fused", "eager"]
    pdl: Literal["auto", "off"] = "auto"
    cuda_graphs: Literal["auto", "on", "off"] | bool
    force_accepted: float
    overlap: Literal["auto", "on", "off"] | bool = "auto"
    record_margins: Literal["auto", "on", "off"] | bool = "auto"
    allow_gather: bool = True
    device: str = "cpu"
    selection_route: tuple[str, str] | None = None
    """``(kind, reason)`` of the strategy's own route at this TP size (the built-ins'
    ``route``: ``pair_argmax``, ``gumbel_pairs``, ``topk_candidates``, ``gather``); ``None``:
    derived from :attr:`selector`."""
    target_layers: Literal["whole", "split"] = "whole"
    """Whether the target's decoder layers are split over the ranks (transformers' tensor-parallel
    plan, ``target.split_layers``) or whole on every rank."""
    head_shard: tuple[int, int] | None = None
    """``(vocab_start, S)`` of the LM head rows the target holds on this rank; ``None``: the even
    split (:func:`~draftsmith.runtime.head_layout.vocab_shard_range`) where ``V`` divides by
    ``TP``, else the whole head."""
    auto: AutoDraftTokens | None = None
    """The cost model's choice when the config says ``num_draft_tokens = "auto"`` and a target
    was profiled; ``None``: :attr:`num_draft_tokens` is the config's fixed ``K``."""
    auto_unmeasured: bool = False
    """The config says ``auto`` but no target was profiled (``draftsmith plan`` without
    ``--measure``): :attr:`num_draft_tokens` is then the largest ``K`` considered."""
    verify_schedule: Literal["all", "prefix", "top-budget", "width"] = "all"
    verify_budget: int | None = None
    verify_costs: VerifyCosts | None = None
    """The scheduler's ``sps`` table (``None``: not measured, e.g. ``draftsmith plan``)."""
    sts_temperatures: tuple[float, ...] | None = None
    """The drafter's STS table, read at bind (``None``: none, or not built)."""
    drafter_built: bool = True
    """False for a plan made from declared capabilities only (the STS table is unknown)."""


class AutoDraftTokens(BaseModel):
    """What the cost model decided at bind (:mod:`draftsmith.runtime.costs`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    profile: CostProfile
    """Measured round times."""
    acceptance: AcceptanceEstimate
    """The acceptance the choice read."""
    choices: tuple[DraftTokensChoice, ...]
    """``K`` per rows bucket."""
    rows: int
    """The rows bucket whose ``K`` this decoder runs."""


PlanInputs.model_rebuild()


def describe_selection(selector: SelectorCapabilities) -> str:
    """The selection in words, as ``generate``'s summary and the plan print it: greedy, or the
    temperature, the top-k and top-p filters (``off`` when a built-in filter is not set) and the
    acceptance rule of a sampling strategy."""
    if selector.greedy:
        return f"{selector.kind}: argmax, strict acceptance"
    words = [f"T = {selector.temperature}" if selector.temperature > 0 else "no temperature"]
    for name in ("top-k", "top-p"):
        words += [f for f in selector.filters if f.startswith(name)] or [f"{name} off"]
    words += [f for f in selector.filters if not f.startswith(("top-k", "top-p"))]
    return f"{selector.kind}: {', '.join(words)}, acceptance = {selector.acceptance}"


def make_plan(
    inputs: PlanInputs, caps: DrafterCapabilities, target: TargetInfo, *,
    fused_kernels_available: bool = True,
) -> DraftPlan:
    """Decide every path (:mod:`~draftsmith.runtime.plan_rules`, one function per concern, in
    the order the plan lists them); raise :class:`PlanError` for an impossible combination.
    Whether the drafter fits the target (vocabulary, widths, layers) is ``bind``'s check
    (:func:`draftsmith.runtime.bind.check_fit`), made before this is called."""
    k, sel, dp = inputs.num_draft_tokens, inputs.selector, inputs.mapping.attention_dp
    tp, rho = inputs.mapping.tp_size, inputs.mapping.tp_rank
    rules.check_block(caps, k)
    head = head_layout(target.vocab_size, tp, rho, inputs.head_shard)
    rules.check_head(caps, k, tp, head, target.vocab_size)
    decisions: list[Decision] = []

    def decide(name: str, value: DecisionValue, reason: str) -> DecisionValue:
        decisions.append(Decision(name=name, value=value, reason=reason))
        return value

    _decide_draft_tokens(inputs, k, decide)
    w = rules.decide_block_width(caps, k, decide)
    acceptance, base = rules.decide_acceptance(sel, inputs.force_accepted,
                                               describe_selection(sel), decide)
    rules.decide_target_split(tp, head, inputs.target_layers, decide)
    vp = rules.decide_vocab_parallel(tp, head, target.vocab_size, sel, dp, decide)
    route = rules.decide_route(tp, head, vp, inputs.selection_route, dp, sel.greedy, decide)
    rules.decide_gathers(tp, head, base, dp, route, inputs.allow_gather, decide)
    kern, kreason = rules.decide_kernels(inputs.kernels, inputs.device, fused_kernels_available,
                                         decide)
    markov = rules.decide_markov(caps, k, tp, head, fused=kern == "fused", greedy=sel.greedy,
                                 vocab_parallel=vp[0], route=route, kernels_reason=kreason,
                                 decide=decide)
    round_pdl = rules.decide_round_pdl(inputs.pdl, kern, inputs.device, k, decide)
    fusions = rules.decide_tp_fusions(caps, tp, decide)
    schedule, budget = decide_verify_schedule(
        inputs.verify_schedule, inputs.verify_budget, inputs.verify_costs,
        inputs.sts_temperatures, inputs.drafter_built, caps, k, tp, decide,
        auto_chose_zero=k == 0 and inputs.auto is not None)
    scheduled = schedule != "all"
    graphs = rules.decide_cuda_graphs(inputs.cuda_graphs, inputs.device, target.graph_blocker,
                                      tp, scheduled, decide)
    overlap = rules.decide_overlap(inputs.overlap, graphs, decide)
    margins = rules.decide_margins(inputs.record_margins, tp, target.vocab_size, decide)
    max_ctx = rules.decide_geometry(caps, k, w, inputs.max_context, inputs.max_batch, decide)
    rules.note_target(target, caps, decide)
    auto = inputs.auto
    return DraftPlan(
        family=caps.family, num_draft_tokens=k, block_width=w,
        block_convention=caps.block_convention, first_draft_slot=caps.first_draft_slot,
        vocab_size=target.vocab_size, shard_width=head.width, vocab_start=head.start,
        tp_size=tp, tp_rank=rho, greedy=sel.greedy,
        temperature=0.0 if sel.greedy else sel.temperature,
        acceptance=acceptance,  # type: ignore[arg-type]
        forced_base=base,  # type: ignore[arg-type]
        force_accepted=inputs.force_accepted, vocab_parallel=vp[0],
        markov=markov,  # type: ignore[arg-type]
        markov_kind=caps.markov_head,
        paging=kern,  # type: ignore[arg-type]
        kernels=kern,  # type: ignore[arg-type]
        round_pdl=round_pdl,
        tp_fusions=fusions, cuda_graphs=graphs, overlap=overlap, record_margins=margins,
        capture_layers=tuple(caps.target_layer_ids),
        confidence="scheduler" if scheduled else plan_confidence(caps),  # type: ignore[arg-type]
        slot_capacity=inputs.max_batch, max_ctx=max_ctx, page_size=inputs.page_size,
        pages_per_slot=pages_per_slot(max_ctx, w, inputs.page_size),
        device=inputs.device,
        draft_tokens_mode="auto" if auto is not None or inputs.auto_unmeasured else "fixed",
        draft_tokens_rows=auto.rows if auto is not None else 0,
        cost_profile=auto.profile if auto is not None else None,
        acceptance_estimate=auto.acceptance if auto is not None else None,
        verify_schedule=schedule,  # type: ignore[arg-type]
        verify_budget=budget,
        verify_costs=inputs.verify_costs if scheduled else None,
        sts_temperatures=tuple(inputs.sts_temperatures or ())[:k] if scheduled else (),
        decisions=tuple(decisions),
    )


def _decide_draft_tokens(inputs: PlanInputs, k: int, decide) -> None:
    """The ``num_draft_tokens`` decision (fixed, or the cost model's per-bucket choice), the
    figures behind an automatic one, and ``drafting``."""
    auto = inputs.auto
    if auto is not None:
        chosen = next(c for c in auto.choices if c.rows == auto.rows)
        decide("num_draft_tokens", k,
               f"auto, for the {auto.rows}-row bucket: {chosen.reason} (every bucket's "
               "choice: draft_tokens.rows_*; a generate call takes its batch's)")
        for c in auto.choices:
            decide(f"draft_tokens.rows_{c.rows}", c.draft_tokens, c.reason)
        p = auto.profile
        table = "; ".join(
            f"{g} rows: " + ", ".join(f"K{kk} {t * 1e3:.1f}" for kk, t in
                                      zip(p.draft_tokens, p.seconds[i], strict=True))
            for i, g in enumerate(p.rows))
        runs = "; ".join(f"{m.rows} rows K{m.draft_tokens} {m.seconds * 1e3:.1f} "
                         f"({m.rounds} rounds)" for m in p.measured)
        decide("cost_profile", f"{len(p.rows)} buckets x {len(p.draft_tokens)} K",
               f"ms per round at context width {p.context_width}, {p.method}; other K "
               f"interpolated: {table}" + (
                   f"; corrected by the rounds runs took (median ms per round, host work "
                   f"included; the other K of a bucket scaled by its nearest measured K's "
                   f"measured / profiled ratio): {runs}" if runs else ""))
        acc = auto.acceptance
        decide("acceptance_estimate", ", ".join(f"{x:.2f}" for x in acc.conditional),
               f"P(draft j accepted | drafts before it accepted), j = 1..: {acc.source}")
    elif inputs.auto_unmeasured:
        decide("num_draft_tokens", k,
               "auto: chosen at bind per batch-size bucket from round times measured on the "
               "target and the drafter's acceptance; this plan was made without the target, "
               f"so it shows the largest K considered ({k}); `draftsmith plan --measure` "
               "loads the target and shows the choice")
    else:
        decide("num_draft_tokens", k,
               f"num_draft_tokens = {k} in the config (a fixed K wins over the cost model; "
               "'auto' chooses it from measured costs)")
    decide(
        "drafting", k > 0,
        f"K = {k} drafts per step" if k > 0
        else "K = 0 chosen by the cost model: plain decoding, speculation off"
        if auto is not None
        else "num_draft_tokens = 0: every step commits one target token, the drafter is idle",
    )


def format_plan(plan: DraftPlan) -> str:
    """The plan as text: a header, then one ``name = value  # reason`` line per decision."""
    lines = [
        f"DraftPlan for family {plan.family!r}: K = {plan.num_draft_tokens}, W = {plan.block_width}"
        f", V = {plan.vocab_size}, TP = {plan.tp_size} (rank {plan.tp_rank}), device {plan.device}",
    ]
    width = max(len(d.name) for d in plan.decisions)
    for d in plan.decisions:
        value = ", ".join(d.value) if isinstance(d.value, tuple) else d.value
        value = value if value != "" else "-"
        lines.append(f"  {d.name:<{width}} = {value}  # {d.reason}")
    return "\n".join(lines)


__all__ = [
    "AutoDraftTokens",
    "Decision",
    "DraftPlan",
    "PlanInputs",
    "describe_selection",
    "format_plan",
    "make_plan",
]
