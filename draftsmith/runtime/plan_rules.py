"""The decisions :func:`~draftsmith.runtime.plan.make_plan` makes, one function per concern.

Each function records its decisions through ``decide(name, value, reason)`` (which returns the
value) in the order the plan lists them, and returns the fields it settles; it raises
:class:`PlanError` for a combination no path serves. They read plain values and the contract's
capability records, never a config, a model or a plugin, and import nothing of the plan (it
imports them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from draftsmith.contract import (
    BlockConvention,
    DrafterCapabilities,
    MarkovHeadKind,
    PlanError,
    SelectorCapabilities,
    TargetInfo,
    TPFusion,
)
from draftsmith.kernels import has_pdl
from draftsmith.runtime.head_layout import HeadLayout
from draftsmith.selection.eligibility import vocab_parallel_eligibility

Decide = Callable[[str, Any, str], Any]
"""``decide(name, value, reason)`` records one decision and returns ``value``."""

Route = tuple[str, str]
"""``(kind, reason)`` of the selection route: ``local``, ``pair_argmax``, ``gumbel_pairs``,
``topk_candidates`` or ``gather``."""


def _switch(value: str | bool) -> str:
    """A runtime switch (``auto``, ``on``, ``off`` or a boolean) as its word."""
    return {True: "on", False: "off"}.get(value, value)  # type: ignore[arg-type]


def check_block(caps: DrafterCapabilities, k: int) -> None:
    """:class:`PlanError` when ``K`` asks for a block wider than the drafter was trained with."""
    if k > 0:
        w = caps.block_width(k)
        if w > caps.trained_block_size:
            raise PlanError(
                f"block width W = {w} (K = {k}, {caps.block_convention.value}) "
                f"exceeds the drafter's trained_block_size {caps.trained_block_size}; lower "
                f"num_draft_tokens to at most {caps.trained_block_size - caps.first_draft_slot}"
            )


def check_head(caps: DrafterCapabilities, k: int, tp: int, head: HeadLayout,
               vocab_size: int) -> None:
    """:class:`PlanError` when the target's head is whole on every rank but the drafter's
    Markov head splits its ``w2`` rows with the head."""
    if head.replicated and tp > 1 and caps.markov_head is not MarkovHeadKind.NONE and k > 0:
        raise PlanError(
            f"{head.reason}, but the drafter's {caps.markov_head.value} Markov head splits its "
            f"w2 rows with the head (it needs V = S * TP); use a TP size that divides V = "
            f"{vocab_size}, or a drafter without a Markov head"
        )


def decide_block_width(caps: DrafterCapabilities, k: int, decide: Decide) -> int:
    """``block_width``: ``W`` (0 when ``K = 0``)."""
    return decide(
        "block_width", caps.block_width(k) if k > 0 else 0,
        f"{caps.block_convention.value} convention: W = K + 1 (slot 0 is the silent bonus)"
        if caps.block_convention is BlockConvention.BONUS_SILENT
        else f"{caps.block_convention.value} convention: W = K (the anchor predicts draft 0)",
    )


def decide_acceptance(sel: SelectorCapabilities, force_accepted: float, describe: str,
                      decide: Decide) -> tuple[str, str]:
    """``acceptance_rule`` and ``acceptance``: ``(acceptance, the rule under it)``.
    ``describe``: the selection in words."""
    if sel.greedy:
        base = decide("acceptance_rule", "strict",
                      "greedy selection: a draft is accepted iff it equals the target argmax")
    elif sel.acceptance == "rejection":
        base = decide("acceptance_rule", "rejection",
                      f"{describe}: lossless rejection sampling u * q < p")
    else:
        base = decide("acceptance_rule", "strict",
                      f"{describe}: one keyed target sample per row, matched "
                      "(the tokens of plain sampled decoding with the same seeds)")
    if force_accepted > 0:
        return decide("acceptance", "forced",
                      f"force_accepted = {force_accepted}: counts overridden for "
                      "benchmarks, ragged cap applied last; output text meaningless"), base
    return decide("acceptance", base, "no forced acceptance configured"), base


def decide_target_split(tp: int, head: HeadLayout, layers: str, decide: Decide) -> None:
    """``target_head`` and ``target_layers``: what of the target each rank holds."""
    decide("target_head", "whole" if tp == 1 else "replicated" if head.replicated else "sharded",
           head.reason)
    if tp == 1:
        decide("target_layers", "whole", "TP = 1")
    elif layers == "split":
        decide("target_layers", "split",
               f"transformers' tensor-parallel plan: each rank holds 1/{tp} of the attention "
               "heads and MLP columns, one all-reduce after o_proj and down_proj per layer")
    else:
        decide("target_layers", "whole",
               "every rank holds and runs every decoder layer (target.split_layers is off, or "
               "the target splits only its head)")


def decide_vocab_parallel(tp: int, head: HeadLayout, vocab_size: int, sel: SelectorCapabilities,
                          attention_dp: bool, decide: Decide) -> tuple[bool, str]:
    """``vocab_parallel`` (the selection layer's eligibility rule, 5.1): ``(taken, the
    eligibility reason)`` (the reason is empty where the rule was not asked)."""
    if tp == 1:
        return decide("vocab_parallel", False, "TP = 1: one rank holds the whole vocabulary"), ""
    if head.replicated:
        return decide("vocab_parallel", False,
                      f"{head.reason}: selection runs on the full logits each rank computes, "
                      "with no exchange"), ""
    elig = vocab_parallel_eligibility(tp_size=tp, vocab_size=vocab_size, strategy=sel,
                                      attention_dp=attention_dp)
    taken = decide("vocab_parallel", elig.ok,
                   f"{elig.reason}: one [rows, 128] SUM exchange per selection" if elig.ok
                   else elig.reason)
    return taken, elig.reason


def decide_route(tp: int, head: HeadLayout, vocab_parallel: tuple[bool, str],
                 own: Route | None, attention_dp: bool, greedy: bool,
                 decide: Decide) -> Route:
    """``target_selection``: the route of the first token, the bonus and target samples at this
    TP size. ``own``: the strategy's own route, if it names one."""
    vp, vp_reason = vocab_parallel
    if tp == 1:
        route = ("local", "TP = 1: the full vocabulary is local")
    elif head.replicated:
        route = ("local", f"{head.reason}: every rank selects from its own full logits")
    elif not vp:
        route = (own if own is not None and own[0] in ("topk_candidates", "gather")
                 and not attention_dp else ("gather", f"gather logits: {vp_reason}"))
    elif own is not None:
        route = own
    else:
        route = ("pair_argmax" if greedy else "gumbel_pairs", vp_reason)
    decide("target_selection", route[0],
           f"the first token, the bonus and target samples: {route[1]}")
    return route


def decide_gathers(tp: int, head: HeadLayout, base: str, attention_dp: bool, route: Route,
                   allow_gather: bool, decide: Decide) -> None:
    """``gather_fallbacks`` and ``acceptance_probs``: why full logits are gathered (``base``:
    the acceptance rule); recorded for the reader, read by no runtime component."""
    gathers: list[str] = []
    if tp > 1 and head.replicated:
        gathers.append(f"{head.reason}: every rank computes the full [rows, V] logits itself "
                       "(nothing is gathered, nothing is saved)")
    elif tp > 1:
        if base == "rejection":
            gathers.append("rejection sampling builds draft_probs over the full vocabulary")
        if attention_dp:
            gathers.append("attention-DP")
        if route[0] == "gather":
            gathers.append(f"token selection: {route[1]}")
    if gathers and not allow_gather:
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


def decide_kernels(requested: str, device: str, available: bool,
                   decide: Decide) -> tuple[str, str]:
    """``kernels`` and ``paging``: ``(fused or eager, the reason)``."""
    if requested == "eager":
        fused, reason = False, "runtime.kernels = 'eager' forces the torch references"
    elif requested == "fused":
        if not available:
            raise PlanError("runtime.kernels = 'fused' but Triton kernels are unavailable here")
        fused, reason = True, "runtime.kernels = 'fused'"
    elif device.startswith("cuda") and available:
        fused, reason = True, "kernels = 'auto' on CUDA: fused Triton kernels"
    else:
        fused, reason = False, (f"kernels = 'auto' on {device}: eager references (Triton would "
                                "be interpreted)")
    kern = decide("kernels", "fused" if fused else "eager", reason)
    decide("paging", kern, f"placement and context store: {reason}")
    return kern, reason


def decide_markov(caps: DrafterCapabilities, k: int, tp: int, head: HeadLayout, *, fused: bool,
                  greedy: bool, vocab_parallel: bool, route: Route, kernels_reason: str,
                  decide: Decide) -> str:
    """``markov``, ``markov_vocab`` and ``draft_selection``: returns where the chain runs (the
    vocabulary it sees is recorded for the reader: the chain follows its weights' shard)."""
    mk = caps.markov_head
    mvocab = "none"
    if mk is MarkovHeadKind.NONE:
        markov = decide("markov", "none", f"family {caps.family} declares no Markov head")
        decide("markov_vocab", "none", "no Markov head")
    elif k == 0:
        markov = decide("markov", "none", "K = 0: no block, no chain")
        decide("markov_vocab", "none", "no chain")
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
            markov = decide("markov", "eager", kernels_reason)
        sharded_head = tp > 1 and not head.replicated
        mvocab = decide("markov_vocab", "sharded" if sharded_head else "full",
                        "corrected logits stay on their shard; one pair exchange per slot"
                        if vocab_parallel else "corrected logits stay on their shard (w2 holds "
                        f"this rank's rows); each slot selects by the {route[0]} route"
                        if sharded_head else "the chain sees full-vocabulary logits")
    if k == 0:
        decide("draft_selection", "none", "K = 0: nothing is drafted")
    else:
        chain = ("; the Markov chain selects slot by slot, one exchange per slot"
                 if mvocab == "sharded" and route[0] != "local" else "")
        decide("draft_selection", route[0], f"drafts{chain}: {route[1]}")
    return markov


def decide_round_pdl(requested: str, kernels: str, device: str, k: int,
                     decide: Decide) -> bool:
    """``round_pdl``: whether the round's drafting kernels (the drafter's products, norms and
    attention, and the fused Markov chain) launch with programmatic dependent launch."""
    if requested == "off":
        return decide("round_pdl", False, "runtime.pdl = 'off': plain launches")
    if kernels != "fused":
        return decide("round_pdl", False, "eager kernels (the torch references): no Triton "
                      "launch to make programmatically dependent")
    if not has_pdl(device):
        return decide("round_pdl", False, f"no GPU of compute capability 9.0 or above at "
                      f"{device} on this host (programmatic dependent launch needs one): plain "
                      "launches")
    if k == 0:
        return decide("round_pdl", False, "K = 0: no drafting kernels to launch with PDL")
    return decide("round_pdl", True, "runtime.pdl = 'auto' on compute capability 9.0 and "
                  "above: the drafting kernels launch programmatically dependent (each one's "
                  "programs start while the one before finishes: a product's load a weight tile, "
                  "the Markov chain's their w2 tile; same bits)")


def decide_tp_fusions(caps: DrafterCapabilities, tp: int, decide: Decide) -> frozenset[TPFusion]:
    """``tp_fusions``: the drafter's TP fusions taken."""
    if tp == 1:
        decide("tp_fusions", (), "TP = 1: fusions degenerate to the stock path")
        return frozenset()
    if caps.dtype != "bfloat16":
        if caps.tp_fusions:
            raise PlanError(
                f"the drafter takes the TP fusions {sorted(f.value for f in caps.tp_fusions)} "
                f"but its weights are {caps.dtype}; the fused all-reduce + RMSNorm needs bf16 "
                "weights: load it in bf16 or without tp_fusions"
            )
        decide("tp_fusions", (), f"drafter dtype {caps.dtype}: the fused all-reduce + RMSNorm "
                                 "needs bf16 weights")
        return frozenset()
    fusions = frozenset(caps.tp_fusions)
    decide("tp_fusions", tuple(sorted(f.value for f in fusions)),
           "taken by the drafter and eligible: bf16, TP > 1" if fusions
           else f"family {caps.family} declares no TP fusion")
    return fusions


def decide_cuda_graphs(requested: str | bool, device: str, blocker: str | None, tp: int,
                       scheduled: bool, decide: Decide) -> bool:
    """``cuda_graphs``: whether rounds and admissions are captured and replayed."""
    wanted = _switch(requested)
    if wanted == "off":
        return decide("cuda_graphs", False,
                      "runtime.cuda_graphs is off: every round runs eagerly")
    if not device.startswith("cuda"):
        return decide("cuda_graphs", False,
                      f"runtime.cuda_graphs = {wanted!r} but the device is {device}: eager")
    if blocker is not None:
        if wanted == "on":
            raise PlanError(f"runtime.cuda_graphs = 'on' but the target cannot be captured: "
                            f"{blocker}; set runtime.cuda_graphs to 'auto' or 'off'")
        return decide("cuda_graphs", False,
                      f"the target cannot be captured ({blocker}): every round, target "
                      "verification included, runs eagerly")
    if wanted == "auto" and tp > 1:
        return decide("cuda_graphs", False,
                      "runtime.cuda_graphs = 'auto' captures single-rank rounds only; set "
                      "'on' to capture the collectives too")
    if scheduled:
        return decide("cuda_graphs", True,
                      f"runtime.cuda_graphs = {wanted!r} on {device}: a scheduled round "
                      "is captured as two phases, drafting and scheduling per (batch, context "
                      "width) bucket, verification, acceptance and commit per (batch, context "
                      "width, verify token count T), and replayed with two host reads (T, then "
                      "the result); admissions as in the unscheduled round")
    return decide("cuda_graphs", True,
                  f"runtime.cuda_graphs = {wanted!r} on {device}: the whole round "
                  "(drafting, target verification, acceptance, commit) is captured per "
                  "(batch, context width) bucket and replayed with one host read; on one "
                  "rank each prompt's admission (prefill, first token, drafter context) is "
                  "captured per prefill width (16, 24, 32, 48, ... 4096) and replayed with "
                  "one host read, longer prompts prefill eagerly; buffers owned by the "
                  "plan")


def decide_overlap(requested: str | bool, graphs: bool, decide: Decide) -> bool:
    """``overlap``: whether round ``t + 1`` is launched before the host commits round ``t``."""
    wanted = _switch(requested)
    if wanted == "off":
        return decide("overlap", False, "runtime.overlap is off: the host commits each round "
                      "before the next is launched")
    if wanted == "on" or graphs:
        return decide("overlap", True,
                      "round t + 1 is launched before the host commits round t (its read, "
                      "tokens, stop and budget rules run while the device computes); a "
                      "scheduled round, an admission and a round no request surely survives "
                      "wait for the host")
    return decide("overlap", False, "the rounds run eagerly (no CUDA graphs): the device "
                  "waits for the host anyway")


def decide_margins(requested: str | bool, tp: int, vocab_size: int, decide: Decide) -> bool:
    """``record_margins``: whether each committed token's top-2 margin is recorded."""
    wanted = _switch(requested)
    if wanted == "off":
        return decide("record_margins", False, "runtime.record_margins is off")
    if tp > 1 or vocab_size < 2:
        if wanted == "on":
            raise PlanError("runtime.record_margins = 'on' needs the whole vocabulary on one "
                            f"rank (TP = {tp}, V = {vocab_size}); set it to 'auto' or 'off'")
        return decide("record_margins", False,
                      f"TP = {tp}: a top-2 over a shard is not the row's; not recorded")
    return decide("record_margins", True,
                  "one top-2 per round: each committed token's winning logit and margin, "
                  "for the exactness report")


def decide_geometry(caps: DrafterCapabilities, k: int, w: int, max_context: int, max_batch: int,
                    decide: Decide) -> int:
    """``max_ctx`` and ``slot_capacity``: returns the drafter context limit."""
    span = max(w, k + 1)
    max_ctx = min(max_context, caps.max_position_embeddings - span)
    if max_ctx < 2:
        raise PlanError(
            f"the drafter's RoPE table ({caps.max_position_embeddings} positions) leaves no "
            f"room for a context next to a block of {span}"
        )
    decide("max_ctx", max_ctx,
           f"min(runtime.max_context {max_context}, drafter RoPE "
           f"{caps.max_position_embeddings} - {span})")
    decide("slot_capacity", max_batch,
           f"runtime.max_batch = {max_batch}; slot {max_batch} is the dummy")
    return max_ctx


def note_target(target: TargetInfo, caps: DrafterCapabilities, decide: Decide) -> None:
    """``target_gemm``, ``target_forward``, ``capture_layers`` and ``drafter_dtype``: what the
    target and the drafter bring, recorded for the reader."""
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
           else target.gemm_reason or "the target's linear layers run torch's GEMM (target.gemm)")
    decide("target_forward", target.layer_path,
           target.layer_path_reason or "the target's own forward runs its layers")
    decide("capture_layers", tuple(str(x) for x in caps.target_layer_ids),
           f"the drafter reads {caps.num_captured_layers} target layer(s)")
    target_dtype = str(target.dtype).removeprefix("torch.")
    decide("drafter_dtype", caps.dtype,
           "drafter.dtype, else the checkpoint's torch_dtype (random weights: the target's); "
           + ("the same as the target's" if caps.dtype == target_dtype
              else f"the target runs {target_dtype}"))
