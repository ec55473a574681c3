"""``runtime.overlap``: ``generate`` launches round ``t + 1`` before the host commits round ``t``.

The rounds here run eagerly on the CPU (``overlap = "on"``), which walks the same host logic as
the GPU's graph replays: launching behind a round whose positions the host has not read yet,
committing only to requests still running, admitting while a round is in flight, and holding back
behind a scheduled round. The outputs must be those of the decoder that commits every round
first."""

from __future__ import annotations

import pytest
import torch

from draftsmith.runtime.bind import bind
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.plan import make_plan

PROMPTS = [[(i * 7 + j * 3 + 1) % 60 for j in range(2 + 3 * i)] for i in range(8)]
BUDGETS = [9 + 3 * i for i in range(8)]


def _config(k: int, overlap: str, selection: dict | None = None, max_batch: int = 3,
            **runtime) -> SpecConfig:
    rt = {"max_batch": max_batch, "max_context": 96, "page_size": 8, "overlap": overlap,
          **runtime}
    return SpecConfig.from_dict({
        "drafter": {"family": "dspark-gqa", "options": {"target_layer_ids": [0, 2]}, "seed": 3},
        "num_draft_tokens": k, "selection": selection or {"kind": "greedy"}, "runtime": rt,
    })


@pytest.fixture(scope="module")
def nudged(nudged_toy_target):
    target = nudged_toy_target(max_slots=12, max_len=128, mixing=0.3)
    oracle = [target.greedy_generate(p, n, slot=11) for p, n in zip(PROMPTS, BUDGETS, strict=True)]
    return target, oracle


class _Launches:
    """Counts the rounds launched behind another (``ahead``) and the requests a completed round
    no longer had running (a round computed for them and thrown away)."""

    def __init__(self, dec, monkeypatch) -> None:
        self.ahead = 0
        self.dropped = 0
        real_launch, real_complete = dec.launch, dec.complete

        def launch(active, ahead=0, **kw):
            self.ahead += ahead > 0
            return real_launch(active, ahead, **kw)

        def complete(launched, since):
            self.dropped += sum(r.finish != "" for r in launched.active)
            return real_complete(launched, since)

        monkeypatch.setattr(dec, "launch", launch)
        monkeypatch.setattr(dec, "complete", complete)


def _fields(results):
    return [(r.tokens, r.accepted_lengths, r.finish_reason, r.margins) for r in results]


@pytest.mark.parametrize("k", [0, 3])
def test_overlapped_greedy_equals_committing_first(nudged, k, monkeypatch):
    target, oracle = nudged
    stop = oracle[5][6]
    stops = [[], [], [], [], [], [stop], [], []]
    first = bind(target, None, _config(k, "off"))
    assert not first.plan.overlap and first.plan.decision("overlap").value is False
    want = first.generate(PROMPTS, BUDGETS, stop_token_ids=stops)
    dec = bind(target, first.drafter if k else None, _config(k, "on"))
    assert dec.plan.overlap
    launches = _Launches(dec, monkeypatch)
    got = dec.generate(PROMPTS, BUDGETS, stop_token_ids=stops)
    assert _fields(got) == _fields(want)
    for res, ref, s in zip(got, oracle, stops, strict=True):
        cut = ref.index(s[0]) + 1 if s and s[0] in ref else len(ref)
        assert list(res.tokens) == ref[:cut]
    assert got[5].finish_reason == "stop"
    # not vacuous: rounds ran ahead (8 requests through 3 slots, so also while admitting), and
    # some request had ended before a round launched for it completed
    assert launches.ahead > 5 and launches.dropped > 0
    # the rounds' records are the completions, each timed
    assert len(dec.rounds) >= launches.ahead and all(r.seconds > 0 for r in dec.rounds)


def test_overlapped_sampling_equals_committing_first(nudged):
    target, _ = nudged
    sel = {"kind": "sample", "temperature": 0.9, "acceptance": "rejection"}
    seeds = [100 + i for i in range(8)]
    stops = [[5, 17]] * 8
    off = bind(target, None, _config(3, "off", sel))
    want = off.generate(PROMPTS, BUDGETS, stop_token_ids=stops, seeds=seeds)
    on = bind(target, off.drafter, _config(3, "on", sel))
    got = on.generate(PROMPTS, BUDGETS, stop_token_ids=stops, seeds=seeds)
    assert _fields(got) == _fields(want)
    assert len({r.tokens for r in got}) > 1


def test_a_scheduled_round_is_not_run_ahead(nudged, monkeypatch):
    target, oracle = nudged
    off = bind(target, None, _config(3, "off"))
    drafter = off.drafter
    drafter.set_sts(torch.linspace(0.6, 1.4, drafter.spec.block_size))
    sps = [1.0 / (1.0 + 0.02 * b) for b in range(3 * 4 + 1)]
    dec = bind(target, drafter, _config(3, "on", verify_schedule="prefix"), sps=sps)
    launches = _Launches(dec, monkeypatch)
    got = dec.generate(PROMPTS, BUDGETS)
    assert [list(r.tokens) for r in got] == oracle
    assert launches.ahead == 0 and all(r.scheduled for r in dec.rounds)


def test_the_plan_overlaps_captured_rounds_only_unless_asked(nudged):
    target, _ = nudged
    auto = bind(target, None, _config(3, "auto"))
    assert not auto.plan.overlap and "eagerly" in auto.plan.decision("overlap").reason
    from test_plan import TOY, _caps, _inputs

    # on a GPU: captured rounds overlap under auto, eager ones do not, off is off
    assert make_plan(_inputs(cuda_graphs="auto", device="cuda"), _caps(), TOY).overlap
    assert not make_plan(_inputs(cuda_graphs="auto", device="cuda", overlap="off"), _caps(),
                         TOY).overlap
    assert not make_plan(_inputs(cuda_graphs="off", device="cuda"), _caps(), TOY).overlap


@pytest.mark.parametrize("k", [0, 3])
def test_a_round_run_ahead_attends_past_the_width_bucket_its_stale_positions_name(k):
    """On a target whose attention reads only the round's context width, requests cross the
    128-column bucket while a round runs ahead of the host's positions: its width must allow
    for the round in flight (one that took the host's stale positions reads too few columns)."""
    from _tiny_models import tiny_target

    target = tiny_target(max_slots=6)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (100, 114, 118, 90)]
    rt = {"max_batch": 4, "max_context": 512, "page_size": 16, "cuda_graphs": False}
    cfg = {"drafter": {"family": "dspark-gqa", "options": {"target_layer_ids": [0, 2]},
                       "seed": 3},
           "num_draft_tokens": k, "selection": {"kind": "greedy"}}
    off = bind(target, None, SpecConfig.from_dict({**cfg, "runtime": {**rt, "overlap": "off"}}))
    want = off.generate(prompts, 32)
    on = bind(target, off.drafter if k else None,
              SpecConfig.from_dict({**cfg, "runtime": {**rt, "overlap": "on"}}))
    widths: list[int] = []
    real = on.round_core

    def core(rows, width):
        widths.append(width)
        real(rows, width)

    on.round_core = core
    got = on.generate(prompts, 32)
    assert _fields(got) == _fields(want)  # the winning logits too, to the bit
    assert {128, 256} <= set(widths)


@pytest.mark.gpu
def test_graphed_rounds_run_ahead_with_the_outputs_of_committing_first(nudged_toy_target,
                                                                        monkeypatch):
    """On the GPU, captured rounds: the default overlaps them and decodes what committing each
    round first decodes, bit for bit, sampled and greedy."""
    target = nudged_toy_target(max_slots=12, max_len=128, mixing=0.3, device="cuda")
    stops = [[5, 17]] * 8
    for sel in ({"kind": "greedy"},
                {"kind": "sample", "temperature": 0.9, "acceptance": "rejection"}):
        off = bind(target, None, _config(3, "off", sel, cuda_graphs="on"))
        want = off.generate(PROMPTS, BUDGETS, stop_token_ids=stops)
        on = bind(target, off.drafter, _config(3, "auto", sel, cuda_graphs="on"))
        assert on.plan.cuda_graphs and on.plan.overlap
        on.generate(PROMPTS, BUDGETS, stop_token_ids=stops)  # captures
        launches = _Launches(on, monkeypatch)
        got = on.generate(PROMPTS, BUDGETS, stop_token_ids=stops)
        assert _fields(got) == _fields(want)
        assert launches.ahead > 5
        monkeypatch.undo()


def test_a_round_in_flight_is_not_charged_the_admissions(nudged, monkeypatch):
    """A round's record runs from the commit before it, less the admissions that ran while it
    was in flight (prefill is not a round's cost: the cost model prices rounds)."""
    target, _ = nudged
    dec = bind(target, None, _config(3, "on"))
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    real_admit = dec._admit_all

    def admit(reqs, **kw):
        now[0] += 1000.0  # an admission is expensive on this clock
        return real_admit(reqs, **kw)

    dec.clock = clock
    monkeypatch.setattr(dec, "_admit_all", admit)
    launches = _Launches(dec, monkeypatch)
    dec.generate(PROMPTS, BUDGETS)
    assert launches.ahead > 5  # admissions did run with rounds in flight (8 prompts, 3 slots)
    assert all(r.seconds < 100 for r in dec.rounds), [r.seconds for r in dec.rounds]


@pytest.mark.gpu
def test_a_round_in_flight_keeps_its_device_time_across_an_admission(nudged_toy_target,
                                                                      monkeypatch):
    """On the GPU an admission's read waits for the rounds queued ahead of it. Their remaining
    time stays theirs: every round is made to hold the device for a known time, and the rounds'
    records add up to at least that many rounds of it, admissions mid-run (8 prompts, 3 slots)
    or not. Charging the admissions their wall time loses about a round per admission."""
    target = nudged_toy_target(max_slots=12, max_len=128, mixing=0.3, device="cuda")
    dec = bind(target, None, _config(3, "on", cuda_graphs="on"))
    dec.generate(PROMPTS, BUDGETS)  # captures
    holds: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    real_launch = dec.launch

    def launch(active, ahead=0, **kw):
        launched = real_launch(active, ahead, **kw)
        begin, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        begin.record()
        torch.cuda._sleep(10_000_000)  # behind the round's result copy: the round holds on
        end.record()
        holds.append((begin, end))
        return launched

    monkeypatch.setattr(dec, "launch", launch)
    launches = _Launches(dec, monkeypatch)
    dec.generate(PROMPTS, BUDGETS)
    torch.cuda.synchronize()
    assert launches.ahead > 5
    held = [b.elapsed_time(e) / 1e3 for b, e in holds]
    charged = sum(r.seconds for r in dec.rounds)
    # the last hold may outlast the last commit
    assert charged >= 0.95 * (sum(held) - max(held)), (charged, held)
