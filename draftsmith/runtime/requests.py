"""What :meth:`~draftsmith.runtime.decoder.SpecDecoder.generate` is asked for and what it
returns: the checks of a call's prompts, budgets, stop tokens and seeds (:func:`make_requests`),
each request's bookkeeping while it runs (``_Request``: its slot, tokens, and the budget and
stop rules) and its result (:class:`GenerationResult`).

Every input is checked before the first admission: a bad one raises :class:`ConfigError`
naming the prompt, and no slot is taken. Hot path: must not import pluggy, the registry or bind.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from draftsmith.contract import ConfigError, TargetModel, target_extras
from draftsmith.runtime.inputs import check_positions
from draftsmith.runtime.plan import DraftPlan


@dataclass(frozen=True)
class GenerationResult:
    """One request's output.

    ``tokens``: generated ids (the first comes from the prefill); ``accepted_lengths``: per
    verify round, the committed tokens including the bonus, cut at the first stop token and at the
    budget; ``finish_reason``: ``stop``, ``length``, or ``error`` (then
    ``error`` says why: the target's logits held NaN where it chose the next token, and that
    token was not emitted).
    """

    tokens: tuple[int, ...]
    accepted_lengths: tuple[int, ...]
    finish_reason: str
    prefill_s: float
    decode_s: float
    error: str | None = None
    margins: tuple[tuple[float, float], ...] | None = None
    """Per generated token, the target's winning logit and its margin over the runner-up, as
    the path that chose it computed them (``None`` unless ``plan.record_margins``)."""

    @property
    def mean_accepted_length(self) -> float:
        """``tau``: mean committed tokens per round (bonus included)."""
        return sum(self.accepted_lengths) / max(len(self.accepted_lengths), 1)


@dataclass
class _Request:
    """One request while it runs: its slot, the tokens kept so far under its budget and stop
    tokens, and its timings."""

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
    margins: list[tuple[float, float]] = field(default_factory=list)
    finish: str = ""
    error: str | None = None
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

    def fail_on_nan(self) -> None:
        """End the request without the token its target logits chose (they held NaN)."""
        self.finish = "error"
        self.error = (f"the target's logits held NaN where it chose token {len(self.tokens)} "
                      "of this request; it ends there (a NaN means the target or its input is "
                      "broken, see docs/input-rules.md)")


def _token_ids(what: str, ids: Iterable[object], vocab_size: int) -> list[int]:
    """``ids`` as a list of ints, each in ``0..vocab_size-1``; :class:`ConfigError` naming
    ``what`` otherwise (an out-of-range id would index the embedding out of bounds)."""
    ids = list(ids)
    if any(_on_meta(t) for t in ids):
        raise ConfigError(f"{what} are on the meta device, which holds shapes but no values; "
                          "pass token ids on the CPU (or on a device that holds them)")
    try:
        out = [operator.index(t) for t in ids]
    except TypeError:
        raise ConfigError(f"{what} must be integer token ids") from None
    bad = [t for t in out if not 0 <= t < vocab_size]
    if bad:
        raise ConfigError(f"{what} hold {bad[:4]}, outside the vocabulary 0..{vocab_size - 1}")
    return out


def _on_meta(value: object) -> bool:
    """A tensor without data: reading its value raises inside torch."""
    return getattr(value, "is_meta", False) is True


def make_requests(plan: DraftPlan, target: TargetModel, default_seed: int,
                  prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int],
                  stop_token_ids: Sequence[int] | Sequence[Sequence[int]] | None,
                  seeds: Sequence[int] | None) -> list[_Request]:
    """A :meth:`~draftsmith.runtime.decoder.SpecDecoder.generate` call's arguments as checked
    requests (:class:`ConfigError` naming what to change otherwise); the seed of request ``i``
    is ``default_seed + i`` when the call gives none."""
    n = len(prompts)
    if not n:
        raise ConfigError("no prompts given; pass at least one prompt")
    budgets = [max_new_tokens] * n if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if stop_token_ids is None:
        stops: list[frozenset[int]] = [frozenset()] * n
    elif all(isinstance(x, int) for x in stop_token_ids):
        stops = [frozenset(stop_token_ids)] * n  # type: ignore[arg-type]
    else:
        stops = [frozenset(s) for s in stop_token_ids]  # type: ignore[arg-type]
    seed_list = list(seeds) if seeds is not None else [default_seed + i for i in range(n)]
    if not len(budgets) == len(stops) == len(seed_list) == n:
        raise ConfigError("max_new_tokens, stop_token_ids and seeds need one entry per prompt")
    vocab = plan.vocab_size
    stops = [frozenset(_token_ids(f"stop token ids of prompt {i}", s, vocab))
             for i, s in enumerate(stops)]
    for i, seed in enumerate(seed_list):
        try:
            seed_list[i] = seed = None if _on_meta(seed) else operator.index(seed)
        except TypeError:
            seed = None
        if seed is None or not 0 <= seed < 2**63:
            raise ConfigError(
                f"the seed of prompt {i} must be an int in 0..2**63-1, got {seed_list[i]!r}"
                + ("" if seeds is not None else " (the default is selection.seed plus the "
                   "prompt index: lower selection.seed)"))
    # checked here, before admission: the target itself would refuse mid-generation
    target_limit = target_extras(target).max_position_embeddings
    out = []
    for i, prompt in enumerate(prompts):
        if not len(prompt):
            raise ConfigError(f"prompt {i} is empty")
        prompt = _token_ids(f"prompt {i}", prompt, vocab)
        if budgets[i] < 1:
            raise ConfigError(f"max_new_tokens of prompt {i} must be >= 1")
        check_positions(f"prompt {i} ({len(prompt)} tokens)", len(prompt), budgets[i],
                        plan.num_draft_tokens, plan.max_ctx, target_limit)
        out.append(_Request(i, prompt, budgets[i], stops[i], seed_list[i]))
    return out


__all__ = ["GenerationResult", "make_requests"]
