"""Lossless end to end: greedy speculative decoding equals transformers' greedy ``generate``
token for token, for every built-in drafter at batch 1 and batch 8, on 20
prompts drawn from the shared evaluation sets.

The target is a tiny random Llama with a byte tokenizer, nudged so that it sometimes settles
into a token its drafters also favour (embedding column 0 raised, head row ``PET`` reading it):
some requests then accept whole blocks while others accept nothing, so batches are ragged
and the ragged-cache path of the target adapter is exercised, not only ``n = 1``.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from _e2e_helpers import PET, encode_all, first_turns, nudged_model
from _tiny_models import make_byte_tokenizer

from draftsmith.contract import ConfigError
from draftsmith.runtime.api import Decoder, bf16_step, load_decoder
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.targets.hf import HFTarget

FAMILIES = ("dflash", "dspark-gqa", "dspark-mla")
MAX_NEW = 16
K = 4


@pytest.fixture(scope="module")
def world():
    model = nudged_model()
    tokenizer = make_byte_tokenizer(512)
    prompts = first_turns({"gsm8k": 7, "humaneval": 7, "mt-bench": 6})
    assert len(prompts) == 20
    ids = encode_all(tokenizer, prompts)
    reference = []
    for p in ids:
        out = model.generate(torch.tensor([p]), max_new_tokens=MAX_NEW, do_sample=False,
                             pad_token_id=256, eos_token_id=None)
        reference.append(out[0, len(p):].tolist())
    return model, tokenizer, ids, reference


def _decoder(model, tokenizer, family: str, batch: int) -> Decoder:
    config = SpecConfig.from_dict({
        "drafter": {"family": family}, "num_draft_tokens": K,
        "target": {"model": "toy", "device": "cpu"}, "runtime": {"max_batch": batch},
    })
    return load_decoder(config, target=HFTarget(model, max_slots=16), tokenizer=tokenizer)


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_speculation_equals_hf_generate(world, family: str, batch: int) -> None:
    model, tokenizer, ids, reference = world
    decoder = _decoder(model, tokenizer, family, batch)
    decoder.stop_token_ids = ()
    report = decoder.generate_ids(ids, MAX_NEW, compare_plain=False)
    for i, (result, want) in enumerate(zip(report.results, reference, strict=True)):
        assert list(result.tokens) == want, f"prompt {i}: {family} batch {batch} diverged"
        assert sum(result.accepted_lengths) + 1 == len(result.tokens)
    lengths = Counter(report.accepted_lengths)
    assert lengths[1] > 0
    if family != "dspark-mla":  # MLA ships its own table, so the nudge does not reach it
        assert max(lengths) == K + 1, f"no request accepted a whole block: {lengths}"


def test_plain_decoding_baseline_equals_hf_generate(world) -> None:
    """The baseline the speed-ups are measured against (``K = 0`` rounds through the same
    target path) is transformers' own greedy decoding."""
    model, tokenizer, ids, reference = world
    decoder = _decoder(model, tokenizer, "dspark-gqa", 8)
    assert decoder.plain.plan.num_draft_tokens == 0
    got = decoder.plain.generate(ids, MAX_NEW)
    assert [list(r.tokens) for r in got] == reference
    assert all(r.accepted_lengths == (1,) * (MAX_NEW - 1) for r in got)


def test_stop_token_ends_requests_like_hf(world) -> None:
    """With ``PET`` as the stop token, each request ends at its first ``PET`` (kept), inside an
    accepted block or as a bonus, exactly where ``generate`` stops."""
    model, tokenizer, ids, _ = world
    decoder = _decoder(model, tokenizer, "dflash", 8)
    decoder.stop_token_ids = (PET,)
    report = decoder.generate_ids(ids, MAX_NEW, compare_plain=False)
    stopped = 0
    for i, (p, result) in enumerate(zip(ids, report.results, strict=True)):
        out = model.generate(torch.tensor([p]), max_new_tokens=MAX_NEW, do_sample=False,
                             pad_token_id=256, eos_token_id=PET)
        want = out[0, len(p):].tolist()
        if PET in want:
            want = want[: want.index(PET) + 1]
        assert list(result.tokens) == want, f"prompt {i}"
        stopped += result.finish_reason == "stop"
    assert stopped >= 3


def test_per_prompt_budgets_with_the_plain_comparison(world) -> None:
    """One budget per prompt reaches the plain greedy pass too (it compared an int to a list)."""
    model, tokenizer, ids, reference = world
    decoder = _decoder(model, tokenizer, "dspark-gqa", 2)
    decoder.stop_token_ids = ()
    budgets = [5, 9, 3]
    report = decoder.generate_ids(ids[:3], budgets, compare_plain=True)
    assert [len(r.tokens) for r in report.results] == budgets
    assert report.exact
    for result, want, n in zip(report.results, reference[:3], budgets, strict=True):
        assert list(result.tokens) == want[:n]


def test_the_targets_position_limit_is_checked_before_admission(world, monkeypatch) -> None:
    """A request that would outrun the target's max_position_embeddings is refused before any
    request runs (it failed mid-generation, losing the whole batch)."""
    model, tokenizer, ids, _ = world
    decoder = _decoder(model, tokenizer, "dspark-gqa", 2)
    limit = decoder.target.max_position_embeddings
    short, long = ids[0], [5] * (limit - K - 3)
    prefills = []
    real = decoder.target.prefill
    monkeypatch.setattr(decoder.target, "prefill",
                        lambda slots, prompts: prefills.append(slots) or real(slots, prompts))
    with pytest.raises(ConfigError, match="target's max_position_embeddings"):
        decoder.generate_ids([short, long], 8, compare_plain=False)
    assert prefills == []  # refused before anything ran
    assert decoder.spec.slots.num_free == decoder.spec.plan.slot_capacity


def test_an_inexact_prompt_reports_where_the_paths_part_and_the_margins(world) -> None:
    """When speculative and plain outputs differ, the report names the first differing token and
    the top-2 margin each path had there. Forced here: the plain output of one prompt is edited
    after the run, so the divergence lands at a known token whose margins were recorded."""
    from dataclasses import replace

    model, tokenizer, ids, _ = world
    decoder = _decoder(model, tokenizer, "dspark-gqa", 2)
    decoder.stop_token_ids = ()
    report = decoder.generate_ids(ids[:2], 10, compare_plain=True)
    assert report.exact and all(r.divergence is None for r in report.results)
    r = report.results[0]
    assert r.margins is not None and len(r.margins) == len(r.tokens) == len(r.plain_margins)
    assert r.margins[0] == r.plain_margins[0]  # the same prefill chose the first token
    edited = replace(r, plain_tokens=r.plain_tokens[:4] + (r.plain_tokens[4] + 1,)
                     + r.plain_tokens[5:])
    d = edited.divergence
    assert d is not None and d.position == 4
    assert d.spec == r.margins[4] and d.plain == r.plain_margins[4]
    assert d.steps == pytest.approx(min(m / bf16_step(t) for t, m in (d.spec, d.plain)))
    assert "first difference at generated token 4" in d.describe()


def test_bf16_step() -> None:
    assert bf16_step(1.0) == 2.0**-7 and bf16_step(-3.0) == 2.0**-6
    assert bf16_step(40.0) == 0.25 and bf16_step(0.0) == 2.0**-7
