"""Confidence-scheduled verification (``runtime.verify_schedule``): each round verifies only the
prefixes the scheduler admits, and decoding stays lossless (greedy token for token, sampling in
distribution). Toy target, the built-in ``dspark-gqa`` drafter (random weights, confidence head)
with an STS table installed."""

from __future__ import annotations

import pytest
import torch
from _toy_target import assert_sampled_like_the_target, chi_square_world, syncs_per_step

from draftsmith.contract import ConfigError, ParallelMapping, PlanError, TargetInfo
from draftsmith.runtime.bind import bind
from draftsmith.runtime.buckets import bucket, verify_token_counts
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.costs import CostProfile, sps_from_profile
from draftsmith.runtime.plan import PlanInputs, make_plan
from draftsmith.runtime.scheduler import schedule_prefix, schedule_top_budget
from draftsmith.selection.configs import GreedyConfig, capabilities_of

PROMPTS = [[(i * 7 + j * 3 + 1) % 60 for j in range(2 + 3 * i)] for i in range(6)]
BUDGETS = [14 + 2 * i for i in range(6)]
K = 5
MAX_BATCH = 8


def _config(schedule: str = "all", k: int = K, family: str = "dspark-gqa",
            selection: dict | None = None, **runtime) -> SpecConfig:
    rt = {"max_batch": MAX_BATCH, "max_context": 96, "page_size": 8,
          "verify_schedule": schedule, **runtime}
    return SpecConfig.from_dict({
        "drafter": {"family": family, "options": {"target_layer_ids": [0, 2]}, "seed": 3},
        "num_draft_tokens": k, "selection": selection or {"kind": "greedy"}, "runtime": rt,
    })


def _sps(per_token: float, k: int = K) -> list[float]:
    """``sps[B] = 1 / (1 + per_token * B)`` for ``B = 0 .. MAX_BATCH * (K + 1)``."""
    return [1.0 / (1.0 + per_token * b) for b in range(MAX_BATCH * (k + 1) + 1)]


@pytest.fixture(scope="module")
def nudged(nudged_toy_target):
    target = nudged_toy_target(max_slots=12, max_len=128, mixing=0.3)
    oracle = [target.greedy_generate(p, n, slot=11) for p, n in zip(PROMPTS, BUDGETS, strict=True)]
    return target, oracle


@pytest.fixture(scope="module")
def drafter(nudged):
    """The dspark-gqa drafter the toy target binds, with an STS table."""
    target, _ = nudged
    built = bind(target, None, _config()).drafter
    built.set_sts(torch.linspace(0.6, 1.4, built.spec.block_size))
    return built


class _Rounds:
    """Records, per scheduled round, the raw confidence, the live rows, and what acceptance was
    handed: the admitted lengths, the packed verify's token indices ``b * (K+1) + j`` and the
    block's rows."""

    def __init__(self, dec, monkeypatch) -> None:
        self.raw: list[torch.Tensor] = []
        self.live: list[torch.Tensor] = []
        self.verify_len: list[torch.Tensor] = []
        self.rows: list[torch.Tensor] = []
        self.g: list[int] = []
        confidence, accept = dec.drafter.confidence, dec.acceptance.accept
        bufs = dec.buffers

        def record_confidence(hidden, prev):
            raw = confidence(hidden, prev)
            g = hidden.shape[0]
            self.raw.append(raw.clone())
            self.live.append((bufs.batch_to_slot[:g] != bufs.dummy_slot).nonzero().squeeze(1))
            return raw

        def record_accept(logits, drafts, key, **kw):
            if kw.get("rows") is not None:  # a scheduled round's packed verify
                self.verify_len.append(kw["verify_len"].clone())
                self.rows.append(kw["rows"].clone())
                self.g.append(drafts.shape[0])
            return accept(logits, drafts, key, **kw)

        monkeypatch.setattr(dec.drafter, "confidence", record_confidence)
        monkeypatch.setattr(dec.acceptance, "accept", record_accept)

    def survival(self, i: int, tau: torch.Tensor) -> torch.Tensor:
        """The live rows' calibrated prefix survival of round ``i``, computed here."""
        raw = self.raw[i][self.live[i]]
        return torch.cumprod(torch.sigmoid(raw / tau[: raw.shape[1]]), dim=1)

    def check_packing(self, i: int) -> None:
        """Round ``i`` computed every live row's bonus and admitted drafts, those first and in
        block order, and as many tokens as the smallest token count holding them."""
        g, lengths, live = self.g[i], self.verify_len[i], self.live[i]
        want = [b * (K + 1) + j for b in live.tolist() for j in range(int(lengths[b]) + 1)]
        rows = self.rows[i].tolist()
        assert rows[: len(want)] == want, i
        assert len(rows) == bucket(len(want), verify_token_counts(g, K)), i
        assert len(set(rows)) == len(rows) and max(rows) < g * (K + 1), i


@pytest.mark.parametrize("schedule", ["prefix", "top-budget", "width"])
def test_scheduled_greedy_equals_target_greedy(nudged, drafter, schedule, monkeypatch):
    target, oracle = nudged
    extra = {"verify_budget": 2} if schedule == "top-budget" else {}
    dec = bind(target, drafter, _config(schedule, **extra), sps=_sps(0.02))
    assert dec.plan.verify_schedule == schedule and dec.plan.confidence == "scheduler"
    assert not dec.plan.cuda_graphs
    rounds = _Rounds(dec, monkeypatch)
    results = dec.generate(PROMPTS, BUDGETS)
    for res, want in zip(results, oracle, strict=True):
        assert list(res.tokens) == want
    # not vacuous: rows were cut short and some verified drafts, some rounds computed fewer
    # tokens than the block holds
    lengths = torch.cat(rounds.verify_len)
    assert int(lengths.max()) > 0 and int(lengths.min()) == 0
    assert any(len(r) < g * (K + 1) for r, g in zip(rounds.rows, rounds.g, strict=True))
    for i in range(len(rounds.rows)):
        rounds.check_packing(i)
    assert max(max(r.accepted_lengths) for r in results) > 1


def test_admitted_lengths_are_schedule_prefix_of_the_calibrated_survival(nudged, drafter,
                                                                          monkeypatch):
    target, _ = nudged
    sps = _sps(0.05)
    dec = bind(target, drafter, _config("prefix"), sps=sps)
    rounds = _Rounds(dec, monkeypatch)
    dec.generate(PROMPTS, BUDGETS)
    tau = drafter.sts_temperatures
    assert len(rounds.raw) == len(rounds.verify_len) > 5
    for i, got in enumerate(rounds.verify_len):
        want = schedule_prefix(rounds.survival(i, tau), torch.tensor(sps, dtype=torch.float64))
        assert torch.equal(got[rounds.live[i]], want), i
        padding = torch.ones_like(got, dtype=torch.bool)
        padding[rounds.live[i]] = False
        assert int(got[padding].abs().sum()) == 0  # padding rows verify nothing
        rounds.check_packing(i)


def test_top_budget_admits_the_budget_of_highest_survival(nudged, drafter, monkeypatch):
    target, oracle = nudged
    dec = bind(target, drafter, _config("top-budget", verify_budget=1), sps=_sps(0.0))
    assert dec.plan.verify_budget == 1
    rounds = _Rounds(dec, monkeypatch)
    results = dec.generate(PROMPTS, BUDGETS)
    assert [list(r.tokens) for r in results] == oracle
    tau = drafter.sts_temperatures
    for i, got in enumerate(rounds.verify_len):
        live = rounds.live[i]
        want = schedule_top_budget(rounds.survival(i, tau), live.numel())
        assert torch.equal(got[live], want), i


def test_unprofitable_drafts_verify_only_the_bonus(nudged, drafter, monkeypatch):
    """``sps[B] = 1 / B^2``: every extra verify token lowers the expected rate, so Algorithm 1
    admits nothing; every round verifies the live rows' bonus tokens alone and decodes
    exactly."""
    target, oracle = nudged
    sps = [1.0] + [1.0 / b**2 for b in range(1, MAX_BATCH * (K + 1) + 1)]
    dec = bind(target, drafter, _config("prefix"), sps=sps)
    rounds = _Rounds(dec, monkeypatch)
    results = dec.generate(PROMPTS, BUDGETS)
    assert [list(r.tokens) for r in results] == oracle
    assert all(int(v.max()) == 0 for v in rounds.verify_len)
    for i in range(len(rounds.rows)):
        rounds.check_packing(i)
    assert len(rounds.rows[0]) == len(PROMPTS)  # six live rows in a block of 8 * (K + 1)
    assert all(set(r.accepted_lengths) == {1} for r in results)


def test_scheduled_rejection_sampling_is_lossless_chi_square(monkeypatch):
    """Sampling under the schedule keeps the target's distribution (V = 8): the cap only
    shortens the accepted prefix, the bonus at the cap is the target's own sample."""
    small, plain = chi_square_world()
    cfg = SpecConfig.from_dict({**plain, "runtime": {**plain["runtime"],
                                                     "verify_schedule": "top-budget",
                                                     "verify_budget": 1}})
    drafter = bind(small, None, SpecConfig.from_dict(plain)).drafter
    drafter.set_sts(torch.ones(drafter.spec.block_size))
    dec = bind(small, drafter, cfg, sps=[1.0] * (64 * 4 + 1))
    lens: list[torch.Tensor] = []
    accept = dec.acceptance.accept

    def record(logits, drafts, key, **kw):
        lens.append(kw["verify_len"].clone())
        return accept(logits, drafts, key, **kw)

    monkeypatch.setattr(dec.acceptance, "accept", record)
    prompt, n = [1, 2, 3], 2000
    results = dec.generate([prompt] * n, 3, seeds=list(range(n)))
    admitted = torch.cat(lens)
    assert int(admitted.min()) == 0 and int(admitted.max()) >= 1  # capped and uncapped rows
    rounds = [r.accepted_lengths[0] for r in results]
    assert min(rounds) == 1 and max(rounds) == 2  # budget 1: at most one draft per row
    assert_sampled_like_the_target(small, prompt, results)


def test_a_drafter_without_confidence_head_is_refused(nudged):
    target, _ = nudged
    with pytest.raises(PlanError, match="needs a drafter with a confidence head"):
        bind(target, None, _config("prefix", family="dflash"), sps=_sps(0.0))


def test_a_drafter_without_sts_table_is_refused(nudged):
    target, _ = nudged
    with pytest.raises(PlanError, match="calibration table"):
        bind(target, None, _config("prefix"), sps=_sps(0.0))


def test_schedule_config_and_plan_rules(nudged, drafter):
    with pytest.raises(ConfigError, match="verify_budget is set but verify_schedule"):
        _config("prefix", verify_budget=2)
    target, _ = nudged
    dec = bind(target, drafter, _config("prefix"), sps=_sps(0.1))
    plan = dec.plan
    assert plan.verify_costs is not None and plan.verify_costs.source.startswith("given to bind")
    assert plan.verify_costs.sps == tuple(_sps(0.1))
    assert plan.sts_temperatures == tuple(drafter.sts_temperatures[:K].tolist())
    assert "given to bind" in plan.decision("sps").reason
    with pytest.raises(ConfigError, match="sps table given to bind has 3 entries"):
        bind(target, drafter, _config("prefix"), sps=[1.0, 1.0, 1.0])
    # the default leaves the round and the plan as they were
    plain = bind(target, drafter, _config())
    assert plain.plan.verify_schedule == "all" and plain.plan.verify_costs is None
    assert plain.plan.confidence == "score-only"


def test_scheduled_rounds_are_captured_in_two_phases(drafter):
    """On CUDA a scheduled round is captured under 'auto' and 'on' alike, as two phases with
    the token count read between them (the plan says so)."""
    caps = drafter.capabilities
    toy = TargetInfo(vocab_size=64, hidden_size=32, num_layers=4)
    sts = tuple(drafter.sts_temperatures.tolist())

    def inputs(graphs):
        return PlanInputs(num_draft_tokens=K, selector=capabilities_of(GreedyConfig()),
                          mapping=ParallelMapping(), max_batch=4, max_context=64, page_size=8,
                          kernels="eager", cuda_graphs=graphs, force_accepted=0.0,
                          device="cuda", verify_schedule="prefix", sts_temperatures=sts)

    for graphs in ("auto", "on"):
        plan = make_plan(inputs(graphs), caps, toy)
        assert plan.cuda_graphs
        assert "two host reads" in plan.decision("cuda_graphs").reason


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["prefix", "top-budget", "width"])
def test_graphed_scheduled_rounds_equal_eager_ones(nudged_toy_target, schedule):
    """Captured in two phases (drafting per (rows, width), verification per (rows, width, T)),
    a scheduled decoder emits what the eager one emits, round for round, and the target's own
    greedy tokens; the replayed token counts vary."""
    target = nudged_toy_target(max_slots=12, max_len=128, mixing=0.3, device="cuda")
    drafter = bind(target, None, _config(cuda_graphs="off")).drafter
    drafter.set_sts(torch.linspace(0.6, 1.4, drafter.spec.block_size))
    extra = {"verify_budget": 2} if schedule == "top-budget" else {}
    eager = bind(target, drafter, _config(schedule, cuda_graphs="off", **extra), sps=_sps(0.02))
    graphed = bind(target, drafter, _config(schedule, cuda_graphs="on", **extra), sps=_sps(0.02))
    assert graphed.plan.cuda_graphs and not eager.plan.cuda_graphs
    a = eager.generate(PROMPTS, BUDGETS)
    graphed.prepare_for(PROMPTS, BUDGETS)
    assert graphed.verify_graphs, "no verify phase was captured"
    counts: list[int] = []

    def recording(call, t):
        real = call.replay

        def replay():
            counts.append(t)
            real()
        return replay

    for (_, _, t), call in graphed.verify_graphs.items():
        call.replay = recording(call, t)
    b = graphed.generate(PROMPTS, BUDGETS)
    assert [(r.tokens, r.accepted_lengths) for r in a] == [(r.tokens, r.accepted_lengths)
                                                           for r in b]
    want = [target.greedy_generate(p, n, slot=11) for p, n in zip(PROMPTS, BUDGETS, strict=True)]
    assert [list(r.tokens) for r in b] == want
    # the live rows and their admitted drafts change from round to round
    assert len(set(counts)) > 1, counts


@pytest.mark.gpu
def test_a_graphed_scheduled_round_synchronizes_with_the_host_twice(nudged_toy_target):
    """torch's sync debug mode reports every synchronizing call: a replayed scheduled round
    makes two, the read of its token count T between the phases and the read of its counts and
    tokens at the end. The negative control adds a ``.item()`` and sees three."""
    target = nudged_toy_target(max_slots=12, max_len=128, mixing=0.3, device="cuda")
    drafter = bind(target, None, _config(cuda_graphs="off")).drafter
    drafter.set_sts(torch.linspace(0.6, 1.4, drafter.spec.block_size))
    dec = bind(target, drafter, _config("width", cuda_graphs="on", overlap="off"),
               sps=_sps(0.02))
    dec.generate(PROMPTS[:3], BUDGETS[:3])  # captures
    counts = syncs_per_step(dec, PROMPTS[:3], BUDGETS[:3])
    assert dec.verify_graphs and len(counts) > 3 and set(counts) == {2}, counts
    counts = syncs_per_step(dec, PROMPTS[:3], BUDGETS[:3], extra=True)
    assert len(counts) > 3 and set(counts) == {3}, counts


def test_sps_from_a_cost_profile_interpolates_round_times():
    profile = CostProfile(rows=(1, 2), draft_tokens=(0, 1, 2),
                          seconds=((0.5, 2.0, 2.5), (1.0, 3.0, 4.5)), context_width=8,
                          method="test")
    # K >= 1 points: B = 2 -> 2 s, B = 3 -> 2.5 s, B = 4 -> 3 s, B = 6 -> 4.5 s; flat below
    # B = 2 (the plain step's 0.5 s and 1 s are left out), the last slope (0.75 s) past B = 6
    sps = sps_from_profile(profile, 7)
    assert sps == pytest.approx((1 / 2, 1 / 2, 1 / 2, 1 / 2.5, 1 / 3, 1 / 3.75, 1 / 4.5, 1 / 5.25))
    plain = CostProfile(rows=(1, 2), draft_tokens=(0,), seconds=((1.0,), (2.0,)),
                        context_width=8, method="test")
    assert sps_from_profile(plain, 3) == pytest.approx((1.0, 1.0, 1 / 2, 1 / 3))


def test_the_sps_table_is_measured_at_bind_without_one(nudged, drafter):
    target, _ = nudged
    dec = bind(target, drafter, _config("prefix", k=2, max_batch=2))
    costs = dec.plan.verify_costs
    assert costs is not None and costs.source.startswith("measured at bind on this target")
    assert len(costs.sps) == 2 * 3 + 1 and all(s > 0 for s in costs.sps)


class _Digits:
    """A stand-in tokenizer: ids as text."""

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def _profile(best_k: int) -> CostProfile:
    """Round times under which, at acceptance 0.9, ``K = best_k`` is chosen (0: none is)."""
    ks = (0, 1, 2, 3)
    ms = [[10.0] + [10.0 if 0 < j <= best_k else 1e3 for j in ks[1:]] for _ in (1, 2, 4, 8)]
    return CostProfile(rows=(1, 2, 4, 8), draft_tokens=ks, context_width=128, method="test",
                       seconds=tuple(tuple(x / 1e3 for x in row) for row in ms))


def test_auto_k_with_a_schedule_derives_sps_from_the_profile(nudged, drafter):
    from draftsmith.runtime.costs import AcceptanceEstimate

    target, oracle = nudged
    acc = AcceptanceEstimate(conditional=(0.9,), source="test")
    dec = bind(target, drafter, _config("prefix", k="auto"), profile=_profile(2), acceptance=acc)
    assert dec.plan.num_draft_tokens == 2 and dec.plan.verify_schedule == "prefix"
    assert dec.plan.verify_costs.source.startswith("from the cost profile passed to bind")
    assert dec.plan.verify_costs.sps == pytest.approx(sps_from_profile(_profile(2), 8 * 3))
    assert [list(r.tokens) for r in dec.generate(PROMPTS, BUDGETS)] == oracle
    # the cost model chose K = 0: nothing to schedule, and the plan says why
    off = bind(target, drafter, _config("prefix", k="auto"), profile=_profile(0), acceptance=acc)
    assert off.plan.num_draft_tokens == 0 and off.plan.verify_schedule == "all"
    assert "chose K = 0" in off.plan.decision("verify_schedule").reason


def test_the_plain_baseline_of_a_scheduled_decoder_verifies_one_token(nudged, drafter):
    from draftsmith.runtime.api import Decoder

    target, oracle = nudged
    config = _config("prefix")
    spec = bind(target, drafter, config, sps=_sps(0.02))
    decoder = Decoder(spec=spec, target=target, tokenizer=_Digits(), config=config)  # type: ignore[arg-type]
    report = decoder.generate_ids(PROMPTS, BUDGETS, prompts=[str(p) for p in PROMPTS])
    assert report.exact and [list(r.tokens) for r in report.results] == oracle
    assert decoder.plain.plan.verify_schedule == "all"
    assert decoder.plain.plan.num_draft_tokens == 0


def test_plan_only_shows_the_schedule_without_measuring():
    """``draftsmith plan`` (no weights): the schedule is decided from the declared capabilities,
    the STS table is checked at bind, and the ``sps`` table is said to be measured there."""
    from draftsmith.runtime.bind import plan_only

    toy = TargetInfo(vocab_size=64, hidden_size=32, num_layers=4)
    plan = plan_only(_config("prefix"), toy)
    assert plan.verify_schedule == "prefix" and plan.verify_costs is None
    assert plan.decision("sps").value == "measured at bind"
    with pytest.raises(PlanError, match="needs a drafter with a confidence head"):
        plan_only(_config("prefix", family="dflash"), toy)


def _steep_at(rows_steep: tuple[int, ...]) -> CostProfile:
    """Round times over rows 1, 2, 4, 8 and K = 0 .. K: flat in K (verifying fewer drafts saves
    nothing) except at ``rows_steep``, where each verified draft adds a quarter of a round."""
    ks = tuple(range(K + 1))
    seconds = tuple(tuple(1e-3 * (1 + (0.25 * k if g in rows_steep else 0.0)) for k in ks)
                    for g in (1, 2, 4, 8))
    return CostProfile(rows=(1, 2, 4, 8), draft_tokens=ks, seconds=seconds, context_width=128,
                       method="test")


def test_schedule_buckets_price_the_narrower_widths():
    from draftsmith.runtime.costs import AcceptanceEstimate, schedule_buckets

    acc = AcceptanceEstimate(conditional=(0.6,), source="test")
    rows, why = schedule_buckets(_steep_at((4, 8)), acc, K)
    assert rows == (4, 8)
    assert "rows buckets that run the schedule: 4, 8" in why and "1: 0.97x at 4" in why
    # flat everywhere: nothing schedules; a profile short of K decides nothing
    assert schedule_buckets(_steep_at(()), acc, K)[0] == ()
    short = CostProfile(rows=(1,), draft_tokens=(0, 1), seconds=((1e-3, 2e-3),),
                        context_width=8, method="test")
    assert schedule_buckets(short, acc, K) == (None, "every rows bucket runs the schedule: the "
                                                      "cost profile reaches K = 1, not 5")


def test_rows_buckets_where_a_schedule_cannot_pay_verify_every_draft(nudged, drafter,
                                                                     monkeypatch):
    """With a cost profile, the plan names the rows buckets that run the schedule; rounds of
    the other buckets verify all K drafts in one phase (no confidence head, no packing), and the
    output is the target's greedy output either way."""
    from draftsmith.runtime.costs import AcceptanceEstimate

    target, oracle = nudged
    acc = AcceptanceEstimate(conditional=(0.6,), source="test")
    dec = bind(target, drafter, _config("prefix"), profile=_steep_at((8,)), acceptance=acc)
    assert dec.plan.verify_costs.scheduled_rows == (8,)
    assert dec.plan.decision("scheduled_rows").value == "8"
    seen: list[tuple[int, bool]] = []
    real_round = dec.round_core

    def round_core(g, width):
        seen.append((g, dec._scheduled(g)))
        real_round(g, width)

    monkeypatch.setattr(dec, "round_core", round_core)
    rounds = _Rounds(dec, monkeypatch)
    results = dec.generate(PROMPTS, BUDGETS) + dec.generate(PROMPTS[:2], BUDGETS[:2])
    assert [list(r.tokens) for r in results] == oracle + oracle[:2]
    assert {g for g, on in seen if on} == {8} and {g for g, on in seen if not on} == {2}
    assert len(rounds.rows) == sum(on for _, on in seen)  # only scheduled rounds pack
    assert set(rounds.g) == {8}
    # without a profile (an sps table alone) every bucket schedules, and the plan says why
    every = bind(target, drafter, _config("prefix"), sps=_sps(0.02))
    assert every.plan.verify_costs.scheduled_rows is None
    assert every.plan.decision("scheduled_rows").value == "all"
