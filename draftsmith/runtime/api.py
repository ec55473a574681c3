"""The text-in, text-out entry point: :func:`load_decoder` and :class:`Decoder`.

``load_decoder(config)`` loads the target (the embedded SmolLM2-135M-Instruct or a local Hugging
Face directory) and its tokenizer, loads the configured drafter, checks that the two fit, and
binds them. ``Decoder.generate(prompts)`` applies the chat template, decodes with speculation,
optionally re-decodes the same prompts with draftsmith's plain decoding (``K = 0``: the same
target path and selection, one token per round, captured in CUDA graphs where the speculative
rounds are), and reports text, the accepted length of every round, timings, tokens per second
for both, and exactness against plain decoding when selection is greedy. Both decoders are
prepared (cache sized, rounds captured) before anything is timed.

Example (the README's; a config path, or nothing for ``draftsmith generate``'s defaults)::

    from draftsmith.runtime.api import load_decoder

    decoder = load_decoder()                     # or load_decoder("spec.toml")
    report = decoder.generate(["What is 2 + 3?"], max_new_tokens=64)
    print(report.results[0].text, report.mean_accepted_length, report.exact)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftsmith.contract import (
    CheckpointError,
    Collectives,
    ConfigError,
    ParallelMapping,
    SingleRank,
    TargetInfo,
)
from draftsmith.parallel import active_collectives, rank_device
from draftsmith.runtime.bind import auto_k_max, bind, load_drafter
from draftsmith.runtime.buckets import bucket, row_buckets
from draftsmith.runtime.config import SpecConfig, parse_device, read_config_file
from draftsmith.runtime.costs import (
    AcceptanceEstimate,
    AcceptanceTally,
    CostProfile,
    DraftTokensChoice,
    RoundRates,
    RoundTimes,
    choose_draft_tokens,
    predict_rounds,
)
from draftsmith.runtime.decoder import GenerationResult, SpecDecoder
from draftsmith.runtime.head_layout import vocab_shard_range
from draftsmith.runtime.inputs import check_max_new_tokens, check_prompt_ids, check_prompt_texts
from draftsmith.runtime.plan import describe_selection
from draftsmith.runtime.rank_agreement import (
    RankDisagreementError,
    check_ranks_agree,
    check_ranks_start_alike,
    config_inputs,
    prompt_inputs,
    tokens_digest,
)
from draftsmith.runtime.registry import Registry, load_registry
from draftsmith.runtime.shipped import settle_drafter
from draftsmith.runtime.targets.hf import HFTarget

ProgressFn = Callable[[list[list[int]]], None]
"""Called after every decoding step with the tokens generated so far, one list per prompt."""


@dataclass(frozen=True)
class TextResult:
    """One prompt's speculative output."""

    prompt: str
    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]
    """Generated ids (stop token included when one ended the request)."""
    text: str
    """``tokens`` decoded, special tokens skipped."""
    accepted_lengths: tuple[int, ...]
    """Committed tokens of every verify round, bonus included."""
    finish_reason: str
    prefill_s: float
    decode_s: float
    plain_tokens: tuple[int, ...] | None = None
    """Plain decoding of the same prompt (when it was run)."""
    error: str | None = None
    """Why the request ended early when ``finish_reason`` is ``error`` (NaN logits)."""
    margins: tuple[tuple[float, float], ...] | None = None
    """Per token, the target's winning logit and its margin over the runner-up (speculative)."""
    plain_margins: tuple[tuple[float, float], ...] | None = None
    """The same for the plain decoding of this prompt."""

    @property
    def mean_accepted_length(self) -> float:
        """``tau`` of this prompt: mean committed tokens per round (bonus included)."""
        return sum(self.accepted_lengths) / max(len(self.accepted_lengths), 1)

    @property
    def exact(self) -> bool | None:
        """Token-for-token equal to plain decoding (``None`` when it was not run)."""
        return None if self.plain_tokens is None else self.tokens == self.plain_tokens

    @property
    def divergence(self) -> Divergence | None:
        """Where this prompt's speculative and plain outputs first differ, with the margin each
        path had there (``None`` when they agree or plain decoding was not run)."""
        if self.plain_tokens is None or self.tokens == self.plain_tokens:
            return None
        common = min(len(self.tokens), len(self.plain_tokens))
        at = next((i for i in range(common) if self.tokens[i] != self.plain_tokens[i]), common)
        return Divergence(at, _at(self.margins, at), _at(self.plain_margins, at))


@dataclass(frozen=True)
class Divergence:
    """The first token where speculative and plain decoding of one prompt part.

    ``spec`` and ``plain``: ``(winning logit, margin over the runner-up)`` of the target logits
    that chose that token in each path (``None`` where not recorded, or where one output ended
    first). ``steps`` says how many bf16 rounding steps of the winning logit the smaller margin
    is: a near-tie that rounding can flip is a few steps at most.
    """

    position: int
    spec: tuple[float, float] | None
    plain: tuple[float, float] | None

    @property
    def steps(self) -> float | None:
        """The smaller margin in bf16 steps (``2 ** (exponent - 7)``) of its winning logit."""
        pairs = [p for p in (self.spec, self.plain) if p is not None]
        if not pairs:
            return None
        return min(margin / bf16_step(top) for top, margin in pairs)

    def describe(self) -> str:
        """One line: the position and both margins."""
        parts = [f"first difference at generated token {self.position}"]
        for name, pair in (("speculative", self.spec), ("plain", self.plain)):
            if pair is not None:
                parts.append(f"{name}: top-2 margin {pair[1]:.4g} at logit {pair[0]:.4g} "
                             f"({pair[1] / bf16_step(pair[0]):.1f} bf16 steps)")
        return "; ".join(parts)


def _at(margins: tuple[tuple[float, float], ...] | None, i: int) -> tuple[float, float] | None:
    return margins[i] if margins is not None and i < len(margins) else None


def bf16_step(value: float) -> float:
    """The spacing of bf16 numbers at ``value`` (8 significant bits)."""
    return 2.0 ** (math.frexp(abs(value) or 1.0)[1] - 1 - 7)


@dataclass(frozen=True)
class GenerateReport:
    """Everything one :meth:`Decoder.generate` call measured."""

    results: list[TextResult]
    spec_seconds: float
    """Wall time of the speculative run (prefill included)."""
    plain_seconds: float | None
    """Wall time of plain decoding of the same prompts, or ``None``."""
    greedy: bool
    """Whether selection was greedy (exactness is only defined then)."""
    num_draft_tokens: int
    family: str
    baseline: str = ""
    """What the plain figure measured (names the decoding and whether it was graph-captured)."""
    draft_tokens_reason: str = ""
    """Why ``K`` is what it is: the cost model's figures for this batch's rows bucket, or the
    plan's ``num_draft_tokens`` decision for a fixed ``K``."""
    draft_tokens_auto: bool = False
    """``K`` was chosen by the cost model (``num_draft_tokens = "auto"``)."""
    speculation_off: bool = False
    """``K = 0`` (chosen or configured): the speculative run was plain decoding, so it ran
    once and its time stands for both."""
    selection: str = ""
    """The selection in words (:func:`~draftsmith.runtime.plan.describe_selection`): greedy, or
    the temperature, top-k, top-p and acceptance rule of sampling."""
    spec_rates: RoundRates | None = None
    """Under ``auto``: the cost model's tokens per second for the speculative run's rounds,
    predicted when ``K`` was chosen, against what they took (admission left out of both)."""
    plain_rates: RoundRates | None = None
    """The same for plain decoding's steps, when it ran (``K = 0`` chosen: the speculative
    run's)."""

    @property
    def num_tokens(self) -> int:
        """Tokens generated over all prompts."""
        return sum(len(r.tokens) for r in self.results)

    @property
    def accepted_lengths(self) -> list[int]:
        """Every round's accepted length, all prompts."""
        return [n for r in self.results for n in r.accepted_lengths]

    @property
    def mean_accepted_length(self) -> float:
        """``tau`` over all rounds of all prompts."""
        lengths = self.accepted_lengths
        return sum(lengths) / max(len(lengths), 1)

    @property
    def histogram(self) -> dict[int, int]:
        """Rounds per accepted length ``1 .. K + 1``."""
        hist = {n: 0 for n in range(1, self.num_draft_tokens + 2)}
        for n in self.accepted_lengths:
            hist[n] = hist.get(n, 0) + 1
        return hist

    @property
    def spec_tokens_per_s(self) -> float:
        """Generated tokens per second with speculation."""
        return self.num_tokens / self.spec_seconds if self.spec_seconds > 0 else 0.0

    @property
    def plain_tokens_per_s(self) -> float | None:
        """Generated tokens per second of plain decoding, or ``None``."""
        if self.plain_seconds is None:
            return None
        plain = sum(len(r.plain_tokens or ()) for r in self.results)
        return plain / self.plain_seconds if self.plain_seconds > 0 else 0.0

    @property
    def exact(self) -> bool | None:
        """All prompts equal plain greedy (``None`` unless greedy and plain decoding was run)."""
        if not self.greedy or self.plain_seconds is None:
            return None
        return all(r.exact for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (used by ``draftsmith generate --json``)."""
        return {
            "family": self.family,
            "num_draft_tokens": self.num_draft_tokens,
            "greedy": self.greedy,
            "num_tokens": self.num_tokens,
            "mean_accepted_length": self.mean_accepted_length,
            "accepted_length_histogram": {str(k): v for k, v in self.histogram.items()},
            "spec_seconds": self.spec_seconds,
            "spec_tokens_per_s": self.spec_tokens_per_s,
            "plain_seconds": self.plain_seconds,
            "plain_tokens_per_s": self.plain_tokens_per_s,
            "baseline": self.baseline,
            "draft_tokens_reason": self.draft_tokens_reason,
            "draft_tokens_auto": self.draft_tokens_auto,
            "speculation_off": self.speculation_off,
            "selection": self.selection,
            "cost_model": {name: None if rates is None else {
                "draft_tokens": rates.draft_tokens,
                "rounds": rates.rounds,
                "predicted_tokens_per_s": rates.predicted_tokens_per_s,
                "measured_tokens_per_s": rates.measured_tokens_per_s,
                "predicted_over_measured": rates.ratio,
                "source": rates.source,
            } for name, rates in (("spec", self.spec_rates), ("plain", self.plain_rates))},
            "exact": self.exact,
            "results": [
                {
                    "prompt": r.prompt,
                    "text": r.text,
                    "tokens": list(r.tokens),
                    "accepted_lengths": list(r.accepted_lengths),
                    "mean_accepted_length": r.mean_accepted_length,
                    "finish_reason": r.finish_reason,
                    "error": r.error,
                    "divergence": (None if r.divergence is None else {
                        "position": r.divergence.position, "spec": r.divergence.spec,
                        "plain": r.divergence.plain, "bf16_steps": r.divergence.steps}),
                    "prefill_s": r.prefill_s,
                    "decode_s": r.decode_s,
                    "exact": r.exact,
                }
                for r in self.results
            ],
        }


@dataclass
class Decoder:
    """A bound speculative decoder plus the tokenizer: text in, :class:`GenerateReport` out."""

    spec: SpecDecoder
    target: HFTarget
    tokenizer: Any
    config: SpecConfig
    stop_token_ids: tuple[int, ...] = field(default=())
    _plain: SpecDecoder | None = field(default=None, repr=False)
    _by_bucket: dict[tuple[int, int], SpecDecoder] = field(default_factory=dict, repr=False)
    """Under ``num_draft_tokens = "auto"``: decoders bound so far, by ``(rows bucket, K)``."""
    _tally: AcceptanceTally | None = field(default=None, repr=False)
    """Under ``auto``: accepted lengths counted online, per position."""
    _prior: AcceptanceEstimate | None = field(default=None, repr=False)
    """Under ``auto``: the acceptance the first plan was chosen on (the online estimate's
    prior)."""
    _profile: CostProfile | None = field(default=None, repr=False)
    """Under ``auto``: the cost profile the first plan was chosen on (what :attr:`_times`
    corrects)."""
    _times: RoundTimes | None = field(default=None, repr=False)
    """Under ``auto``: the wall time of the rounds every call took, per rows bucket and ``K``
    (plain decoding's steps as ``K = 0``)."""
    _chosen: tuple[CostProfile, AcceptanceEstimate, DraftTokensChoice] | None = field(
        default=None, repr=False)
    """Under ``auto``: the corrected profile, the acceptance and the choice of the last
    :meth:`spec_for` (what a call's predicted rates are computed from)."""

    def spec_for(self, num_requests: int) -> SpecDecoder:
        """The decoder for a batch of ``num_requests``: :attr:`spec` for a fixed ``K``; under
        ``auto``, the cost model's ``K`` for the batch's rows bucket, from the bind-time profile
        corrected by the round times measured so far (``RoundTimes.corrected``) and the
        acceptance measured so far (bound on first use, then kept; it becomes :attr:`spec`).
        Requests stay on that ``K`` until the call ends."""
        plan = self.spec.plan
        if plan.cost_profile is None or plan.acceptance_estimate is None:
            return self.spec
        capacity = plan.slot_capacity
        rows = bucket(min(num_requests, capacity), row_buckets(capacity))
        if self._tally is None:
            self._tally = AcceptanceTally(plan.cost_profile.k_max)
            self._prior = plan.acceptance_estimate
            self._profile = plan.cost_profile
            self._times = RoundTimes()
            self._by_bucket[(plan.draft_tokens_rows, plan.num_draft_tokens)] = self.spec
        assert self._prior is not None and self._profile is not None and self._times is not None
        estimate = self._tally.estimate(self._prior)
        costs = self._times.corrected(self._profile)
        k_max = auto_k_max(self.spec.drafter.capabilities)  # bind's limit: a profile may go past it
        choice = next(c for c in choose_draft_tokens(costs, estimate, k_max) if c.rows == rows)
        self._chosen = (costs, estimate, choice)
        key = (rows, choice.draft_tokens)
        if key not in self._by_bucket:
            self._by_bucket[key] = bind(self.target, self.spec.drafter, self.config,
                                        collectives=self.spec.collectives,
                                        profile=costs, acceptance=estimate, rows=rows)
        self.spec = self._by_bucket[key]
        return self.spec

    def _learn(self, spec: SpecDecoder, plain: SpecDecoder | None
               ) -> tuple[RoundRates | None, RoundRates | None]:
        """Under ``auto``, after a call: the predicted and measured rates of its speculative
        rounds and of ``plain``'s steps (when that ran), from the model the call's ``K`` was
        chosen on; then the rounds go into the online round times."""
        if self._chosen is None or self._times is None:
            return None, None
        costs, estimate, _ = self._chosen
        k = spec.plan.num_draft_tokens
        spec_rates = predict_rounds(costs, estimate, k, spec.rounds)
        self._times.add(k, spec.rounds)
        if k == 0:  # the speculative run was plain decoding
            return spec_rates, spec_rates
        if plain is None:
            return spec_rates, None
        plain_rates = predict_rounds(costs, estimate, 0, plain.rounds)
        self._times.add(0, plain.rounds)
        return spec_rates, plain_rates

    @property
    def greedy(self) -> bool:
        """Whether the configured selection is greedy."""
        return self.spec.plan.greedy

    @property
    def plain(self) -> SpecDecoder:
        """The baseline: the same target, selection and runtime with ``K = 0`` (bound on first
        use; it shares the target's cache with :attr:`spec`, one call at a time)."""
        if self._plain is None:
            # plain decoding drafts nothing: there is nothing to schedule
            runtime = self.config.runtime.model_copy(update={"verify_schedule": "all",
                                                             "verify_budget": None})
            config = self.config.model_copy(update={"num_draft_tokens": 0, "runtime": runtime})
            self._plain = bind(self.target, self.spec.drafter, config,
                               collectives=self.spec.collectives)
        return self._plain

    @property
    def baseline(self) -> str:
        """Names the plain decoding the speed-up is measured against."""
        how = ("its round captured in CUDA graphs" if self.plain.plan.cuda_graphs
               else "eager, " + self.plain.plan.decision("cuda_graphs").reason)
        return f"draftsmith plain decoding (K = 0, same target path, {how})"

    def encode(self, prompt: str, chat: bool = True) -> list[int]:
        """Token ids of ``prompt`` (:func:`encode_text` with this decoder's tokenizer)."""
        return encode_text(self.tokenizer, prompt, chat)

    def decode(self, tokens: Sequence[int]) -> str:
        """Text of ``tokens`` with special tokens skipped."""
        return str(self.tokenizer.decode(list(tokens), skip_special_tokens=True))

    def generate(
        self,
        prompts: Sequence[str],
        max_new_tokens: int = 128,
        *,
        chat: bool = True,
        compare_plain: bool = True,
        seeds: Sequence[int] | None = None,
        progress: ProgressFn | None = None,
    ) -> GenerateReport:
        """Decode ``prompts`` with speculation; with ``compare_plain`` also with plain greedy.

        Generation stops at the tokenizer's end-of-sequence ids or after ``max_new_tokens``.
        """
        prompts = check_prompt_texts(prompts)
        check_max_new_tokens(max_new_tokens, len(prompts))
        ids = [self.encode(p, chat) for p in prompts]
        for i, p in enumerate(ids):
            if not p:
                raise ConfigError(f"prompt {i} encodes to no tokens; give it some text")
        return self.generate_ids(ids, max_new_tokens, prompts=prompts,
                                 compare_plain=compare_plain, seeds=seeds, progress=progress)

    def generate_ids(
        self,
        prompt_ids: Sequence[Sequence[int]],
        max_new_tokens: int = 128,
        *,
        prompts: Sequence[str] | None = None,
        compare_plain: bool = True,
        seeds: Sequence[int] | None = None,
        progress: ProgressFn | None = None,
    ) -> GenerateReport:
        """:meth:`generate` on token ids (no chat template)."""
        ids = check_prompt_ids(prompt_ids, self.target.vocab_size)
        check_max_new_tokens(max_new_tokens, len(ids))
        check_ranks_start_alike(self.spec.collectives, {
            **prompt_inputs(ids), "max_new_tokens": max_new_tokens,
            "seeds": None if seeds is None else [str(s) for s in seeds],
            "compare_plain": compare_plain, "stop_token_ids": list(self.stop_token_ids),
        }, self.target.device)
        stops = list(self.stop_token_ids)
        spec = self.spec_for(len(ids))
        off = spec.plan.num_draft_tokens == 0
        # untimed: size the caches and capture the rounds of both decoders first
        spec.prepare_for(ids, max_new_tokens)
        if compare_plain and not off:
            self.plain.prepare_for(ids, max_new_tokens)
        start = time.perf_counter()
        raw = spec.generate(ids, max_new_tokens, stops, seeds, progress=progress)
        spec_seconds = time.perf_counter() - start
        plain: list[GenerationResult] | None = None
        plain_seconds = None
        if compare_plain and off:  # K = 0 is plain decoding: the one run stands for both
            plain, plain_seconds = raw, spec_seconds
        elif compare_plain:
            start = time.perf_counter()
            plain = self.plain.generate(ids, max_new_tokens, stops, seeds)
            plain_seconds = time.perf_counter() - start
        spec_rates, plain_rates = self._learn(
            spec, self.plain if compare_plain and not off else None)
        if self._tally is not None and not off and spec.plan.acceptance != "forced":
            for r in raw:
                self._tally.add(r.accepted_lengths, spec.plan.num_draft_tokens)
        check_ranks_agree(self.spec.collectives, [r.tokens for r in raw], "speculative",
                          self.target.device)
        if plain is not None:
            check_ranks_agree(self.spec.collectives, [r.tokens for r in plain], "plain",
                              self.target.device)
        texts = prompts if prompts is not None else [self.decode(p) for p in ids]
        results = [
            TextResult(
                prompt=texts[i], prompt_ids=tuple(ids[i]), tokens=r.tokens,
                text=self.decode(r.tokens), accepted_lengths=r.accepted_lengths,
                finish_reason=r.finish_reason, prefill_s=r.prefill_s, decode_s=r.decode_s,
                error=r.error, margins=r.margins,
                plain_tokens=plain[i].tokens if plain is not None else None,
                plain_margins=plain[i].margins if plain is not None else None,
            )
            for i, r in enumerate(raw)
        ]
        return GenerateReport(
            results=results, spec_seconds=spec_seconds, plain_seconds=plain_seconds,
            greedy=self.greedy, num_draft_tokens=spec.plan.num_draft_tokens,
            family=self.config.drafter.family,
            baseline=(("the speculative run itself (K = 0 is plain decoding)" if off
                       else self.baseline) if compare_plain else ""),
            draft_tokens_reason=(self._chosen[2].reason if self._chosen is not None else
                                 spec.plan.decision("num_draft_tokens").reason),
            draft_tokens_auto=spec.plan.draft_tokens_mode == "auto",
            speculation_off=off,
            selection=describe_selection(spec.selector.capabilities),
            spec_rates=spec_rates, plain_rates=plain_rates,
        )


def encode_text(tokenizer: Any, prompt: str, chat: bool = True) -> list[int]:
    """Token ids of ``prompt``: the chat template (first turn, generation prompt,
    ``enable_thinking=False`` where the template knows it) when ``chat`` and the tokenizer has
    one, else the plain encoding."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            tokenize=True,
            enable_thinking=False,
        )
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    return [int(i) for i in tokenizer.encode(prompt)]


def _stop_ids(tokenizer: Any, target: HFTarget) -> tuple[int, ...]:
    ids: set[int] = set()
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        ids.add(int(eos))
    gen = getattr(target.model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(extra, int):
        ids.add(extra)
    elif extra:
        ids.update(int(i) for i in extra)
    return tuple(sorted(ids))


def decoder_config(
    config: SpecConfig | str | Path | None = None,
    *,
    random_drafter: bool = False,
    registry: Registry | None = None,
) -> SpecConfig:
    """The config :func:`load_decoder` runs for these arguments, found without loading anything.

    A path, or ``None`` for the defaults, is read as ``draftsmith generate --config`` reads it
    (the same rule, :func:`~draftsmith.runtime.shipped.settle_drafter`): without a
    ``drafter.checkpoint``, the family's shipped drafter for the embedded target, or an error
    where there is none. A :class:`SpecConfig` is taken as it is (no checkpoint: random weights).
    ``random_drafter`` builds random weights in either case.
    """
    if not isinstance(config, SpecConfig):
        data = read_config_file(config) if config is not None else {}
        return settle_drafter(SpecConfig.from_dict(data, registry), random_drafter=random_drafter)
    return settle_drafter(config, random_drafter=True) if random_drafter else config


def load_decoder(
    config: SpecConfig | str | Path | None = None,
    *,
    random_drafter: bool = False,
    target: HFTarget | None = None,
    tokenizer: Any = None,
    log: Callable[[str], None] | None = None,
    collectives: Collectives | None = None,
) -> Decoder:
    """Load target, tokenizer and drafter for ``config`` and bind them.

    Under tensor parallelism (``collectives`` of more than one rank; by default the initialised
    torch.distributed group, as under ``torchrun``) every rank calls this: ``parallel`` is taken
    from the group, each rank loads the whole target and keeps only its even column shard of
    the LM head (:meth:`HFTarget.shard_vocab`; the head stays whole where ``V`` does not split,
    and the plan says so), the drafter is loaded with the group, and every generation checks
    that all ranks emitted the same tokens.

    :param config: a TOML/JSON config path, or ``None`` for the defaults, read as ``draftsmith
        generate --config`` reads it (:func:`decoder_config`; ``None``: SmolLM2-135M-Instruct in
        fp32 with the shipped bf16 ``dspark-gqa`` drafter, greedy, ``K = 7``, as ``draftsmith
        generate`` runs); or a :class:`SpecConfig`, taken as it is (no checkpoint: random
        weights).
    :param random_drafter: build the drafter with random weights (``--random-drafter``).
    :param target: an already built target (with ``tokenizer``) instead of ``config.target``.
    :param log: called with one line per loading stage.
    :param collectives: the tensor-parallel group (``None``: torch.distributed's, if started
        with more than one rank, else one process).
    :raises DraftsmithError: for a missing model directory, a checkpoint made for another target,
        or an impossible plan; the message says what to change.
    """
    registry = load_registry()  # one registry: config validation and bind share its hooks
    config = decoder_config(config, random_drafter=random_drafter, registry=registry)
    say = log or (lambda _m: None)
    collectives = collectives if collectives is not None else active_collectives()
    collectives = collectives if collectives is not None else SingleRank()
    tp, rank = collectives.world_size, collectives.rank
    if tp > 1 and config.parallel.tp_size in (1, tp):
        config = config.model_copy(update={"parallel": ParallelMapping(
            tp_size=tp, tp_rank=rank, attention_dp=config.parallel.attention_dp)})
    if tp > 1:
        _check_rank_device(config.target.device, rank)
        # before anything loads: ranks of other configs would load other models and wait for
        # each other in different collectives
        check_ranks_start_alike(collectives, config_inputs(config), rank_device())
    if target is None:
        from draftsmith.runtime.targets.smollm2 import load_target

        say(f"loading target {config.target.model}")
        target, tokenizer = load_target(
            config.target, max_slots=max(64, config.runtime.max_batch + 2), log=log,
            tp_size=tp,
        )
    elif tokenizer is None:
        raise ConfigError("load_decoder got a target without its tokenizer")
    if tp > 1:
        _shard_head(target, config.parallel, say)
    info = TargetInfo(vocab_size=target.vocab_size, hidden_size=target.hidden_size,
                      num_layers=target.num_layers, dtype=target.dtype)
    source = config.drafter.checkpoint or f"random weights (seed {config.drafter.seed})"
    say(f"loading drafter {config.drafter.family} from {source}"
        + (" (K = 0: it never runs)" if config.num_draft_tokens == 0 else ""))
    if config.drafter.checkpoint is None and config.num_draft_tokens != 0:
        say("  untrained: it will accept next to nothing")
    if config.drafter.checkpoint is not None and not Path(config.drafter.checkpoint).is_dir():
        raise CheckpointError(
            f"drafter checkpoint {str(config.drafter.checkpoint)!r} is not a directory; pass a "
            "directory with config.json and *.safetensors"
        )
    # load_drafter checks that the drafter fits the target before any weight loads
    drafter = load_drafter(config, info, registry, collectives, target.device)
    spec = bind(target, drafter, config, registry=registry, collectives=collectives)
    return Decoder(spec=spec, target=target, tokenizer=tokenizer, config=config,
                   stop_token_ids=_stop_ids(tokenizer, target))


def _check_rank_device(device: str, rank: int) -> None:
    """Under TP every rank reads the same ``target.device``: a CUDA index there would put every
    rank on one GPU, so it is refused on every rank alike; ``cuda`` (each rank's own, selected
    when its group started) passes."""
    wanted = parse_device(device)
    if wanted is not None and wanted.type == "cuda" and wanted.index is not None:
        raise ConfigError(
            f"target.device {device!r} under tensor parallelism: every rank would use that one "
            f"GPU; pass 'cuda' (rank {rank} then uses its own, cuda:{rank} under torchrun)"
        )


def _shard_head(target: HFTarget, mapping: ParallelMapping, say: Callable[[str], None]) -> None:
    """Keep this rank's even column shard of a whole LM head; leave it whole (replicated) where
    ``V`` does not split, for the plan to record. A head already sharded is left as it is."""
    v, tp, rank = target.vocab_size, mapping.tp_size, mapping.tp_rank
    if target.vocab_shard != (0, v):
        return
    split = vocab_shard_range(v, tp, rank)
    if split is None:
        say(f"TP = {tp}: V = {v} does not split into {tp} even shards; the LM head stays whole "
            "on every rank")
        return
    target.shard_vocab(rank, tp)
    layers = ("split by transformers' tensor-parallel plan" if target.layers_split
              else "whole on every rank")
    say(f"TP = {tp}: rank {rank} keeps LM head rows {split[0]}..{split[0] + split[1] - 1} of "
        f"V = {v}; the decoder layers are {layers}")


__all__ = [
    "Decoder",
    "Divergence",
    "bf16_step",
    "GenerateReport",
    "RankDisagreementError",
    "TextResult",
    "check_ranks_agree",
    "check_ranks_start_alike",
    "decoder_config",
    "encode_text",
    "load_decoder",
    "tokens_digest",
]
