"""The cost model corrected online (``runtime.costs``): measured round times in the profile,
the rounds a decoder records, the choice of ``K`` following what the rounds took, and the
predicted against measured tokens per second a call reports."""

from __future__ import annotations

import itertools

import pytest

from draftsmith.contract import ConfigError
from draftsmith.runtime.api import Decoder
from draftsmith.runtime.bind import bind
from draftsmith.runtime.buckets import row_buckets
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.costs import (
    MIN_MEASURED_ROUNDS,
    AcceptanceEstimate,
    CostProfile,
    MeasuredRound,
    RoundRecord,
    RoundTimes,
    choose_draft_tokens,
    predict_rounds,
)
from draftsmith.runtime.plan import format_plan


def _profile(ms: list[list[float]], rows: tuple[int, ...] = (1, 2),
             ks: tuple[int, ...] = (0, 1, 2, 4), measured: tuple[MeasuredRound, ...] = ()
             ) -> CostProfile:
    return CostProfile(rows=rows, draft_tokens=ks, context_width=128, method="test table",
                       seconds=tuple(tuple(x / 1e3 for x in row) for row in ms),
                       measured=measured)


def _measured(rows: int, k: int, ms: float, rounds: int = 10) -> MeasuredRound:
    return MeasuredRound(rows=rows, draft_tokens=k, seconds=ms / 1e3, rounds=rounds)


def _acc(p: float) -> AcceptanceEstimate:
    return AcceptanceEstimate(conditional=(p,), source="test")


def _rounds(rows: int, ms: float, n: int, live: int = 1, tokens: int = 1,
            scheduled: bool = False) -> list[RoundRecord]:
    return [RoundRecord(rows=rows, live=live, tokens=tokens, seconds=ms / 1e3,
                        scheduled=scheduled)] * n


# ---- the corrected profile -----------------------------------------------------------------

TABLE = [[10, 12, 14, 18], [20, 24, 28, 36]]


def test_a_measured_round_replaces_the_profiled_time_and_scales_its_bucket():
    prof = _profile(TABLE, measured=(_measured(1, 2, 28.0, rounds=12),))
    assert prof.round_seconds(1, 2) == pytest.approx(0.028)
    assert prof.source(1, 2) == "measured, median of 12 rounds"
    # the other K of the bucket: profiled (or interpolated) times 28 / 14
    assert prof.round_seconds(1, 1) == pytest.approx(0.024)
    assert prof.round_seconds(1, 3) == pytest.approx(0.032)
    assert prof.source(1, 3) == ("interpolated between profiled K x 2.00, the measured / "
                                 "profiled ratio at K = 2")
    # the plain step is scaled by a drafting round's ratio only while nothing else is measured
    assert prof.round_seconds(1, 0) == pytest.approx(0.020)
    # another bucket keeps its profiled times
    assert prof.round_seconds(2, 2) == pytest.approx(0.028)
    assert prof.source(2, 2) == "profiled"
    assert prof.profiled_seconds(1, 2) == pytest.approx(0.014)


def test_a_drafting_round_is_scaled_by_the_nearest_measured_drafting_round():
    prof = _profile(TABLE, measured=(_measured(1, 0, 30.0), _measured(1, 1, 12.0),
                                     _measured(1, 4, 36.0)))
    assert prof.round_seconds(1, 0) == pytest.approx(0.030)
    assert prof.round_seconds(1, 2) == pytest.approx(0.014)   # K = 1's ratio 1.0 (tie: smaller)
    assert prof.round_seconds(1, 3) == pytest.approx(0.032)   # K = 4's ratio 2.0
    only_plain = _profile(TABLE, measured=(_measured(1, 0, 30.0),))
    assert only_plain.round_seconds(1, 4) == pytest.approx(0.054)  # the plain step's 3.0


@pytest.mark.parametrize("bad", [_measured(4, 1, 10.0), _measured(1, 5, 10.0)])
def test_measured_rounds_outside_the_profile_are_refused(bad):
    with pytest.raises(ConfigError, match="lie outside the profile"):
        _profile(TABLE, measured=(bad,))
    with pytest.raises(ConfigError, match="one entry per"):
        _profile(TABLE, measured=(_measured(1, 1, 10.0), _measured(1, 1, 11.0)))


def test_round_times_keep_the_latest_window_and_need_enough_rounds():
    times = RoundTimes(window=10, min_rounds=4)
    times.add(2, _rounds(1, 50.0, 3))
    prof = _profile(TABLE)
    assert times.corrected(prof) is prof  # three rounds are not enough
    times.add(2, _rounds(1, 20.0, 7) + _rounds(1, 1e3, 5, scheduled=True))
    # the window keeps the latest ten: 2 x 50 ms and 7 x 20 ms... then one more 20
    times.add(2, _rounds(1, 20.0, 1))
    got = times.corrected(prof)
    assert got.measured == (_measured(1, 2, 20.0, rounds=10),)
    assert got.seconds == prof.seconds and got.rows == prof.rows
    times.add(0, _rounds(8, 5.0, 4))  # a bucket the profile does not have: left out
    assert times.corrected(prof).measured == got.measured
    with pytest.raises(ConfigError, match="min_rounds"):
        RoundTimes(window=4, min_rounds=5)


def test_the_choice_follows_the_measured_rounds():
    acc = _acc(0.8)
    prof = _profile(TABLE)
    assert choose_draft_tokens(prof, acc)[0].draft_tokens == 4
    times = RoundTimes()
    times.add(4, _rounds(1, 90.0, MIN_MEASURED_ROUNDS))   # K = 4 took 5x its profile
    times.add(0, _rounds(1, 10.0, MIN_MEASURED_ROUNDS))   # the plain step as profiled
    choice = choose_draft_tokens(times.corrected(prof), acc)[0]
    # K = 1..3 are scaled by K = 4's ratio (5.0): every K > 0 is slower than plain now
    assert choice.draft_tokens == 0
    assert "10.0 ms step, measured, median of 8 rounds" in choice.reason
    assert "K = 4 expects 3.36 tokens per 90.0 ms round (measured, median of 8" in choice.reason
    assert times.corrected(prof).round_seconds(1, 2) == pytest.approx(0.070)
    # the 2-row bucket measured nothing: its choice reads the profile alone
    assert choose_draft_tokens(times.corrected(prof), acc)[1] == choose_draft_tokens(prof, acc)[1]


def test_predicted_rates_price_each_round_at_its_bucket():
    prof = _profile(TABLE)
    rounds = _rounds(2, 40.0, 3, live=2, tokens=4) + _rounds(1, 20.0, 2, live=1, tokens=2)
    rates = predict_rounds(prof, _acc(0.5), 2, rounds)
    assert rates is not None and rates.rounds == 5
    e = 1 + 0.5 + 0.25
    assert rates.predicted_tokens == pytest.approx((3 * 2 + 2) * e)
    assert rates.predicted_seconds == pytest.approx(3 * 0.028 + 2 * 0.014)
    assert rates.measured_tokens_per_s == pytest.approx(16 / 0.16)
    assert rates.ratio == pytest.approx(rates.predicted_tokens_per_s / 100.0)
    assert "1 rows 14.00 ms (profiled); 2 rows 28.00 ms (profiled)" in rates.source
    assert predict_rounds(prof, _acc(0.5), 2, []) is None


# ---- the decoder records its rounds, the Decoder learns from them --------------------------

PROMPT = [[(j * 5 + 3) % 60 for j in range(6)]]


@pytest.fixture(scope="module")
def nudged(nudged_toy_target):
    return nudged_toy_target(max_slots=12, max_len=128, mixing=0.3)


def _config() -> SpecConfig:
    return SpecConfig.from_dict({
        "drafter": {"family": "dspark-gqa", "options": {"target_layer_ids": [0, 2]}, "seed": 3},
        "num_draft_tokens": "auto",
        "runtime": {"max_batch": 4, "max_context": 96, "page_size": 8},
    })


class _Digits:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def _clock(seconds_per_call: float):
    """A clock that advances by ``seconds_per_call`` at every reading: each step, read twice,
    takes exactly that long."""
    ticks = itertools.count()
    return lambda: next(ticks) * seconds_per_call


def test_step_records_its_round(nudged):
    dec = bind(nudged, None, _config(), profile=_profile([[10, 10, 10, 10]] * 3, rows=(1, 2, 4)),
               acceptance=_acc(0.9))
    dec.clock = _clock(0.25)
    prompts = [[3, 4, 5], [6, 7, 8, 9], [1, 2]]
    out = dec.generate(prompts, 12)
    assert dec.rounds and all(r.seconds == pytest.approx(0.25) for r in dec.rounds)
    assert all(r.rows in row_buckets(4) and 1 <= r.live <= r.rows for r in dec.rounds)
    assert dec.rounds[0].live == 3 and dec.rounds[0].rows == 4
    # every token but each request's first (from its prefill) was committed by a round
    assert sum(r.tokens for r in dec.rounds) == sum(len(o.tokens) - 1 for o in out)
    assert not any(r.scheduled for r in dec.rounds)


def test_k_follows_the_measured_rounds_and_the_report_carries_both_rates(nudged):
    # the profile: K = 1 and 2 cost what a plain step costs, so any acceptance favours K > 0
    prof = _profile([[10, 10, 10, 20]] * 3, rows=(1, 2, 4))
    config = _config()
    spec = bind(nudged, None, config, profile=prof, acceptance=_acc(0.9))
    decoder = Decoder(spec=spec, target=nudged, tokenizer=_Digits(), config=config)  # type: ignore[arg-type]
    first = decoder.spec_for(1)
    k = first.plan.num_draft_tokens
    assert k > 0
    first.clock = _clock(0.100)            # its rounds take 100 ms: ten times the profile
    decoder.plain.clock = _clock(0.010)    # plain steps take the profiled 10 ms
    report = decoder.generate_ids(PROMPT, 40, prompts=["p"])
    spec_rates, plain_rates = report.spec_rates, report.plain_rates
    assert spec_rates is not None and plain_rates is not None
    assert spec_rates.rounds == len(report.accepted_lengths) >= MIN_MEASURED_ROUNDS
    # predicted from the profile the K was chosen on (before any round was measured)
    e = AcceptanceEstimate(conditional=(0.9,), source="").expected_tokens(k)
    assert spec_rates.predicted_tokens_per_s == pytest.approx(e / 0.010)
    assert spec_rates.measured_tokens_per_s == pytest.approx(
        sum(report.accepted_lengths) / (0.100 * spec_rates.rounds))
    assert spec_rates.ratio > 3
    assert plain_rates.predicted_tokens_per_s == pytest.approx(100.0)
    assert plain_rates.measured_tokens_per_s == pytest.approx(100.0)
    # printed and in the JSON
    from draftsmith.cli.generate import format_summary

    text = format_summary(report)
    assert (f"cost model, speculative rounds (prefill left out): predicted "
            f"{spec_rates.predicted_tokens_per_s:.1f} tok/s, measured "
            f"{spec_rates.measured_tokens_per_s:.1f} tok/s") in text
    assert "cost model, plain rounds" in text
    cost = report.to_dict()["cost_model"]
    assert cost["spec"]["predicted_tokens_per_s"] == spec_rates.predicted_tokens_per_s
    assert cost["plain"]["measured_tokens_per_s"] == pytest.approx(100.0)
    # the next call: the measured rounds turn speculation off for one row, although the bare
    # profile, with the same acceptance, still favours speculation
    again = decoder.spec_for(1)
    costs, estimate, choice = decoder._chosen
    assert choose_draft_tokens(prof, estimate)[0].draft_tokens > 0
    assert again.plan.num_draft_tokens == choice.draft_tokens == 0
    assert f"measured, median of {spec_rates.rounds} rounds" in choice.reason
    assert "10.0 ms step, measured, median of" in choice.reason
    assert costs.measured and "corrected by the rounds runs took" in format_plan(again.plan)
    off = decoder.generate_ids(PROMPT, 12, prompts=["p"])
    assert off.speculation_off and off.spec_rates is off.plain_rates
    assert "measured, median of" in off.draft_tokens_reason


def test_a_fixed_k_reports_no_prediction(nudged):
    config = _config().model_copy(update={"num_draft_tokens": 2})
    spec = bind(nudged, None, config)
    decoder = Decoder(spec=spec, target=nudged, tokenizer=_Digits(), config=config)  # type: ignore[arg-type]
    report = decoder.generate_ids(PROMPT, 8, prompts=["p"], compare_plain=False)
    assert report.spec_rates is None and report.plain_rates is None
    assert report.to_dict()["cost_model"] == {"spec": None, "plain": None}


def test_a_profile_past_the_drafters_block_never_chooses_past_it(nudged):
    """A profile handed to ``bind`` may cover a larger ``K`` than the drafter's trained block
    drafts; every later choice keeps to the drafter's limit, as bind's first one does."""
    from draftsmith.runtime.bind import auto_k_max

    config = _config()
    spec = bind(nudged, None, config, acceptance=_acc(0.99),
                profile=_profile([[10, 10, 10, 10, 10, 10]] * 3, rows=(1, 2, 4),
                                 ks=(0, 1, 2, 4, 8, 16)))
    limit = auto_k_max(spec.drafter.capabilities)
    assert limit < 16 and spec.plan.num_draft_tokens == limit
    decoder = Decoder(spec=spec, target=nudged, tokenizer=_Digits(), config=config)  # type: ignore[arg-type]
    chosen = decoder.spec_for(1)
    assert decoder._chosen is not None
    assert chosen.plan.num_draft_tokens == decoder._chosen[2].draft_tokens == limit
