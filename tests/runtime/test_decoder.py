"""The batched decoder with the toy target and the real built-in drafters (random weights):
lossless greedy decoding, equality with the golden reference loop, rejection-sampling
distribution, page permutation, K == 0, stop/budget rules, rollback."""

from __future__ import annotations

import pytest
import torch
from _toy_target import ToyTarget, assert_sampled_like_the_target, chi_square_world

from draftsmith.contract import DraftsmithError
from draftsmith.runtime.bind import bind
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.reference_loop import reference_generate

FAMILIES = ("dflash", "dspark-gqa", "dspark-mla")
PROMPTS = [[(i * 7 + j * 3 + 1) % 60 for j in range(2 + 3 * i)] for i in range(8)]  # 2..23 tokens
BUDGETS = [9 + i for i in range(8)]


@pytest.fixture(scope="module")
def target() -> ToyTarget:
    return ToyTarget(max_slots=12, max_len=128, mixing=0.3)


@pytest.fixture(scope="module")
def greedy_oracle(target) -> list[list[int]]:
    return [target.greedy_generate(p, n, slot=11) for p, n in zip(PROMPTS, BUDGETS, strict=True)]


@pytest.fixture(scope="module")
def nudged(nudged_toy_target) -> tuple[ToyTarget, list[list[int]]]:
    """A target whose drafts get accepted (see ``nudged_toy_target``) and its greedy texts."""
    target = nudged_toy_target(max_slots=12, max_len=128, mixing=0.3)
    oracle = [target.greedy_generate(p, n, slot=11) for p, n in zip(PROMPTS, BUDGETS, strict=True)]
    return target, oracle


def _config(family: str, k: int, selection: dict | None = None, **runtime) -> SpecConfig:
    rt = {"max_batch": 8, "max_context": 96, "page_size": 8, **runtime}
    return SpecConfig.from_dict({
        "drafter": {"family": family, "options": {"target_layer_ids": [0, 2]}, "seed": 3},
        "num_draft_tokens": k, "selection": selection or {"kind": "greedy"}, "runtime": rt,
    })


def _reference(dec, target, prompt, budget, k, *, seed=0, stops=(), rejection=False):
    return reference_generate(target, dec.drafter if k else None, dec.selector, prompt, budget,
                              num_draft_tokens=k, rejection=rejection, stop_token_ids=stops,
                              seed=seed, slot=11)


@pytest.mark.parametrize("k", [1, 3, 7])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_speculative_equals_target_greedy(nudged, family, k):
    target, greedy_oracle = nudged
    dec = bind(target, None, _config(family, k))
    results = dec.generate(PROMPTS, BUDGETS)
    for res, want, budget in zip(results, greedy_oracle, BUDGETS, strict=True):
        assert list(res.tokens) == want
        assert res.finish_reason == "length" and len(res.tokens) == budget
        assert sum(res.accepted_lengths) == budget - 1  # first token comes from the prefill
        assert all(1 <= n <= k + 1 for n in res.accepted_lengths)
    # the composed decoder proposes exactly what the golden loop proposes (same accepted lengths)
    compared: list[int] = []
    for i in (5, 7):
        ref = _reference(dec, target, PROMPTS[i], BUDGETS[i], k)
        assert ref.tokens == list(results[i].tokens)
        assert ref.accepted_lengths == list(results[i].accepted_lengths)
        compared += ref.accepted_lengths
    # informative only if drafts past the first were accepted; dspark-mla ships its own
    # embedding table, so the nudge does not reach it and its drafts rarely survive one token
    want_len = 2 if family == "dspark-mla" else min(k + 1, 3)
    assert max(compared) >= want_len, f"accepted lengths {compared} carry too little information"


@pytest.mark.parametrize(
    ("family", "acceptance"),
    [("dspark-gqa", "rejection"), ("dspark-gqa", "strict"), ("dflash", "rejection"),
     ("dspark-mla", "rejection")],
)
def test_sampled_decoder_equals_reference_loop(target, family, acceptance):
    k = 3
    sel = {"kind": "sample", "temperature": 0.9, "acceptance": acceptance}
    dec = bind(target, None, _config(family, k, sel))
    seeds = [100 + i for i in range(8)]
    stops = [[5, 17]] * 8
    results = dec.generate(PROMPTS, BUDGETS, stop_token_ids=stops, seeds=seeds)
    for i, res in enumerate(results):
        ref = _reference(dec, target, PROMPTS[i], BUDGETS[i], k, seed=seeds[i], stops=stops[i],
                         rejection=acceptance == "rejection")
        assert list(res.tokens) == ref.tokens, i
        assert list(res.accepted_lengths) == ref.accepted_lengths, i
    # the stochastic path really ran: different seeds give different texts
    again = dec.generate(PROMPTS[:2], BUDGETS[:2], stop_token_ids=stops[:2], seeds=[7, 8])
    assert [r.tokens for r in again] != [r.tokens for r in results[:2]]


def test_fused_kernels_decode_what_the_references_decode_sampled(target):
    """Rejection-sampled rounds with the Triton kernels (the interpreter here: placement, chain
    selection, acceptance, the round's summary and commit) emit the tokens, accepted lengths
    and margins of the torch references from the same draws."""
    sel = {"kind": "sample", "temperature": 0.9, "acceptance": "rejection"}
    runs = []
    for kernels in ("eager", "fused"):
        dec = bind(target, None, _config("dspark-gqa", 3, sel, kernels=kernels))
        assert dec.plan.kernels == kernels
        runs.append(dec.generate(PROMPTS[:2], [10, 7], seeds=[4, 5]))
    eager, fused = runs
    assert [r.tokens for r in fused] == [r.tokens for r in eager]
    assert [r.accepted_lengths for r in fused] == [r.accepted_lengths for r in eager]
    for a, b in zip(fused, eager, strict=True):
        torch.testing.assert_close(torch.tensor(a.margins), torch.tensor(b.margins), rtol=0,
                                   atol=0)
    assert max(n for r in fused for n in r.accepted_lengths) > 1


def test_page_permutation_changes_no_output(target):
    sel = {"kind": "sample", "temperature": 1.0}
    first = bind(target, None, _config("dspark-gqa", 3, sel))
    second = bind(target, first.drafter, _config("dspark-gqa", 3, sel))
    # relabel the physical pages: table entry p becomes permutation[p]
    table = second.buffers.page_table
    permutation = torch.randperm(table.numel(), generator=torch.Generator().manual_seed(1))
    table.copy_(permutation.to(table.device)[table])
    assert not torch.equal(first.buffers.page_table, second.buffers.page_table)
    seeds = list(range(8))
    a = first.generate(PROMPTS, BUDGETS, seeds=seeds)
    b = second.generate(PROMPTS, BUDGETS, seeds=seeds)
    assert [r.tokens for r in a] == [r.tokens for r in b]
    assert [r.accepted_lengths for r in a] == [r.accepted_lengths for r in b]


def test_k0_decodes_with_the_target_alone(target, greedy_oracle):
    dec = bind(target, None, _config("dspark-gqa", 0))
    assert not dec.plan.drafting
    results = dec.generate(PROMPTS, BUDGETS)
    assert [list(r.tokens) for r in results] == greedy_oracle
    assert all(set(r.accepted_lengths) == {1} for r in results)
    sel = {"kind": "sample", "temperature": 1.0}
    sampled = bind(target, None, _config("dspark-gqa", 0, sel))
    res = sampled.generate(PROMPTS[:3], 6, seeds=[1, 2, 3])
    for i, r in enumerate(res):
        ref = _reference(sampled, target, PROMPTS[i], 6, 0, seed=i + 1)
        assert list(r.tokens) == ref.tokens


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_more_requests_than_slots_and_stop_rule(target, greedy_oracle, overlap):
    dec = bind(target, None, _config("dspark-gqa", 3, max_batch=3, overlap=overlap))
    stop = greedy_oracle[4][5]
    seen: list[list[list[int]]] = []
    results = dec.generate(PROMPTS, BUDGETS, stop_token_ids=[[], [], [], [], [stop], [], [], []],
                           progress=seen.append)
    assert seen and [list(r.tokens) for r in results] == seen[-1]
    for i, (res, want) in enumerate(zip(results, greedy_oracle, strict=True)):
        if i == 4:
            cut = want.index(stop) + 1
            assert list(res.tokens) == want[:cut] and res.finish_reason == "stop"
            assert sum(res.accepted_lengths) == cut - 1
        else:
            assert list(res.tokens) == want and res.finish_reason == "length"
    assert dec.slots.num_free == 3  # every slot came back
    # a stop token as the very first token ends the request with no round
    first = greedy_oracle[0][0]
    (res,) = dec.generate(PROMPTS[:1], 5, stop_token_ids=[first])
    assert res.tokens == (first,) and res.accepted_lengths == () and res.finish_reason == "stop"


@pytest.mark.parametrize("overlap", ["off", "on"])
@pytest.mark.parametrize("admission", [False, True], ids=["round", "admission"])
def test_a_failed_round_frees_every_slot_and_the_next_call_is_exact(target, greedy_oracle,
                                                                     monkeypatch, admission,
                                                                     overlap):
    """A round or an admission that raises (the target's forward, on its third call of that
    kind) ends the call: every slot comes back, and the next call decodes exactly, from freshly
    loaded slot state (with ``overlap``, a round may be in flight when one raises). Two slots:
    the first two prompts are admitted together, the third admission is the fourth prompt's."""
    dec = bind(target, None, _config("dspark-gqa", 3, overlap=overlap, max_batch=2))
    calls = {"n": 0}
    real = target.forward_rows

    def flaky(tokens, starts, context_width, slots=None, logit_rows=None):
        calls["n"] += (slots is not None) == admission
        if calls["n"] == 3:
            raise RuntimeError("injected failure in the target forward")
        return real(tokens, starts, context_width, slots, logit_rows)

    monkeypatch.setattr(target, "forward_rows", flaky)
    with pytest.raises(RuntimeError, match="injected"):
        dec.generate(PROMPTS[:4], 20)
    assert dec.slots.num_free == dec.plan.slot_capacity
    assert dec.buffers.batch_to_slot.tolist() == [dec.plan.dummy_slot] * dec.plan.slot_capacity
    monkeypatch.setattr(target, "forward_rows", real)
    results = dec.generate(PROMPTS[:4], BUDGETS[:4])
    assert [list(r.tokens) for r in results] == greedy_oracle[:4]


def test_prompt_too_long_is_refused(target):
    dec = bind(target, None, _config("dspark-gqa", 3, max_context=32))
    with pytest.raises(DraftsmithError, match="max_ctx 32"):
        dec.generate([[1] * 20], 10)


def test_rejection_sampling_is_lossless_chi_square():
    """The emitted tokens after the prompt follow the target's own distribution (V = 8)."""
    small, cfg = chi_square_world()
    dec = bind(small, None, SpecConfig.from_dict(cfg))
    prompt, n = [1, 2, 3], 2000
    results = dec.generate([prompt] * n, 3, seeds=list(range(n)))
    rounds = [r.accepted_lengths[0] for r in results]
    assert min(rounds) == 1 and max(rounds) >= 2  # rejections and acceptances both happened
    assert_sampled_like_the_target(small, prompt, results)


@pytest.mark.parametrize("sampling", [{"temperature": 0.7, "top_p": 0.95},
                                      {"temperature": 0.7, "top_k": 5, "top_p": 0.9}])
def test_filtered_rejection_sampling_is_lossless_chi_square(sampling):
    """With top-p (and top-k) the emitted tokens follow the target's filtered distribution: the
    drafter's ``q`` and the target's ``p`` are both filtered, and a token the filter removes
    never appears."""
    small, cfg = chi_square_world()
    cfg["selection"] = {"kind": "sample", **sampling}
    dec = bind(small, None, SpecConfig.from_dict(cfg))
    prompt, n = [1, 2, 3], 2000
    results = dec.generate([prompt] * n, 3, seeds=list(range(n)))
    rounds = [r.accepted_lengths[0] for r in results]
    assert min(rounds) == 1 and max(rounds) >= 2
    assert_sampled_like_the_target(small, prompt, results, **sampling)


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_forced_acceptance_through_the_decoder(target, overlap):
    dec = bind(target, None, _config("dspark-gqa", 4, force_accepted=2.5, overlap=overlap))
    assert dec.plan.acceptance == "forced"
    results = dec.generate(PROMPTS[:3], 30)
    rounds: list[int] = []  # every round but the last, which the budget may cut short
    for r in results:
        assert len(r.tokens) == 30
        assert set(r.accepted_lengths[:-1]) <= {3, 4}  # base 3, +1 with probability 0.5
        rounds += r.accepted_lengths[:-1]
    # the fraction 0.5 is really drawn: both counts occur, 4 in about half the rounds
    # (a binomial(n, 0.5) count within 3.5 standard deviations of n / 2)
    fours = rounds.count(4)
    assert 0 < fours < len(rounds), rounds
    assert abs(fours - len(rounds) / 2) <= 3.5 * (len(rounds) / 4) ** 0.5, rounds
    # one draw per step for the whole batch: the device counter advanced once per round
    steps = max(len(r.accepted_lengths) for r in results)
    assert int(dec.acceptance.forced_counter) == steps


def test_a_round_reads_the_device_once(target):
    """A round, target forward and drafting included, copies device data to the host once (the
    accepted counts and tokens together): the bonus, the counts, the positions and the features
    of the next round stay on the device. The negative control shows the count sees a read."""
    dec = bind(target, None, _config("dspark-gqa", 3, kernels="fused"))
    reads = {"n": 0}
    host_reads = ("tolist", "item", "cpu", "__bool__", "__int__", "__index__", "__float__")

    class Reads(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            to_host = (name == "to" and args[0].device.type != "cpu"
                       and any(str(a) == "cpu" for a in args[1:]))
            if name in host_reads or to_host:
                reads["n"] += 1
            return func(*args, **(kwargs or {}))

    steps = {"n": 0}
    real_step = dec.step

    def step(active):
        steps["n"] += 1
        with Reads():
            real_step(active)

    dec.step = step
    dec.generate(PROMPTS[:2], 12)
    assert steps["n"] > 2 and reads["n"] == steps["n"]
    # negative control: one more read inside the round is counted
    reads["n"] = steps["n"] = 0
    real_core = dec.round_core

    def core(g, width):
        real_core(g, width)
        dec.buffers.target_len[0].item()

    dec.round_core = core
    dec.generate(PROMPTS[:2], 12)
    assert reads["n"] == 2 * steps["n"]


@pytest.mark.parametrize("overlap,kernels", [("off", "auto"), ("on", "auto"), ("on", "fused")])
@pytest.mark.parametrize("k", [0, 3])
def test_a_nan_in_the_targets_logits_ends_that_request_with_an_error(target, greedy_oracle,
                                                                     monkeypatch, k, overlap,
                                                                     kernels):
    """A NaN wins selection (argmax order T: a NaN beats every number), so a committed token
    chosen from logits holding NaN would be meaningless: that request ends with
    ``finish_reason == "error"`` before the token, the others decode exactly. A NaN in a row the
    round does not commit is harmless."""
    from draftsmith.contract import LogitsShard, TargetOutput

    dec = bind(target, None, _config("dspark-gqa", k, overlap=overlap, kernels=kernels))
    real = target.forward_rows
    calls = {"n": 0}

    def poisoned(tokens, starts, context_width, slots=None, logit_rows=None):
        out = real(tokens, starts, context_width, slots, logit_rows)
        if slots is not None:  # an admission
            return out
        calls["n"] += 1
        if calls["n"] == 3:  # third round: every row of slot 1 holds a NaN
            logits = out.logits.logits.clone().view(tokens.shape[0], tokens.shape[1], -1)
            logits[1, :, 5] = float("nan")
            out = TargetOutput(LogitsShard.full(logits.view(-1, logits.shape[-1])),
                               out.features)
        return out

    monkeypatch.setattr(target, "forward_rows", poisoned)
    results = dec.generate(PROMPTS[:3], BUDGETS[:3])
    bad = results[1]
    assert bad.finish_reason == "error" and "NaN" in bad.error
    assert 5 not in bad.tokens[-1:]  # the NaN's token was not emitted
    assert list(bad.tokens) == greedy_oracle[1][: len(bad.tokens)]
    assert len(bad.tokens) < BUDGETS[1]
    for i in (0, 2):
        assert list(results[i].tokens) == greedy_oracle[i] and results[i].error is None
    assert dec.slots.num_free == dec.plan.slot_capacity


def test_a_nan_in_the_prefill_logits_ends_the_request_before_its_first_token(target,
                                                                               monkeypatch):
    from draftsmith.contract import LogitsShard, TargetOutput

    dec = bind(target, None, _config("dspark-gqa", 3))
    real_prefill, real_rows = target.prefill, target.forward_rows

    def poison(out):
        logits = out.logits.logits.clone()
        logits[:, 9] = float("nan")
        return TargetOutput(LogitsShard.full(logits), out.features)

    def rows(tokens, starts, context_width, slots=None, logit_rows=None):
        out = real_rows(tokens, starts, context_width, slots, logit_rows)
        return poison(out) if slots is not None else out  # admissions only

    # one-prompt admissions run forward_rows on the prompt's slot, the batched path prefill
    monkeypatch.setattr(target, "prefill", lambda slots, prompts: poison(real_prefill(slots,
                                                                                      prompts)))
    monkeypatch.setattr(target, "forward_rows", rows)
    (res,) = dec.generate(PROMPTS[:1], 5)
    assert res.finish_reason == "error" and res.tokens == () and res.accepted_lengths == ()
    assert dec.slots.num_free == dec.plan.slot_capacity


@pytest.mark.parametrize("kernels", ["auto", "fused"])
@pytest.mark.parametrize("k", [0, 3])
def test_recorded_margins_are_the_targets_top2_at_each_token(nudged, k, kernels):
    """With margins recorded (the default on one rank), every generated token carries the
    target's winning logit and its margin over the runner-up, as a fresh forward computes them
    (the round's summary and commit in torch, or as the two kernels)."""
    target, _oracle = nudged
    dec = bind(target, None, _config("dspark-gqa", k, kernels=kernels))
    assert dec.plan.record_margins
    results = dec.generate(PROMPTS[:3], BUDGETS[:3])
    for prompt, res in zip(PROMPTS, results, strict=False):
        assert res.margins is not None and len(res.margins) == len(res.tokens)
        for i, (top, margin) in enumerate(res.margins):
            logits = target.prefill([11], [torch.tensor(prompt + list(res.tokens[:i]))])
            want = torch.topk(logits.logits.logits[-1], 2).values
            assert top == pytest.approx(float(want[0]), abs=1e-5)
            assert margin == pytest.approx(float(want[0] - want[1]), abs=1e-5)
    target.release([11])
    off = bind(target, None, _config("dspark-gqa", k, record_margins="off"))
    assert not off.plan.record_margins
    assert off.generate(PROMPTS[:1], 5)[0].margins is None


def test_admissions_group_the_first_fill_by_width_and_equal_the_batched_prefill(target,
                                                                               greedy_oracle,
                                                                               monkeypatch):
    """A prompt that fits the prefill ladder is admitted by ``admit_core`` (the target's batched
    prefill is not called): a call's first admissions, every slot free, in one forward per
    prefill width; later ones alone (what a CUDA graph captures per width). Forcing every
    admission through the batched prefill decodes the same tokens."""
    dec = bind(target, None, _config("dspark-gqa", 3, max_batch=3))
    widths = []
    real_core, real_prefill = dec.admit_core, target.prefill
    monkeypatch.setattr(dec, "admit_core",
                        lambda w, rows=1: (widths.append((w, rows)), real_core(w, rows))[1])
    monkeypatch.setattr(target, "prefill", lambda *a: pytest.fail("batched prefill was used"))
    results = dec.generate(PROMPTS, BUDGETS)
    assert [list(r.tokens) for r in results] == greedy_oracle
    # prompts of 2, 5 and 8 tokens fill the three slots together; 11 and 14, then 17 to 23
    # tokens, come one at a time as slots free
    assert widths == [(16, 3), (16, 1), (16, 1), (24, 1), (24, 1), (24, 1)]
    assert dec.slots.num_free == dec.plan.slot_capacity
    wide = bind(target, None, _config("dspark-gqa", 3))  # eight slots: all eight at once
    wide_core, widths[:] = wide.admit_core, []
    monkeypatch.setattr(wide, "admit_core",
                        lambda w, rows=1: (widths.append((w, rows)), wide_core(w, rows))[1])
    assert [list(r.tokens) for r in wide.generate(PROMPTS, BUDGETS)] == greedy_oracle
    assert widths == [(16, 5), (24, 3)]
    monkeypatch.setattr(target, "prefill", real_prefill)
    monkeypatch.setattr(dec, "_admits_rows", lambda width: False)
    batched = dec.generate(PROMPTS, BUDGETS)
    assert [(r.tokens, r.accepted_lengths) for r in batched] == [
        (r.tokens, r.accepted_lengths) for r in results]


def test_generate_pauses_the_automatic_collector_and_collects_the_young(target, greedy_oracle,
                                                                         monkeypatch):
    """No full garbage-collection pass inside the loop: the automatic collector is off while
    ``generate`` runs, the young generations are collected every ``YOUNG_GC_EVERY`` steps,
    and the collector is back on afterwards, also after an error."""
    import gc

    from draftsmith.runtime import decoder as decoder_module

    dec = bind(target, None, _config("dflash", 3))
    seen, passes = [], []
    monkeypatch.setattr(decoder_module, "YOUNG_GC_EVERY", 2)
    monkeypatch.setattr(decoder_module.gc, "collect", lambda generation=2: passes.append(generation))
    results = dec.generate(PROMPTS[:2], BUDGETS[:2], progress=lambda _: seen.append(gc.isenabled()))
    assert [list(r.tokens) for r in results] == greedy_oracle[:2]
    assert seen and not any(seen)
    assert gc.isenabled()
    assert passes == [1] * (len(seen) // 2)

    def fail(_):
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        dec.generate(PROMPTS[:2], BUDGETS[:2], progress=fail)
    assert gc.isenabled()


def test_generate_leaves_a_disabled_collector_disabled(target):
    import gc

    dec = bind(target, None, _config("dflash", 3))
    gc.disable()
    try:
        dec.generate(PROMPTS[:1], BUDGETS[:1])
        assert not gc.isenabled()
    finally:
        gc.enable()
