"""K from measured costs (``runtime.costs``): the arithmetic of the choice, the online acceptance
tally, the acceptance prior, the plan's record of the choice, the fixed-K override, K = 0 as plain
decoding and losslessness whatever K is chosen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _toy_target import ToyTarget

from draftsmith.contract import CheckpointError, ConfigError
from draftsmith.runtime.api import Decoder
from draftsmith.runtime.bind import auto_k_max, bind, plan_only, target_info_from_config
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.costs import (
    DEFAULT_ACCEPTANCE,
    PRIOR_ROUNDS,
    AcceptanceEstimate,
    AcceptanceTally,
    CostProfile,
    acceptance_prior,
    choose_draft_tokens,
    profile_ks,
)
from draftsmith.runtime.plan import format_plan

SHIPPED = Path(__file__).resolve().parents[2] / "draftsmith" / "checkpoints" / \
    "smollm2-135m-dspark-gqa"


def _profile(rows: tuple[int, ...], ks: tuple[int, ...], ms: list[list[float]]) -> CostProfile:
    return CostProfile(rows=rows, draft_tokens=ks, context_width=128, method="test table",
                       seconds=tuple(tuple(x / 1e3 for x in row) for row in ms))


def _acc(*p: float) -> AcceptanceEstimate:
    return AcceptanceEstimate(conditional=p, source="test")


# ---- arithmetic --------------------------------------------------------------------------

@pytest.mark.parametrize(("p", "k", "want"), [
    ((1.0,), 3, 4.0),
    ((0.5,), 2, 1.75),                # 1 + 0.5 + 0.25
    ((0.5, 1.0, 0.0), 3, 2.0),        # 1 + 0.5 + 0.5 + 0
    ((0.8, 0.5), 4, 1 + 0.8 + 0.4 + 0.2 + 0.1),  # positions past the table take the last p
    ((0.0,), 5, 1.0),
    ((0.9,), 0, 1.0),
])
def test_expected_tokens(p, k, want):
    assert _acc(*p).expected_tokens(k) == pytest.approx(want)


@pytest.mark.parametrize(("k", "want_ms"), [(0, 10.0), (1, 20.0), (2, 30.0), (3, 40.0), (4, 50.0)])
def test_round_seconds_interpolates_between_measured_k(k, want_ms):
    prof = _profile((1,), (0, 1, 4), [[10, 20, 50]])
    assert prof.round_seconds(1, k) == pytest.approx(want_ms / 1e3)
    assert prof.profiled_seconds(1, k) == prof.round_seconds(1, k)
    assert prof.source(1, k) == ("profiled" if k in (0, 1, 4) else
                                 "interpolated between profiled K")


@pytest.mark.parametrize(("ms", "p", "want_k"), [
    # plain 10 ms/token. K = 1 at 12 ms with p = 0.9: 1.9 / 12 ms = 158 tok/s vs 100: K = 1 wins;
    # K = 2 at 20 ms: 2.71 / 20 = 135 tok/s
    ([10, 12, 20], (0.9,), 1),
    # the same costs, p = 0.1: K = 1 gives 1.1 / 12 = 92 tok/s < 100: speculation off
    ([10, 12, 20], (0.1,), 0),
    # every K equally cheap: the longest block wins at p = 0.9
    ([10, 10, 10], (0.9,), 2),
    # a 4 % gain (below MIN_SPEEDUP = 1.05): off. 1.04 / 10 ms vs 1 / 10 ms
    ([10, 10, 20], (0.04, 0.0), 0),
    # a 10 % gain: taken. K = 1: 1.1 / 10 ms
    ([10, 10, 30], (0.1, 0.0), 1),
])
def test_choice_table(ms, p, want_k):
    (choice,) = choose_draft_tokens(_profile((1,), (0, 1, 2), [ms]), _acc(*p))
    assert choice.draft_tokens == want_k
    assert choice.plain_tokens_per_s == pytest.approx(1e3 / ms[0])
    if want_k:
        assert f"K = {want_k} expects" in choice.reason and "x plain" in choice.reason
        assert choice.tokens_per_s >= 1.05 * choice.plain_tokens_per_s
    else:
        assert "speculation off (K = 0, plain decoding" in choice.reason


def test_choice_is_per_rows_bucket():
    # one row: drafting is cheap (memory bound); eight rows: a round costs K + 1 steps
    prof = _profile((1, 8), (0, 1, 2, 3), [[10, 11, 12, 13], [20, 40, 60, 80]])
    choices = choose_draft_tokens(prof, _acc(0.7))
    assert [(c.rows, c.draft_tokens) for c in choices] == [(1, 3), (8, 0)]
    assert choices[1].reason.startswith("8 rows: speculation off")


def test_choice_respects_k_max():
    prof = _profile((1,), (0, 1, 2, 3), [[10, 10, 10, 10]])
    assert choose_draft_tokens(prof, _acc(0.9), k_max=2)[0].draft_tokens == 2


@pytest.mark.parametrize(("rows", "ks", "ms"), [
    ((2, 1), (0, 1), [[1, 1], [1, 1]]),   # rows not ascending
    ((1,), (1, 2), [[1, 1]]),              # no K = 0
    ((1,), (0, 1), [[1, 0]]),              # a time that is not positive
    ((1,), (0, 1), [[1]]),                 # a missing time
])
def test_bad_profiles_are_refused(rows, ks, ms):
    with pytest.raises(ConfigError):
        _profile(rows, ks, ms)


def test_bad_lookups_name_the_profiled_range():
    prof = _profile((1,), (0, 2), [[1, 2]])
    with pytest.raises(ConfigError, match="rows 4 was not profiled"):
        prof.round_seconds(4, 1)
    with pytest.raises(ConfigError, match="outside the profiled 0..2"):
        prof.round_seconds(1, 3)
    with pytest.raises(ConfigError, match=r"must lie in \[0, 1\]"):
        _acc(1.5)


def test_profile_ks():
    assert profile_ks(7) == (0, 1, 2, 3, 4, 6, 7)
    assert profile_ks(2) == (0, 1, 2)
    assert profile_ks(0) == (0,)


# ---- acceptance: tally and prior -----------------------------------------------------------

def test_tally_counts_per_position_and_leaves_the_last_round_out():
    tally = AcceptanceTally(3)
    tally.add([1, 2, 4, 3], k=3)  # drafts accepted 0, 1, 3; the last round (2) is left out
    assert tally.rounds == 3
    assert tally.reached == [3, 2, 1]
    assert tally.accepted == [2, 1, 1]
    prior = _acc(0.5, 0.5, 0.5)
    est = tally.estimate(prior)
    w = PRIOR_ROUNDS
    assert est.conditional == pytest.approx(((2 + w / 2) / (3 + w), (1 + w / 2) / (2 + w),
                                             (1 + w / 2) / (1 + w)))
    assert est.rounds == 3 and "measured online over 3 rounds" in est.source
    assert AcceptanceTally(3).estimate(prior) is prior


def test_tally_positions_past_k_stay_at_the_prior():
    tally = AcceptanceTally(4)
    tally.add([3, 3, 3, 1], k=2)
    est = tally.estimate(_acc(0.25))
    assert est.conditional[2:] == (0.25, 0.25)
    assert est.conditional[0] > 0.25


def test_prior_sources(tmp_path):
    default = acceptance_prior(None, 4)
    assert default.conditional == (DEFAULT_ACCEPTANCE,) * 4 and "random weights" in default.source
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 3}))
    assert "conservative default" in acceptance_prior(tmp_path, 2).source
    (tmp_path / "config.json").write_text(json.dumps(
        {"draftsmith_acceptance": {"conditional": [0.7, 0.6], "source": "eval x"}}))
    got = acceptance_prior(tmp_path, 2)
    assert got.conditional == (0.7, 0.6) and "eval x" in got.source
    (tmp_path / "config.json").write_text(json.dumps(
        {"draftsmith_acceptance": {"conditional": [1.7]}}))
    with pytest.raises(CheckpointError, match="fix or remove the entry"):
        acceptance_prior(tmp_path, 2)


def test_the_shipped_checkpoint_records_a_measured_prior():
    prior = acceptance_prior(SHIPPED, 7)
    assert len(prior.conditional) == 7 and "7357 greedy rounds" in prior.source
    assert all(0.5 < p < 0.8 for p in prior.conditional)


# ---- plan and decoder ----------------------------------------------------------------------

PROMPTS = [[(i * 7 + j * 3 + 1) % 60 for j in range(2 + 3 * i)] for i in range(4)]
BUDGETS = [9 + i for i in range(4)]


@pytest.fixture(scope="module")
def nudged(nudged_toy_target) -> tuple[ToyTarget, list[list[int]]]:
    target = nudged_toy_target(max_slots=12, max_len=128, mixing=0.3)
    oracle = [target.greedy_generate(p, n, slot=11) for p, n in zip(PROMPTS, BUDGETS, strict=True)]
    return target, oracle


class _Digits:
    """A stand-in tokenizer: ids as text."""

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def _config(k: int | str, max_batch: int = 4) -> SpecConfig:
    return SpecConfig.from_dict({
        "drafter": {"family": "dspark-gqa", "options": {"target_layer_ids": [0, 2]}, "seed": 3},
        "num_draft_tokens": k,
        "runtime": {"max_batch": max_batch, "max_context": 96, "page_size": 8},
    })


def _favouring(k: int, rows: tuple[int, ...] = (1, 2, 4)) -> CostProfile:
    """A profile under which, at acceptance 0.9, ``K = k`` is the best (0: speculation off)."""
    ks = (0, 1, 2, 3, 4)
    ms = [[10.0] + [10.0 if j <= k else 1e3 for j in ks[1:]] for _ in rows]
    if k == 0:
        ms = [[10.0] + [1e3] * 4 for _ in rows]
    return _profile(rows, ks, ms)


def test_auto_measures_on_the_target_and_records_the_choice(nudged):
    target, oracle = nudged
    dec = bind(target, None, _config("auto"))
    plan = dec.plan
    assert plan.draft_tokens_mode == "auto" and plan.draft_tokens_rows == 4
    prof = plan.cost_profile
    assert prof is not None and prof.rows == (1, 2, 4)
    assert prof.draft_tokens == profile_ks(auto_k_max(dec.drafter.capabilities))
    assert all(t > 0 for row in prof.seconds for t in row) and "eager rounds" in prof.method
    assert plan.acceptance_estimate is not None
    assert "random weights" in plan.acceptance_estimate.source
    # every bucket's choice is a decision; the plan runs the one of its rows bucket
    choices = choose_draft_tokens(prof, plan.acceptance_estimate,
                                  auto_k_max(dec.drafter.capabilities))
    assert [c.rows for c in choices] == [1, 2, 4]
    buckets = [d for d in plan.decisions if d.name.startswith("draft_tokens.rows_")]
    assert [(d.value, d.reason) for d in buckets] == [(c.draft_tokens, c.reason) for c in choices]
    chosen = plan.decision("draft_tokens.rows_4")
    assert plan.num_draft_tokens == chosen.value
    assert chosen.reason in plan.decision("num_draft_tokens").reason
    text = format_plan(plan)
    assert "cost_profile" in text and "acceptance_estimate" in text and "rows_2" in text
    # whatever was chosen, greedy output is plain greedy
    results = dec.generate(PROMPTS, BUDGETS)
    assert [list(r.tokens) for r in results] == oracle


@pytest.mark.parametrize("k", [0, 1, 2, 4])
def test_greedy_output_is_plain_greedy_whatever_k_is_chosen(nudged, k):
    target, oracle = nudged
    dec = bind(target, None, _config("auto"), profile=_favouring(k), acceptance=_acc(0.9))
    assert dec.plan.num_draft_tokens == k
    assert dec.plan.drafting == (k > 0)
    if k == 0:
        assert "speculation off" in dec.plan.decision("drafting").reason
        assert dec.plan.markov == "none" and dec.plan.block_width == 0
    results = dec.generate(PROMPTS, BUDGETS)
    assert [list(r.tokens) for r in results] == oracle
    if k == 0:  # plain decoding: one token per round
        assert all(set(r.accepted_lengths) <= {1} for r in results)


def test_a_fixed_k_wins_over_the_cost_model(nudged):
    target, _ = nudged
    dec = bind(target, None, _config(3), profile=_favouring(0), acceptance=_acc(0.9))
    plan = dec.plan
    assert plan.num_draft_tokens == 3 and plan.draft_tokens_mode == "fixed"
    assert plan.cost_profile is None
    assert not any(d.name.startswith("draft_tokens.rows_") for d in plan.decisions)
    assert "num_draft_tokens = 3 in the config" in plan.decision("num_draft_tokens").reason


def test_rows_pick_the_bucket(nudged):
    target, _ = nudged
    # one row favours K = 2, four rows turn speculation off
    prof = _profile((1, 2, 4), (0, 1, 2), [[10, 10, 10], [10, 10, 10], [10, 1e3, 1e3]])
    one = bind(target, None, _config("auto"), profile=prof, acceptance=_acc(0.9), rows=1)
    four = bind(target, None, _config("auto"), profile=prof, acceptance=_acc(0.9), rows=3)
    assert (one.plan.draft_tokens_rows, one.plan.num_draft_tokens) == (1, 2)
    assert (four.plan.draft_tokens_rows, four.plan.num_draft_tokens) == (4, 0)


def test_generate_rechooses_for_its_batch_and_from_measured_acceptance(nudged):
    target, _ = nudged
    prof = _profile((1, 2, 4), (0, 1, 2), [[10, 10, 11], [10, 10, 11], [10, 1e3, 1e3]])
    config = _config("auto")
    spec = bind(target, None, config, profile=prof, acceptance=_acc(0.9))
    decoder = Decoder(spec=spec, target=target, tokenizer=_Digits(), config=config)  # type: ignore[arg-type]
    assert spec.plan.num_draft_tokens == 0  # chosen for 4 rows
    one = decoder.spec_for(1)
    assert one.plan.num_draft_tokens == 2 and one.plan.draft_tokens_rows == 1
    assert decoder.spec_for(1) is one  # kept
    assert decoder.spec_for(3) is spec
    # measured acceptance far below the prior turns speculation off for one row as well
    assert decoder._tally is not None
    for _ in range(50):
        decoder._tally.add([1, 1, 1, 1], k=2)
    off = decoder.spec_for(1)
    assert off.plan.num_draft_tokens == 0
    assert "measured online over 150 rounds" in off.plan.acceptance_estimate.source


def test_plan_without_a_target_says_auto_is_measured_at_bind():
    config = SpecConfig.from_dict({"num_draft_tokens": "auto",
                                   "target": {"model": "toy", "device": "cpu"},
                                   "drafter": {"options": {"target_layer_ids": [0, 2]}}})
    plan = plan_only(config, target_info_from_config(config.target))
    assert plan.draft_tokens_mode == "auto" and plan.cost_profile is None
    reason = plan.decision("num_draft_tokens").reason
    assert "draftsmith plan --measure" in reason
    assert plan.num_draft_tokens >= 1


def test_generate_with_k0_runs_once_and_says_so(nudged):
    target, oracle = nudged
    config = _config("auto")
    spec = bind(target, None, config, profile=_favouring(0), acceptance=_acc(0.9))
    decoder = Decoder(spec=spec, target=target, tokenizer=_Digits(), config=config)  # type: ignore[arg-type]
    report = decoder.generate_ids(PROMPTS, 9, prompts=[str(p) for p in PROMPTS])
    assert report.speculation_off and report.num_draft_tokens == 0
    assert report.plain_seconds == report.spec_seconds and report.exact
    assert "K = 0 is plain decoding" in report.baseline
    assert "speculation off" in report.draft_tokens_reason
    assert [list(r.tokens) for r in report.results] == [o[:9] for o in oracle]
    assert decoder._tally is not None and decoder._tally.rounds == 0  # nothing to learn at K = 0


def test_generate_with_k_feeds_the_tally(nudged):
    target, oracle = nudged
    config = _config("auto")
    spec = bind(target, None, config, profile=_favouring(2), acceptance=_acc(0.9))
    decoder = Decoder(spec=spec, target=target, tokenizer=_Digits(), config=config)  # type: ignore[arg-type]
    report = decoder.generate_ids(PROMPTS, BUDGETS, prompts=[str(p) for p in PROMPTS],
                                  compare_plain=False)
    assert report.num_draft_tokens == 2 and not report.speculation_off
    assert report.draft_tokens_auto
    assert report.draft_tokens_reason.startswith("4 rows: K = 2 expects")
    from draftsmith.cli.generate import format_summary

    assert ("K = 2 chosen by the cost model from round times profiled at bind, corrected by "
            "the rounds earlier calls took: 4 rows: K = 2") in format_summary(report)
    assert [list(r.tokens) for r in report.results] == oracle
    rounds = sum(len(r.accepted_lengths) - 1 for r in report.results)
    assert decoder._tally is not None and decoder._tally.rounds == rounds > 0
    assert hash(decoder.spec.plan) == hash(decoder.spec.plan.model_copy())


def test_draftsmith_plan_prints_auto(tmp_path, capsys):
    from draftsmith.cli import main

    path = tmp_path / "spec.toml"
    path.write_text('num_draft_tokens = "auto"\n[target]\nmodel = "toy"\ndevice = "cpu"\n'
                    '[drafter]\nfamily = "dspark-gqa"\noptions = {target_layer_ids = [0, 2]}\n')
    assert main(["plan", "--config", str(path), "--random-drafter"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith("num_draft_tokens"))
    assert "auto: chosen at bind per batch-size bucket" in line and "--measure" in line
    assert main(["plan", "--config", str(path), "--random-drafter", "--tp-size", "2",
                 "--measure"]) == 2
    assert "--measure binds one process" in capsys.readouterr().err


def test_auto_is_refused_under_tensor_parallelism(nudged):
    from draftsmith.contract import ParallelMapping, PlanError

    target, _ = nudged
    with pytest.raises(PlanError, match="under tensor parallelism set an integer K"):
        bind(target, None, _config("auto"), ParallelMapping(tp_size=2, tp_rank=0))
