"""The frozen, hashable :class:`DraftPlan` that ``bind`` produces, and its text form.

Every "is this path eligible?" question is answered once, at bind time, and recorded here as a
:class:`Decision` ``(name, value, reason)``. The decoding step reads the plan and never probes.
This module also holds :func:`make_plan` (the pure decision function, no weights, no plugins) and
:func:`format_plan` (what ``draftsmith plan`` prints). It imports neither pluggy nor ``bind``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from draftsmith.contract import (
    BlockConvention,
    DrafterCapabilities,
    MarkovHeadKind,
    ParallelMapping,
    PlanError,
    SelectorCapabilities,
    TargetInfo,
    TPFusion,
)
from draftsmith.runtime.costs import AcceptanceEstimate, CostProfile, DraftTokensChoice
from draftsmith.runtime.costs import VerifyCosts as VerifyCosts
from draftsmith.runtime.head_layout import head_layout
from draftsmith.runtime.verify_plan import decide_verify_schedule, plan_confidence
from draftsmith.selection.eligibility import vocab_parallel_eligibility

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
    selection_kind: str
    """Registered selection strategy."""
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
    gather_fallbacks: tuple[str, ...]
    """Why full logits are gathered; empty when they never are."""
    markov: Literal["none", "eager", "fused"]
    """Where the Markov chain runs."""
    markov_kind: MarkovHeadKind
    """Head kind of the drafter."""
    markov_vocab: Literal["none", "full", "sharded"]
    """Whether the chain sees the full vocabulary or this rank's shard."""
    paging: Literal["eager", "fused"]
    """Paging preparation and context store: eager references or fused kernels."""
    kernels: Literal["eager", "fused"]
    """Acceptance kernels dispatch."""
    tp_fusions: frozenset[TPFusion]
    """Drafter TP fusions taken."""
    record_margins: bool
    """Record each committed token's winning target logit and top-2 margin."""
    cuda_graphs: bool
    """Capture each round (drafting, target verification, acceptance, commit) in CUDA graphs."""
    overlap: bool
    """Launch round ``t + 1`` before the host commits round ``t`` (``generate``)."""
    capture_layers: tuple[int, ...]
    """Target layers captured for the drafter."""
    confidence: Literal["none", "score-only", "scheduler"]
    """Confidence head use: none, scored only, or feeding the verify scheduler."""
    slot_capacity: int = Field(ge=1)
    """Requests decoded at once; slot ``slot_capacity`` is the dummy."""
    max_ctx: int = Field(ge=1)
    """Largest drafter context length."""
    page_size: int = Field(ge=1)
    """``P_sz``."""
    pages_per_slot: int = Field(ge=1)
    """``ceil((max_ctx + W) / P_sz)``."""
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
    draft_tokens_choices: tuple[DraftTokensChoice, ...] = ()
    """Under ``auto``: ``K`` for every profiled rows bucket, with its reason."""
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


def _check_block(caps: DrafterCapabilities, num_draft_tokens: int) -> None:
    """:class:`PlanError` when ``K`` asks for a block wider than the drafter was trained with."""
    if num_draft_tokens > 0:
        w = caps.block_width(num_draft_tokens)
        if w > caps.trained_block_size:
            raise PlanError(
                f"block width W = {w} (K = {num_draft_tokens}, {caps.block_convention.value}) "
                f"exceeds the drafter's trained_block_size {caps.trained_block_size}; lower "
                f"num_draft_tokens to at most {caps.trained_block_size - caps.first_draft_slot}"
            )


def make_plan(
    inputs: PlanInputs, caps: DrafterCapabilities, target: TargetInfo, *,
    fused_kernels_available: bool = True,
) -> DraftPlan:
    """Decide every path; raise :class:`PlanError` for an impossible combination. Whether the
    drafter fits the target (vocabulary, widths, layers) is ``bind``'s check
    (:func:`draftsmith.runtime.bind.check_fit`), made before this is called."""
    k = inputs.num_draft_tokens
    tp, rho = inputs.mapping.tp_size, inputs.mapping.tp_rank
    _check_block(caps, k)
    head = head_layout(target.vocab_size, tp, rho, inputs.head_shard)
    if head.replicated and tp > 1 and caps.markov_head is not MarkovHeadKind.NONE and k > 0:
        raise PlanError(
            f"{head.reason}, but the drafter's {caps.markov_head.value} Markov head splits its "
            f"w2 rows with the head (it needs V = S * TP); use a TP size that divides V = "
            f"{target.vocab_size}, or a drafter without a Markov head"
        )
    decisions: list[Decision] = []

    def decide(name: str, value: DecisionValue, reason: str) -> DecisionValue:
        decisions.append(Decision(name=name, value=value, reason=reason))
        return value

    # ---- block width ----
    w = caps.block_width(k) if k > 0 else 0
    _decide_draft_tokens(inputs, k, decide)
    decide(
        "block_width", w,
        f"{caps.block_convention.value} convention: W = K + 1 (slot 0 is the silent bonus)"
        if caps.block_convention is BlockConvention.BONUS_SILENT
        else f"{caps.block_convention.value} convention: W = K (the anchor predicts draft 0)",
    )

    # ---- selection and acceptance ----
    sel = inputs.selector
    greedy = sel.greedy
    acc = "strict" if greedy else sel.acceptance
    if greedy:
        base = decide("acceptance_rule", "strict",
                      "greedy selection: a draft is accepted iff it equals the target argmax")
    elif acc == "rejection":
        base = decide("acceptance_rule", "rejection",
                      f"{describe_selection(sel)}: lossless rejection sampling u * q < p")
    else:
        base = decide("acceptance_rule", "strict",
                      f"{describe_selection(sel)}: one keyed target sample per row, matched "
                      "(the tokens of plain sampled decoding with the same seeds)")
    if inputs.force_accepted > 0:
        acceptance = decide("acceptance", "forced",
                            f"force_accepted = {inputs.force_accepted}: counts overridden for "
                            "benchmarks, ragged cap applied last; output text meaningless")
    else:
        acceptance = decide("acceptance", base, "no forced acceptance configured")

    # ---- the target's head: even column shards, or whole on every rank ----
    decide("target_head", "whole" if tp == 1 else "replicated" if head.replicated else "sharded",
           head.reason)
    if tp == 1:
        decide("target_layers", "whole", "TP = 1")
    elif inputs.target_layers == "split":
        decide("target_layers", "split",
               f"transformers' tensor-parallel plan: each rank holds 1/{tp} of the attention "
               "heads and MLP columns, one all-reduce after o_proj and down_proj per layer")
    else:
        decide("target_layers", "whole",
               "every rank holds and runs every decoder layer (target.split_layers is off, or "
               "the target splits only its head)")

    # ---- vocab parallel (the selection layer's eligibility rule, 5.1) ----
    vp_reason = ""
    if tp == 1:
        vp = decide("vocab_parallel", False, "TP = 1: one rank holds the whole vocabulary")
    elif head.replicated:
        vp = decide("vocab_parallel", False,
                    f"{head.reason}: selection runs on the full logits each rank computes, with "
                    "no exchange")
    else:
        elig = vocab_parallel_eligibility(tp_size=tp, vocab_size=target.vocab_size,
                                          strategy=sel,
                                          attention_dp=inputs.mapping.attention_dp)
        vp_reason = elig.reason
        vp = decide("vocab_parallel", elig.ok,
                    f"{elig.reason}: one [rows, 128] SUM exchange per selection" if elig.ok
                    else elig.reason)

    # ---- selection route: the strategy's path at this TP size ----
    if tp == 1:
        route = ("local", "TP = 1: the full vocabulary is local")
    elif head.replicated:
        route = ("local", f"{head.reason}: every rank selects from its own full logits")
    elif not vp:
        route = (inputs.selection_route if inputs.selection_route is not None
                 and inputs.selection_route[0] in ("topk_candidates", "gather")
                 and not inputs.mapping.attention_dp
                 else ("gather", f"gather logits: {vp_reason}"))
    elif inputs.selection_route is not None:
        route = inputs.selection_route
    else:
        route = ("pair_argmax" if greedy else "gumbel_pairs", vp_reason)
    decide("target_selection", route[0],
           f"the first token, the bonus and target samples: {route[1]}")

    gathers: list[str] = []
    if tp > 1 and head.replicated:
        gathers.append(f"{head.reason}: every rank computes the full [rows, V] logits itself "
                       "(nothing is gathered, nothing is saved)")
    elif tp > 1:
        if acc == "rejection" and not greedy:
            gathers.append("rejection sampling builds draft_probs over the full vocabulary")
        if inputs.mapping.attention_dp:
            gathers.append("attention-DP")
        if route[0] == "gather":
            gathers.append(f"token selection: {route[1]}")
    if gathers and not inputs.allow_gather:
        raise PlanError(
            f"this configuration must gather full logits ({'; '.join(gathers)}) but "
            "runtime.allow_gather is false; the sharded residual of rejection sampling is not "
            "implemented: use greedy selection or allow gathering"
        )
    decide("gather_fallbacks", tuple(gathers),
           "; ".join(gathers) if gathers else "logits never leave their shard"
           if tp > 1 else "TP = 1: logits are already whole")
    if base != "rejection":
        decide("acceptance_probs", "none",
               "strict acceptance compares token ids; no probabilities are built")
    elif tp > 1 and not head.replicated:
        decide("acceptance_probs", "gather",
               "rejection sampling builds target_probs and draft_probs [rows, V]: the logits "
               "are all-gathered along the vocabulary (the sharded residual is not "
               "implemented)")
    else:
        decide("acceptance_probs", "local",
               "rejection sampling builds target_probs and draft_probs from the full logits "
               "this rank holds")

    # ---- kernels ----
    on_cuda = inputs.device.startswith("cuda")
    if inputs.kernels == "eager":
        fused = False
        kreason = "runtime.kernels = 'eager' forces the torch references"
    elif inputs.kernels == "fused":
        if not fused_kernels_available:
            raise PlanError("runtime.kernels = 'fused' but Triton kernels are unavailable here")
        fused = True
        kreason = "runtime.kernels = 'fused'"
    elif on_cuda and fused_kernels_available:
        fused, kreason = True, "kernels = 'auto' on CUDA: fused Triton kernels"
    else:
        fused = False
        kreason = f"kernels = 'auto' on {inputs.device}: eager references (Triton would be interpreted)"
    kern = decide("kernels", "fused" if fused else "eager", kreason)
    paging = decide("paging", kern, f"placement and context store: {kreason}")

    # ---- Markov chain ----
    mk = caps.markov_head
    if mk is MarkovHeadKind.NONE:
        markov = decide("markov", "none", f"family {caps.family} declares no Markov head")
        mvocab = decide("markov_vocab", "none", "no Markov head")
    elif k == 0:
        markov = decide("markov", "none", "K = 0: no block, no chain")
        mvocab = decide("markov_vocab", "none", "no chain")
    else:
        if mk is not MarkovHeadKind.VANILLA:
            markov = decide("markov", "eager",
                            f"{mk.value} head needs per-slot hidden states: torch path only")
        elif fused and greedy and tp == 1:
            markov = decide("markov", "fused",
                            "vanilla head, greedy: fused bias + argmax kernel per slot")
        elif fused and greedy:
            markov = decide("markov", "eager",
                            f"TP = {tp}: torch bias on this rank's shard, then the selector's "
                            "pair exchange per slot")
        elif fused:
            markov = decide("markov", "eager",
                            "sampled chain feeds the sampled token forward: torch bias + "
                            "keyed selection")
        else:
            markov = decide("markov", "eager", kreason)
        sharded_head = tp > 1 and not head.replicated
        mvocab = decide("markov_vocab", "sharded" if sharded_head else "full",
                        "corrected logits stay on their shard; one pair exchange per slot"
                        if vp else "corrected logits stay on their shard (w2 holds this rank's "
                        f"rows); each slot selects by the {route[0]} route"
                        if sharded_head else "the chain sees full-vocabulary logits")

    # ---- draft selection: the drafter's block logits over this rank's head rows ----
    if k == 0:
        decide("draft_selection", "none", "K = 0: nothing is drafted")
    else:
        chain = ("; the Markov chain selects slot by slot, one exchange per slot"
                 if mvocab == "sharded" and route[0] != "local" else "")
        decide("draft_selection", route[0], f"drafts{chain}: {route[1]}")

    # ---- TP fusions ----
    if tp == 1:
        fusions: frozenset[TPFusion] = frozenset()
        decide("tp_fusions", (), "TP = 1: fusions degenerate to the stock path")
    elif caps.dtype != "bfloat16":
        if caps.tp_fusions:
            raise PlanError(
                f"the drafter takes the TP fusions {sorted(f.value for f in caps.tp_fusions)} "
                f"but its weights are {caps.dtype}; the fused all-reduce + RMSNorm needs bf16 "
                "weights: load it in bf16 or without tp_fusions"
            )
        fusions = frozenset()
        decide("tp_fusions", (), f"drafter dtype {caps.dtype}: the fused all-reduce + RMSNorm "
                                 "needs bf16 weights")
    else:
        fusions = frozenset(caps.tp_fusions)
        decide("tp_fusions", tuple(sorted(f.value for f in fusions)),
               "taken by the drafter and eligible: bf16, TP > 1" if fusions
               else f"family {caps.family} declares no TP fusion")

    # ---- confidence and the verify schedule ----
    schedule, budget = decide_verify_schedule(
        inputs.verify_schedule, inputs.verify_budget, inputs.verify_costs,
        inputs.sts_temperatures, inputs.drafter_built, caps, k, tp, decide,
        auto_chose_zero=k == 0 and inputs.auto is not None)
    confidence = "scheduler" if schedule != "all" else plan_confidence(caps)

    # ---- CUDA graphs ----
    wanted = {True: "on", False: "off"}.get(inputs.cuda_graphs, inputs.cuda_graphs)
    if wanted == "off":
        graphs = decide("cuda_graphs", False, "runtime.cuda_graphs is off: every round runs eagerly")
    elif not on_cuda:
        graphs = decide("cuda_graphs", False,
                        f"runtime.cuda_graphs = {wanted!r} but the device is {inputs.device}: eager")
    elif target.graph_blocker is not None:
        if wanted == "on":
            raise PlanError(f"runtime.cuda_graphs = 'on' but the target cannot be captured: "
                            f"{target.graph_blocker}; set runtime.cuda_graphs to 'auto' or 'off'")
        graphs = decide("cuda_graphs", False,
                        f"the target cannot be captured ({target.graph_blocker}): every round, "
                        "target verification included, runs eagerly")
    elif wanted == "auto" and inputs.mapping.tp_size > 1:
        graphs = decide("cuda_graphs", False,
                        "runtime.cuda_graphs = 'auto' captures single-rank rounds only; set "
                        "'on' to capture the collectives too")
    elif schedule != "all":
        graphs = decide("cuda_graphs", True,
                        f"runtime.cuda_graphs = {wanted!r} on {inputs.device}: a scheduled round "
                        "is captured as two phases, drafting and scheduling per (batch, context "
                        "width) bucket, verification, acceptance and commit per (batch, context "
                        "width, verify token count T), and replayed with two host reads (T, then "
                        "the result); admissions as in the unscheduled round")
    else:
        graphs = decide("cuda_graphs", True,
                        f"runtime.cuda_graphs = {wanted!r} on {inputs.device}: the whole round "
                        "(drafting, target verification, acceptance, commit) is captured per "
                        "(batch, context width) bucket and replayed with one host read; on one "
                        "rank each prompt's admission (prefill, first token, drafter context) is "
                        "captured per prefill width (16, 24, 32, 48, ... 4096) and replayed with "
                        "one host read, longer prompts prefill eagerly; buffers owned by the "
                        "plan")

    # ---- overlap ----
    want_overlap = {True: "on", False: "off"}.get(inputs.overlap, inputs.overlap)
    if want_overlap == "off":
        overlap = decide("overlap", False, "runtime.overlap is off: the host commits each round "
                         "before the next is launched")
    elif want_overlap == "on" or graphs:
        overlap = decide("overlap", True,
                         "round t + 1 is launched before the host commits round t (its read, "
                         "tokens, stop and budget rules run while the device computes); a "
                         "scheduled round, an admission and a round no request surely survives "
                         "wait for the host")
    else:
        overlap = decide("overlap", False, "the rounds run eagerly (no CUDA graphs): the device "
                         "waits for the host anyway")

    # ---- margins ----
    want_margins = {True: "on", False: "off"}.get(inputs.record_margins, inputs.record_margins)
    if want_margins == "off":
        margins = decide("record_margins", False, "runtime.record_margins is off")
    elif tp > 1 or target.vocab_size < 2:
        if want_margins == "on":
            raise PlanError("runtime.record_margins = 'on' needs the whole vocabulary on one "
                            f"rank (TP = {tp}, V = {target.vocab_size}); set it to 'auto' or "
                            "'off'")
        margins = decide("record_margins", False,
                         f"TP = {tp}: a top-2 over a shard is not the row's; not recorded")
    else:
        margins = decide("record_margins", True,
                         "one top-2 per round: each committed token's winning logit and margin, "
                         "for the exactness report")

    # ---- paging geometry ----
    span = max(w, k + 1)
    max_ctx = min(inputs.max_context, caps.max_position_embeddings - span)
    if max_ctx < 2:
        raise PlanError(
            f"the drafter's RoPE table ({caps.max_position_embeddings} positions) leaves no "
            f"room for a context next to a block of {span}"
        )
    pages = -(-(max_ctx + max(w, 1)) // inputs.page_size)
    decide("max_ctx", max_ctx,
           f"min(runtime.max_context {inputs.max_context}, drafter RoPE "
           f"{caps.max_position_embeddings} - {span})")
    decide("slot_capacity", inputs.max_batch,
           f"runtime.max_batch = {inputs.max_batch}; slot {inputs.max_batch} is the dummy")
    decide("target_gemm", target.gemm,
           "the target's linear layers run kernels.linear at up to 32 rows: a row's result "
           "does not depend on the rows beside it, so a verification of up to 32 tokens "
           "rounds as plain decoding does; torch's GEMM, faster there, above (target.gemm)"
           if target.gemm == "row-stable"
           else "the target's linear layers and head run oneDNN's product over weights packed "
           "at load (the drafter's logits too): 2-8 rows cost about one, and a row's result "
           "does not depend on the row count, so a verification rounds as plain decoding does "
           "(target.gemm)"
           if target.gemm == "packed"
           else "the target's linear layers run torch's GEMM (target.gemm)")
    decide("target_forward", target.layer_path,
           target.layer_path_reason or "the target's own forward runs its layers")
    decide("capture_layers", tuple(str(x) for x in caps.target_layer_ids),
           f"the drafter reads {caps.num_captured_layers} target layer(s)")
    target_dtype = str(target.dtype).removeprefix("torch.")
    decide("drafter_dtype", caps.dtype,
           "drafter.dtype, else the checkpoint's torch_dtype (random weights: the target's); "
           + ("the same as the target's" if caps.dtype == target_dtype
              else f"the target runs {target_dtype}"))

    return DraftPlan(
        family=caps.family,
        num_draft_tokens=k,
        block_width=w,
        block_convention=caps.block_convention,
        first_draft_slot=caps.first_draft_slot,
        vocab_size=target.vocab_size,
        shard_width=head.width,
        vocab_start=head.start,
        tp_size=tp,
        tp_rank=rho,
        selection_kind=sel.kind,
        greedy=greedy,
        temperature=0.0 if greedy else sel.temperature,
        acceptance=acceptance,  # type: ignore[arg-type]
        forced_base=base,  # type: ignore[arg-type]
        force_accepted=inputs.force_accepted,
        vocab_parallel=bool(vp),
        gather_fallbacks=tuple(gathers),
        markov=markov,  # type: ignore[arg-type]
        markov_kind=mk,
        markov_vocab=mvocab,  # type: ignore[arg-type]
        paging=paging,  # type: ignore[arg-type]
        kernels=kern,  # type: ignore[arg-type]
        tp_fusions=fusions,
        cuda_graphs=bool(graphs),
        overlap=bool(overlap),
        record_margins=bool(margins),
        capture_layers=tuple(caps.target_layer_ids),
        confidence=confidence,  # type: ignore[arg-type]
        slot_capacity=inputs.max_batch,
        max_ctx=max_ctx,
        page_size=inputs.page_size,
        pages_per_slot=pages,
        device=inputs.device,
        draft_tokens_mode="auto" if inputs.auto is not None or inputs.auto_unmeasured
        else "fixed",
        draft_tokens_rows=inputs.auto.rows if inputs.auto is not None else 0,
        cost_profile=inputs.auto.profile if inputs.auto is not None else None,
        acceptance_estimate=inputs.auto.acceptance if inputs.auto is not None else None,
        draft_tokens_choices=inputs.auto.choices if inputs.auto is not None else (),
        verify_schedule=schedule,
        verify_budget=budget,
        verify_costs=inputs.verify_costs if schedule != "all" else None,
        sts_temperatures=tuple(inputs.sts_temperatures or ())[:k] if schedule != "all" else (),
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
