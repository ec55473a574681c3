"""Which token-selection path a configuration may take, as data the runtime's plan records.

Owns :func:`vocab_parallel_eligibility` (and the rules for when full logits must be gathered) and
:func:`selection_route` (the path a strategy takes for a given TP size). Both are pure functions
of configuration, so every rank reaches the same decision without communicating. Imports
``draftsmith.contract``, ``draftsmith.selection.configs`` and the Gumbel group size of
``draftsmith.kernels.gumbel_pair``; never torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from draftsmith.contract import SelectorCapabilities
from draftsmith.kernels.gumbel_pair import GROUP_SIZE
from draftsmith.selection.configs import GreedyConfig, SampleConfig, capabilities_of

MAX_EXACT_VOCAB = 2**24
"""Global ids travel as fp32 values in the pair exchange; exact only below ``2**24``."""

MAX_TOPK_CANDIDATES = 1024
"""Largest ``top_k`` served by the bounded candidate exchange (``k`` candidates per rank)."""

RouteKind = Literal["local", "pair_argmax", "gumbel_pairs", "topk_candidates", "gather"]


@dataclass(frozen=True)
class SelectionRoute:
    """The path token selection takes and why (recorded in the runtime's plan).

    ``local``: the full vocabulary is on this rank. ``pair_argmax``: per-rank argmax pairs, one
    exchange. ``gumbel_pairs``: per-rank Gumbel-max pairs. ``topk_candidates``:
    ``k`` candidates per rank, one all-gather, exact top-k (then top-p on the ``k``).
    ``gather``: all-gather the logits along the vocabulary.
    """

    kind: RouteKind
    reason: str


@dataclass(frozen=True)
class VocabParallelEligibility:
    """Outcome of :func:`vocab_parallel_eligibility`.

    ``ok``: the pair exchange (argmax or Gumbel-max) may be used. ``reason``: why (the first
    blocking condition when not ok). ``gather_required``: full logits must be gathered for
    token selection. ``blockers``: every blocking condition; ``filter_only``: the only blockers
    are top-k / top-p (which the bounded candidate exchange can still serve).
    """

    ok: bool
    reason: str
    gather_required: bool
    blockers: tuple[str, ...] = ()
    filter_only: bool = False


def vocab_parallel_eligibility(
    *,
    tp_size: int,
    vocab_size: int,
    strategy: SelectorCapabilities | None = None,
    attention_dp: bool = False,
    penalties: bool = False,
    logit_processors: bool = False,
    guided_decoding: bool = False,
    min_p: float = 0.0,
    head_has_bias: bool = False,
    head_quantized: bool = False,
    workspace_allocated: bool = True,
    wants_logits: bool = False,
    rejection_full_vocab: bool = False,
    reduced_draft_vocab: bool = False,
) -> VocabParallelEligibility:
    """Decide whether token selection may run on vocabulary shards.

    The sharded pair path needs: ``TP > 1`` without attention-DP; a ``strategy`` that declares
    a vocab-parallel path and, unless greedy, no filter (``None`` means greedy); no penalties,
    logit processors, guided decoding or min-p; a bias-free, unquantized head;
    ``V % TP == 0``; ``S % 4 == 0``; ``V < 2**24``; an exchange workspace allocated before
    capture; and none of the 5.7 gather triggers (the caller wants logits, rejection sampling
    with full-vocabulary probabilities, a reduced draft vocabulary). At ``TP == 1`` nothing is
    sharded: not ok, and no gather is needed.
    """
    if tp_size <= 1:
        return VocabParallelEligibility(False, "TP == 1: the full vocabulary is local", False)
    blockers: list[str] = []
    filters: list[str] = []
    if attention_dp:
        blockers.append("attention-DP is active (ranks own different requests)")
    if vocab_size % tp_size:
        blockers.append(f"V = {vocab_size} is not divisible by TP = {tp_size}")
    elif (vocab_size // tp_size) % 4:
        blockers.append(f"shard width S = {vocab_size // tp_size} is not a multiple of 4")
    if vocab_size >= MAX_EXACT_VOCAB:
        blockers.append(f"V = {vocab_size} >= 2**24: ids are not exact as fp32")
    kind, filt = _strategy_blockers(strategy)
    blockers.extend(kind)
    filters.extend(filt)
    for flag, why in (
        (penalties, "penalties are enabled"),
        (logit_processors, "logit post-processors are enabled"),
        (guided_decoding, "guided decoding is enabled"),
        (min_p > 0.0, f"min-p = {min_p} is enabled"),
        (head_has_bias, "the output head has a bias"),
        (head_quantized, "the output head is quantized"),
        (not workspace_allocated, "no exchange workspace was allocated before capture"),
        (wants_logits, "the caller asks for logits or log-probs"),
        (rejection_full_vocab, "rejection sampling needs full-vocabulary probabilities"),
        (reduced_draft_vocab, "a reduced draft vocabulary (d2t) is in use"),
    ):
        if flag:
            blockers.append(why)
    everything = tuple(filters + blockers)
    if everything:
        return VocabParallelEligibility(
            False, everything[0], True, everything, filter_only=bool(filters) and not blockers
        )
    return VocabParallelEligibility(
        True, f"TP = {tp_size}, S = {vocab_size // tp_size}: pair exchange eligible", False
    )


def gumbel_pairs_split_invariant(shard_width: int) -> bool:
    """Whether per-rank Gumbel pairs over even shards of ``shard_width`` draw the token one rank
    draws from the whole row: every shard border must fall on a group border, or the border
    cuts that group's draw in two (:mod:`draftsmith.kernels.gumbel_pair`)."""
    return shard_width % GROUP_SIZE == 0


def _strategy_blockers(strategy: SelectorCapabilities | None) -> tuple[list[str], list[str]]:
    """``(other blockers, filter blockers)`` of a strategy's declared capabilities."""
    if strategy is None or (strategy.greedy and strategy.vocab_parallel):
        return [], []
    if not strategy.vocab_parallel:
        if strategy.kind in ("greedy", "sample"):  # the built-ins have one: their config's off
            return ["selection.vocab_parallel is false"], []
        return [f"strategy {strategy.kind!r} does not declare a vocab-parallel path"], []
    return [], [f"{f} is enabled" for f in strategy.filters]


def selection_route(
    selection: GreedyConfig | SampleConfig | None,
    tp_size: int,
    vocab_size: int,
    eligibility: VocabParallelEligibility | None = None,
) -> SelectionRoute:
    """The route of a built-in strategy at this TP size (``eligibility`` from
    :func:`vocab_parallel_eligibility`; computed with default flags when ``None``)."""
    if tp_size <= 1:
        return SelectionRoute("local", "TP == 1: the full vocabulary is local")
    elig = eligibility or vocab_parallel_eligibility(
        tp_size=tp_size, vocab_size=vocab_size,
        strategy=capabilities_of(selection) if selection is not None else None,
    )
    greedy = selection is None or isinstance(selection, GreedyConfig) or (
        isinstance(selection, SampleConfig) and selection.temperature == 0.0
    )
    if elig.ok:
        if greedy:
            return SelectionRoute("pair_argmax", elig.reason)
        if not gumbel_pairs_split_invariant(vocab_size // tp_size):
            return SelectionRoute(
                "gather", f"gather logits: shard width S = {vocab_size // tp_size} is not a "
                f"multiple of the Gumbel group size {GROUP_SIZE}, and per-rank pairs would then "
                "draw another token than one rank does")
        return SelectionRoute("gumbel_pairs", elig.reason + " (temperature-only sampling)")
    if (
        elig.filter_only
        and isinstance(selection, SampleConfig)
        and 0 < selection.top_k <= min(MAX_TOPK_CANDIDATES, vocab_size // tp_size)
    ):
        return SelectionRoute(
            "topk_candidates",
            f"top-k = {selection.top_k}: {selection.top_k} candidates per rank, one all-gather "
            f"(exact; top-p applies within the top-k)",
        )
    return SelectionRoute("gather", f"gather logits: {elig.reason}")


__all__ = [
    "MAX_EXACT_VOCAB",
    "MAX_TOPK_CANDIDATES",
    "RouteKind",
    "SelectionRoute",
    "VocabParallelEligibility",
    "gumbel_pairs_split_invariant",
    "selection_route",
    "vocab_parallel_eligibility",
]
