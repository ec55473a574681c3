"""Choosing ``K`` from measured costs: the bind-time cost profile, the drafter's acceptance, and
the choice per batch-size bucket.

Owns :class:`CostProfile` (seconds of one decoding round per rows bucket and ``K``, measured on
the bound target and device), :class:`AcceptanceEstimate` (per-position acceptance, from a prior
or measured online), :class:`AcceptanceTally` (the online counts), :class:`DraftTokensChoice`
and :func:`choose_draft_tokens`, the arithmetic::

    rate(rows, K) = rows * E[tokens per round | K] / t_round(rows, K)    (tokens per second)
    rate(rows, 0) = rows / t_step(rows)                                  (plain decoding)
    E[tokens per round | K] = 1 + sum_{j=1..K} prod_{i<=j} p_i

``K`` is the argmax of ``rate``; a ``K > 0`` is taken only when it beats plain decoding by
:data:`MIN_SPEEDUP`, otherwise ``K = 0`` (speculation off). :func:`profile_rounds` times rounds
of already bound decoders; it must not import ``bind`` or pluggy.

``t_round`` is corrected online: :class:`RoundTimes` keeps the wall time of the rounds a run
took (host work included: what tokens per second pays), :meth:`RoundTimes.corrected` puts their
medians into the profile (:class:`MeasuredRound`), and :meth:`CostProfile.round_seconds` reads a
measured time where there is one, else the profiled time scaled by what was measured beside it.
:func:`predict_rounds` says what the model expected of the rounds a run took, against what they
took (:class:`RoundRates`).
"""

from __future__ import annotations

import functools
import json
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from draftsmith.contract import CheckpointError, ConfigError

_FROZEN = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

MIN_SPEEDUP = 1.05
"""Expected gain over plain decoding a ``K > 0`` must promise to be chosen: the profile and the
acceptance are estimates, and speculation must never run slower than plain decoding."""

DEFAULT_ACCEPTANCE = 0.5
"""Conservative per-position acceptance used when nothing better is known (no recorded prior
in the checkpoint, nothing measured yet)."""

PRIOR_ROUNDS = 8
"""Weight of the prior in the online estimate, in rounds: after ``n`` rounds that reached
position ``j``, ``p_j = (accepted_j + PRIOR_ROUNDS * prior_j) / (reached_j + PRIOR_ROUNDS)``."""

PRIOR_KEY = "draftsmith_acceptance"
"""Key of a checkpoint's ``config.json`` that records a measured acceptance prior:
``{"conditional": [p_1, ..., p_K], "source": "how it was measured"}``."""

PROFILE_CANDIDATES = (0, 1, 2, 3, 4, 6, 8)
"""``K`` values whose rounds :func:`profile_rounds` times (those up to ``K_max``, plus ``K_max``);
the others are interpolated linearly between their measured neighbours."""


class _Checked(BaseModel):
    """Construction errors surface as :class:`ConfigError` (one line per problem)."""

    model_config = _FROZEN

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            lines = [f"{'.'.join(str(p) for p in e['loc'])}: " * bool(e["loc"])
                     + e["msg"].removeprefix("Value error, ") for e in exc.errors()]
            raise ConfigError(f"{type(self).__name__}: " + "; ".join(lines)) from None


MIN_MEASURED_ROUNDS = 8
"""Rounds a run must have taken at one (rows bucket, ``K``) before their median replaces the
profiled time there: fewer are too easily one stall."""

ROUND_WINDOW = 128
"""Rounds per (rows bucket, ``K``) whose median stands for it: the latest this many, so the
figure follows the contexts the runs now reach (attention costs grow with each token's
position) and forgets the first rounds after a capture."""


class MeasuredRound(_Checked):
    """The median wall time of the rounds runs took at one (rows bucket, ``K``)."""

    model_config = _FROZEN

    rows: int = Field(ge=1)
    """The rows bucket."""
    draft_tokens: int = Field(ge=0)
    """``K`` of those rounds (0: plain decoding steps)."""
    seconds: float = Field(gt=0)
    """Median wall seconds of one round, host work included (``SpecDecoder.step``)."""
    rounds: int = Field(ge=1)
    """Rounds behind the median (the latest :data:`ROUND_WINDOW` at most)."""


class CostProfile(_Checked):
    """Seconds of one decoding round, per rows bucket and ``K`` (``K = 0``: the plain step):
    measured at bind (:func:`profile_rounds`), corrected by the rounds runs took
    (:attr:`measured`). Frozen and hashable, so a plan can hold it."""

    model_config = _FROZEN

    rows: tuple[int, ...]
    """Rows buckets measured, ascending."""
    draft_tokens: tuple[int, ...]
    """``K`` values measured, ascending, starting at 0."""
    seconds: tuple[tuple[float, ...], ...]
    """``seconds[i][j]``: one round over ``rows[i]`` rows at ``K = draft_tokens[j]``."""
    context_width: int = Field(ge=1)
    """Context columns the rounds attended to."""
    method: str
    """How the rounds were timed (eager or graph replays, repeats, statistic)."""
    measured: tuple[MeasuredRound, ...] = ()
    """Medians of the rounds runs took (:meth:`RoundTimes.corrected`), at most one per (rows,
    ``K``): each replaces the profiled time of its (rows, ``K``) and scales the other ``K`` of
    its bucket (:meth:`round_seconds`)."""

    def model_post_init(self, _context: object) -> None:
        if not self.rows or list(self.rows) != sorted(set(self.rows)):
            raise ValueError(f"cost profile rows {self.rows} must be ascending and distinct")
        ks = self.draft_tokens
        if not ks or ks[0] != 0 or list(ks) != sorted(set(ks)):
            raise ValueError(f"cost profile K values {ks} must be ascending, distinct, from 0")
        if len(self.seconds) != len(self.rows) or any(
                len(row) != len(ks) or any(not s > 0 for s in row) for row in self.seconds):
            raise ValueError("cost profile seconds must hold one positive time per (rows, K)")
        keys = [(m.rows, m.draft_tokens) for m in self.measured]
        if len(set(keys)) != len(keys):
            raise ValueError(f"measured rounds {keys} must hold one entry per (rows, K)")
        for g, k in keys:
            if g not in self.rows or not 0 <= k <= ks[-1]:
                raise ValueError(f"measured rounds at {g} rows, K = {k} lie outside the "
                                 f"profile (rows {self.rows}, K 0..{ks[-1]})")

    @property
    def k_max(self) -> int:
        """The largest ``K`` profiled."""
        return self.draft_tokens[-1]

    def profiled_seconds(self, rows: int, k: int) -> float:
        """Seconds of one round over ``rows`` (a profiled bucket) at ``K = k`` as profiled at
        bind: timed where ``k`` was profiled, linear between the profiled neighbours otherwise."""
        if rows not in self.rows:
            raise ConfigError(f"rows {rows} was not profiled (profiled: {self.rows})")
        if not 0 <= k <= self.k_max:
            raise ConfigError(f"K = {k} lies outside the profiled 0..{self.k_max}")
        times = self.seconds[self.rows.index(rows)]
        if k in self.draft_tokens:
            return times[self.draft_tokens.index(k)]
        hi = next(i for i, x in enumerate(self.draft_tokens) if x > k)
        k0, k1 = self.draft_tokens[hi - 1], self.draft_tokens[hi]
        t0, t1 = times[hi - 1], times[hi]
        return t0 + (t1 - t0) * (k - k0) / (k1 - k0)

    def round_seconds(self, rows: int, k: int) -> float:
        """Seconds of one round over ``rows`` (a profiled bucket) at ``K = k``: the median runs
        measured there when :attr:`measured` has it; else :meth:`profiled_seconds` times the
        measured-to-profiled ratio of the nearest measured ``K`` of the same bucket
        (:meth:`_scale`), or as profiled where the bucket has no measurement."""
        profiled = self.profiled_seconds(rows, k)
        found = self._measured_at(rows, k)
        if found is not None:
            return found.seconds
        scale = self._scale(rows, k)
        return profiled if scale is None else profiled * scale[0]

    def source(self, rows: int, k: int) -> str:
        """Where :meth:`round_seconds` ``(rows, k)`` comes from, in words."""
        found = self._measured_at(rows, k)
        if found is not None:
            return f"measured, median of {found.rounds} rounds"
        how = "profiled" if k in self.draft_tokens else "interpolated between profiled K"
        scale = self._scale(rows, k)
        if scale is None:
            return how
        ratio, near = scale
        return f"{how} x {ratio:.2f}, the measured / profiled ratio at K = {near.draft_tokens}"

    def _measured_at(self, rows: int, k: int) -> MeasuredRound | None:
        return next((m for m in self.measured if (m.rows, m.draft_tokens) == (rows, k)), None)

    def _scale(self, rows: int, k: int) -> tuple[float, MeasuredRound] | None:
        """``(measured / profiled, the entry)`` of the measured ``K`` of bucket ``rows`` nearest
        to ``k`` (ties: the smaller); for a ``K > 0`` the plain step's counts only when no
        ``K > 0`` of the bucket was measured (a round that drafts is not a plain step).
        ``None`` when the bucket has no measurement."""
        same = [m for m in self.measured if m.rows == rows]
        if k > 0 and any(m.draft_tokens > 0 for m in same):
            same = [m for m in same if m.draft_tokens > 0]
        if not same:
            return None
        near = min(same, key=lambda m: (abs(m.draft_tokens - k), m.draft_tokens))
        return near.seconds / self.profiled_seconds(rows, near.draft_tokens), near


class AcceptanceEstimate(_Checked):
    """Per-position acceptance of the drafter: ``conditional[j - 1] = P(draft j accepted |
    drafts 1 .. j - 1 accepted)``, and where the numbers came from."""

    model_config = _FROZEN

    conditional: tuple[float, ...]
    """``p_1 .. p_Kmax``, each in ``[0, 1]``."""
    source: str
    """``checkpoint config.json``, the conservative default, or online measurement (rounds)."""
    rounds: int = Field(default=0, ge=0)
    """Verify rounds measured online behind it (0: a prior only)."""

    def model_post_init(self, _context: object) -> None:
        if any(not 0.0 <= p <= 1.0 for p in self.conditional):
            raise ValueError(f"acceptance probabilities {self.conditional} must lie in [0, 1]")

    def expected_tokens(self, k: int) -> float:
        """``E[tokens committed per round | K = k]`` (bonus included): ``1 + sum_{j<=k}
        prod_{i<=j} p_i``; positions past the recorded ones take the last one's ``p``."""
        if k < 0:
            raise ConfigError(f"K must be >= 0, got {k}")
        total, survive = 1.0, 1.0
        for j in range(k):
            p = self.conditional[min(j, len(self.conditional) - 1)] if self.conditional else 0.0
            survive *= p
            total += survive
        return total


class DraftTokensChoice(BaseModel):
    """``K`` chosen for one rows bucket, with the figures behind it."""

    model_config = _FROZEN

    rows: int = Field(ge=1)
    """The rows bucket."""
    draft_tokens: int = Field(ge=0)
    """``K`` chosen (0: plain decoding, speculation off)."""
    tokens_per_s: float
    """Expected tokens per second at that ``K``."""
    plain_tokens_per_s: float
    """Expected (measured) tokens per second of plain decoding."""
    reason: str
    """The comparison, in words."""


def choose_draft_tokens(profile: CostProfile, acceptance: AcceptanceEstimate,
                        k_max: int | None = None,
                        min_speedup: float = MIN_SPEEDUP) -> tuple[DraftTokensChoice, ...]:
    """The best ``K`` in ``0 .. k_max`` (default: the profile's) for every profiled rows bucket.

    A ``K > 0`` wins only when its expected rate is at least ``min_speedup`` times plain
    decoding's; ties go to the smaller ``K``.
    """
    k_max = profile.k_max if k_max is None else min(k_max, profile.k_max)
    out = []
    for g in profile.rows:
        step = profile.round_seconds(g, 0)
        plain = g / step
        step_words = f"{step * 1e3:.1f} ms step, {profile.source(g, 0)}"
        # the best K > 0, whether or not it beats plain decoding (ties: the smaller K)
        best_k, best = 0, 0.0
        for k in range(1, k_max + 1):
            rate = g * acceptance.expected_tokens(k) / profile.round_seconds(g, k)
            if rate > best:
                best_k, best = k, rate
        words = "" if not best_k else (
            f"K = {best_k} expects {acceptance.expected_tokens(best_k):.2f} tokens per "
            f"{profile.round_seconds(g, best_k) * 1e3:.1f} ms round "
            f"({profile.source(g, best_k)}) = {best:.1f} tok/s, {best / plain:.2f}x plain")
        if best_k and best >= min_speedup * plain:
            out.append(DraftTokensChoice(
                rows=g, draft_tokens=best_k, tokens_per_s=best, plain_tokens_per_s=plain,
                reason=f"{g} rows: {words} ({plain:.1f} tok/s, {step_words})"))
            continue
        why = (f"no K in 1..{k_max} to try" if not best_k else
               f"the best, {words}, below {min_speedup:.2f}x" if best > plain else
               f"no K in 1..{k_max} beats it (the best, {words})")
        out.append(DraftTokensChoice(
            rows=g, draft_tokens=0, tokens_per_s=plain, plain_tokens_per_s=plain,
            reason=f"{g} rows: speculation off (K = 0, plain decoding at {plain:.1f} tok/s, "
                   f"{step_words}): {why}"))
    return tuple(out)


@dataclass(frozen=True)
class RoundRecord:
    """One round a run took (``SpecDecoder.step`` or ``complete``), as the cost model reads
    it."""

    rows: int
    """The rows bucket the round ran over (live and padding rows)."""
    live: int
    """Requests in the round."""
    tokens: int
    """Tokens it committed, over all its requests (after the budget and stop rules)."""
    seconds: float
    """Wall time of the step, host work included (the round, the one read, committing); for a
    round launched ahead (``runtime.overlap``), from the commit of the round before it, less
    the admissions that ran in between (their device time on a GPU, where the admission's read
    also waits for the round)."""
    scheduled: bool = False
    """It ran the confidence schedule (verifying fewer than ``K`` drafts on some rows), so it
    is not the round the cost model prices."""


class RoundTimes:
    """The wall time of the rounds runs took, per (rows bucket, ``K``): the latest
    :data:`ROUND_WINDOW` of each; :meth:`corrected` puts their medians into a profile.

    Scheduled rounds are left out: their cost follows the drafts the schedule admitted, which
    the profile's rounds (every draft verified) do not price.
    """

    def __init__(self, window: int = ROUND_WINDOW,
                 min_rounds: int = MIN_MEASURED_ROUNDS) -> None:
        if not 1 <= min_rounds <= window:
            raise ConfigError(f"min_rounds {min_rounds} must lie in 1..window ({window})")
        self.window = window
        self.min_rounds = min_rounds
        self.times: dict[tuple[int, int], deque[float]] = {}
        """By ``(rows bucket, K)``: the latest round times, oldest first."""

    def add(self, k: int, rounds: Iterable[RoundRecord]) -> None:
        """Record the rounds of one run at ``K = k``."""
        for r in rounds:
            if not r.scheduled:
                self.times.setdefault((r.rows, k), deque(maxlen=self.window)).append(r.seconds)

    def corrected(self, profile: CostProfile) -> CostProfile:
        """``profile`` with :attr:`CostProfile.measured` replaced by the medians of every (rows,
        ``K``) it covers that has at least ``min_rounds`` rounds (``profile`` itself when none
        has)."""
        measured = tuple(
            MeasuredRound(rows=g, draft_tokens=k, seconds=max(statistics.median(ts), 1e-9),
                          rounds=len(ts))
            for (g, k), ts in sorted(self.times.items())
            if len(ts) >= self.min_rounds and g in profile.rows and k <= profile.k_max)
        if not measured and not profile.measured:
            return profile
        return CostProfile(rows=profile.rows, draft_tokens=profile.draft_tokens,
                           seconds=profile.seconds, context_width=profile.context_width,
                           method=profile.method, measured=measured)


class RoundRates(BaseModel):
    """What the cost model expected of the rounds one run took, against what they took.

    Predicted: ``sum(live rows) * E[tokens per round | K] / sum(t_round(rows bucket, K))`` over
    the run's rounds, from the profile and acceptance the ``K`` was chosen on (before the run).
    Measured: the tokens the rounds committed over their wall time. Both leave admission
    (prefill) out: the model prices rounds.
    """

    model_config = _FROZEN

    draft_tokens: int = Field(ge=0)
    """``K`` of the run."""
    rounds: int = Field(ge=1)
    """Rounds the run took."""
    predicted_tokens: float
    """``sum(live rows) * E[tokens per round | K]``."""
    predicted_seconds: float
    """``sum(t_round(rows bucket, K))``."""
    tokens: int
    """Tokens the rounds committed."""
    seconds: float
    """Wall seconds of the rounds."""
    source: str
    """Where the predicted figures came from (round times measured or profiled, acceptance)."""

    @property
    def predicted_tokens_per_s(self) -> float:
        """The cost model's tokens per second for these rounds."""
        return self.predicted_tokens / self.predicted_seconds

    @property
    def measured_tokens_per_s(self) -> float:
        """Tokens per second the rounds took."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def ratio(self) -> float:
        """Predicted over measured tokens per second (1.0: the model was right)."""
        measured = self.measured_tokens_per_s
        return self.predicted_tokens_per_s / measured if measured > 0 else math.inf


def predict_rounds(profile: CostProfile, acceptance: AcceptanceEstimate, k: int,
                   rounds: Sequence[RoundRecord]) -> RoundRates | None:
    """The :class:`RoundRates` of ``rounds`` run at ``K = k`` (``None`` for no rounds), each
    priced at its own rows bucket."""
    if not rounds:
        return None
    buckets = sorted({r.rows for r in rounds})
    scheduled = sum(r.scheduled for r in rounds)
    note = (f"; {scheduled} rounds ran the confidence schedule, priced as verifying every "
            "draft" if scheduled else "")
    return RoundRates(
        draft_tokens=k, rounds=len(rounds),
        predicted_tokens=sum(r.live for r in rounds) * acceptance.expected_tokens(k),
        predicted_seconds=sum(profile.round_seconds(r.rows, k) for r in rounds),
        tokens=sum(r.tokens for r in rounds), seconds=sum(r.seconds for r in rounds),
        source=f"K = {k}, {acceptance.expected_tokens(k):.2f} tokens per row and round "
               f"({acceptance.source}); round times: " + "; ".join(
                   f"{g} rows {profile.round_seconds(g, k) * 1e3:.2f} ms "
                   f"({profile.source(g, k)})" for g in buckets) + note)


class AcceptanceTally:
    """Online per-position counts from the accepted lengths of finished generations.

    ``reached[j]``: rounds that verified draft ``j + 1`` with drafts ``1 .. j`` accepted;
    ``accepted[j]``: of those, the rounds that accepted it. A request's last round is left out
    (the budget or a stop token may have cut it).
    """

    def __init__(self, k_max: int) -> None:
        self.k_max = k_max
        self.reached = [0] * k_max
        self.accepted = [0] * k_max
        self.rounds = 0

    def add(self, accepted_lengths: Sequence[int], k: int) -> None:
        """Count one request's rounds run at ``K = k`` (lengths include the bonus)."""
        for n in list(accepted_lengths)[:-1]:
            drafts = max(0, min(n - 1, k))
            self.rounds += 1
            for j in range(min(k, self.k_max)):
                if drafts >= j:
                    self.reached[j] += 1
                    self.accepted[j] += drafts > j

    def estimate(self, prior: AcceptanceEstimate) -> AcceptanceEstimate:
        """The prior, moved towards the counts (:data:`PRIOR_ROUNDS` pseudo-rounds of prior)."""
        if not self.rounds:
            return prior
        p = [prior.conditional[min(j, len(prior.conditional) - 1)] if prior.conditional
             else DEFAULT_ACCEPTANCE for j in range(self.k_max)]
        conditional = tuple((self.accepted[j] + PRIOR_ROUNDS * p[j])
                            / (self.reached[j] + PRIOR_ROUNDS) for j in range(self.k_max))
        return AcceptanceEstimate(
            conditional=conditional, rounds=prior.rounds + self.rounds,
            source=f"measured online over {self.rounds} rounds, smoothed with "
                   f"{PRIOR_ROUNDS} rounds of the prior ({prior.source})")


def acceptance_prior(checkpoint: Path | None, k_max: int) -> AcceptanceEstimate:
    """The acceptance prior for ``K`` up to ``k_max``: the checkpoint ``config.json``'s
    :data:`PRIOR_KEY` entry when present, else :data:`DEFAULT_ACCEPTANCE` at every position.

    :raises CheckpointError: when the entry is present but malformed.
    """
    default = AcceptanceEstimate(
        conditional=(DEFAULT_ACCEPTANCE,) * max(k_max, 1),
        source=f"conservative default p = {DEFAULT_ACCEPTANCE} per position (no "
               f"{PRIOR_KEY!r} in the checkpoint's config.json)")
    if checkpoint is None:
        return default.model_copy(update={"source": default.source.replace(
            "in the checkpoint's config.json", "checkpoint: random weights")})
    path = Path(checkpoint) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # undecodable, not JSON, or an integer past the digit limit
        return default  # the loader reports an unreadable checkpoint itself
    entry = data.get(PRIOR_KEY) if isinstance(data, dict) else None
    if entry is None:
        return default
    values = entry.get("conditional") if isinstance(entry, dict) else None
    if (not isinstance(values, list) or not values
            or not all(isinstance(v, int | float) and 0 <= v <= 1 for v in values)):
        raise CheckpointError(
            f"{path}: {PRIOR_KEY}.conditional must be a non-empty list of probabilities in "
            f"[0, 1] (P(draft j accepted | drafts before it accepted)); fix or remove the entry")
    where = str(entry.get("source", "recorded"))
    return AcceptanceEstimate(conditional=tuple(float(v) for v in values),
                              source=f"checkpoint config.json {PRIOR_KEY} ({where})")


class VerifyCosts(_Checked):
    """The throughput table the verify scheduler reads, and where it came from."""

    model_config = _FROZEN

    sps: tuple[float, ...]
    """``sps[B]``: rounds per second when a round verifies ``B`` tokens over all its rows
    (bonus included), for ``B = 0 .. max_batch * (K + 1)``."""
    source: str
    """How the table was obtained (measured at bind, a given profile, or given to ``bind``)."""
    scheduled_rows: tuple[int, ...] | None = None
    """Rows buckets whose rounds run the schedule; the others verify every draft in one phase
    (:func:`schedule_buckets`). ``None``: every bucket (no cost profile to decide by)."""
    rows_reason: str = "every rows bucket runs the schedule: no cost profile to decide by"
    """Why, with the figures."""

    def model_post_init(self, _context: object) -> None:
        if len(self.sps) < 2 or any(not s > 0 for s in self.sps):
            raise ValueError("the sps table needs positive entries for 0 .. max_batch * (K + 1) "
                             "verify tokens")


def sps_from_profile(profile: CostProfile, max_tokens: int) -> tuple[float, ...]:
    """``sps[B] = 1 / t(B)`` for ``B = 0 .. max_tokens`` verify tokens, from the round times of
    ``profile``: each measured ``(rows, K)`` with ``K >= 1`` is a point ``(rows * (K + 1),
    seconds)`` (the fastest where several share a token count); ``t`` is linear between the
    points, flat below the first and continues the last segment's slope (never falling) past
    the last. The plain step's times (``K = 0``) are left out unless nothing else was measured:
    a scheduled round always drafts, even when it verifies the bonus alone.

    The round times include drafting at the profiled ``K`` and the scheduler's work is not in
    them: this is the bind-time estimate, not a measurement of scheduled rounds."""
    points: dict[int, float] = {}
    drafted = profile.k_max > 0
    for g, times in zip(profile.rows, profile.seconds, strict=True):
        for k, t in zip(profile.draft_tokens, times, strict=True):
            if drafted and k == 0:
                continue
            b = g * (k + 1)
            points[b] = min(points.get(b, t), t)
    xs = sorted(points)
    out = []
    for b in range(max_tokens + 1):
        if b <= xs[0]:
            t = points[xs[0]]
        elif b >= xs[-1]:
            if len(xs) == 1:
                t = points[xs[0]]
            else:
                x0, x1 = xs[-2], xs[-1]
                slope = max((points[x1] - points[x0]) / (x1 - x0), 0.0)
                t = points[x1] + slope * (b - x1)
        else:
            hi = next(i for i, x in enumerate(xs) if x >= b)
            x0, x1 = xs[hi - 1], xs[hi]
            t = points[x0] + (points[x1] - points[x0]) * (b - x0) / (x1 - x0)
        out.append(1.0 / t)
    return tuple(out)


SCHEDULE_MIN_GAIN = 1.02
"""Expected gain a narrower verify must promise over verifying every draft before a rows bucket
runs the schedule: a scheduled round reads the host twice (its token count, then its result)
where a one-phase round reads once."""


def schedule_buckets(profile: CostProfile, acceptance: AcceptanceEstimate,
                     k: int) -> tuple[tuple[int, ...] | None, str]:
    """``(rows buckets that run the schedule, reason)`` for ``K = k``.

    A schedule can only pay where verifying fewer drafts makes a round cheaper enough: for each
    profiled bucket ``G``, the best uniform width, ``j`` drafts a row (``1 <= j < k``, at
    ``E[tokens | j] / t(G, j)``, the profile's round times and the acceptance estimate) is
    compared with verifying all ``k`` (``E[tokens | k] / t(G, k)``); the bucket schedules when
    the narrower width expects at least :data:`SCHEDULE_MIN_GAIN` times the rate. (A schedule
    admits per row, so it can do better than any uniform width; the uniform one is the part
    the profile can price.) ``None`` (every bucket) when the profile does not reach ``K = k``
    or ``k < 2`` (nothing narrower to price).
    """
    if profile.k_max < k or k < 2:
        return None, (f"every rows bucket runs the schedule: the cost profile reaches K = "
                      f"{profile.k_max}, not {k}" if profile.k_max < k else
                      "every rows bucket runs the schedule (K = 1: nothing narrower to price)")
    scheduled, parts = [], []
    for g in profile.rows:
        full = acceptance.expected_tokens(k) / profile.round_seconds(g, k)
        best_j, best = max(((j, acceptance.expected_tokens(j) / profile.round_seconds(g, j))
                            for j in range(1, k)), key=lambda x: (x[1], -x[0]))
        gain = best / full
        if gain >= SCHEDULE_MIN_GAIN:
            scheduled.append(g)
        parts.append(f"{g}: {gain:.2f}x at {best_j}")
    kept = ", ".join(map(str, scheduled)) or "none"
    return tuple(scheduled), (
        f"rows buckets that run the schedule: {kept}; the others verify all {k} drafts in one "
        f"phase (the best uniform narrower width against all {k}, expected tokens per second "
        f"from the cost profile and the acceptance estimate, by rows: {'; '.join(parts)}; a "
        f"bucket schedules from {SCHEDULE_MIN_GAIN:.2f}x)")


def profile_ks(k_max: int) -> tuple[int, ...]:
    """``K`` values to time for ``K`` up to ``k_max``: :data:`PROFILE_CANDIDATES` up to it, and
    ``k_max`` itself."""
    return tuple(sorted({k for k in PROFILE_CANDIDATES if k <= k_max} | {k_max}))


def profile_rounds(decoders: Mapping[int, Any], rows: Sequence[int], *,
                   width: int, repeats: int = 3,
                   clock: Callable[[], float] = time.perf_counter) -> CostProfile:
    """Time one round of each bound ``SpecDecoder`` (keyed by its ``K``; not imported here,
    the decoder imports the plan, which imports this module) at each of ``rows``, all slots free
    (padding rows compute what live rows do), at context ``width``.

    Each decoder must be prepared for ``rows[-1]`` requests of ``width`` positions. With
    ``plan.cuda_graphs`` the captured round is replayed, otherwise the eager round runs; one
    warm-up sweep, then the median of ``repeats`` sweeps over every ``(rows, K)``.
    """
    ks = tuple(sorted(decoders))
    graphs = all(d.plan.cuda_graphs for d in decoders.values())
    cuda = any(d.device.type == "cuda" for d in decoders.values())
    width = min([width] + [d.plan.max_ctx for d in decoders.values()])
    counters = {k: d.acceptance.forced_counter.clone() for k, d in decoders.items()}
    runs = {}
    for g in rows:
        for k in ks:
            dec = decoders[k]
            if dec.plan.cuda_graphs:  # the narrowest captured width for these rows
                runs[g, k] = dec.graphs[min((key for key in dec.graphs if key[0] == g),
                                            key=lambda key: key[1])].replay
            else:
                runs[g, k] = functools.partial(dec.round_core, g, width)
    times: dict[tuple[int, int], list[float]] = {key: [] for key in runs}
    # round-robin over every (rows, K): a slow spell of the host spreads over all of them
    # instead of inflating one K's time
    for i in range(repeats + 1):
        for key, run in runs.items():
            if cuda:
                torch.cuda.synchronize()
            start = clock()
            run()
            if cuda:
                torch.cuda.synchronize()
            if i:
                times[key].append(clock() - start)
    seconds = [tuple(max(statistics.median(times[g, k]), 1e-9) for k in ks) for g in rows]
    for k, dec in decoders.items():  # rounds over free slots leave nothing live behind
        dec.acceptance.forced_counter.copy_(counters[k])
        dec.buffers.reset_slots()
    how = "CUDA graph replays" if graphs else "eager rounds"
    return CostProfile(rows=tuple(rows), draft_tokens=ks, seconds=tuple(seconds),
                       context_width=width,
                       method=f"{how}, all slots free, median of {repeats} round-robin sweeps "
                              "after a "
                              "warm-up sweep")


__all__ = [
    "DEFAULT_ACCEPTANCE",
    "MIN_MEASURED_ROUNDS",
    "MIN_SPEEDUP",
    "PRIOR_KEY",
    "ROUND_WINDOW",
    "SCHEDULE_MIN_GAIN",
    "AcceptanceEstimate",
    "AcceptanceTally",
    "CostProfile",
    "DraftTokensChoice",
    "MeasuredRound",
    "RoundRates",
    "RoundRecord",
    "RoundTimes",
    "acceptance_prior",
    "choose_draft_tokens",
    "profile_ks",
    "VerifyCosts",
    "predict_rounds",
    "profile_rounds",
    "sps_from_profile",
]
