"""The real embedded target: SmolLM2-135M-Instruct with a random ``dspark-gqa`` drafter decodes
exactly like transformers' greedy ``generate``. Skipped, with the reason, until ``make demo`` (or
any first use) has converted the model into the cache; with ``DRAFTSMITH_SMOLLM2_GGUF`` set, the
suite converts it first (``tests/conftest.py``)."""

from __future__ import annotations

import pytest
import torch
from _e2e_helpers import first_turns

from draftsmith.runtime.api import load_decoder
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.targets.smollm2 import GGUF_ENV, smollm2_available, smollm2_dir

pytestmark = pytest.mark.skipif(
    not smollm2_available(),
    reason=f"SmolLM2-135M-Instruct is not converted in {smollm2_dir()} yet (run `make demo`, or "
           f"set {GGUF_ENV} to its .gguf for the suite to convert it)",
)

MAX_NEW = 12


def test_smollm2_greedy_speculation_equals_hf_generate() -> None:
    config = SpecConfig.from_dict({
        "drafter": {"family": "dspark-gqa"}, "num_draft_tokens": 3,
        "target": {"model": "smollm2-135m", "device": "cpu"}, "runtime": {"max_batch": 2},
    })
    decoder = load_decoder(config)
    assert decoder.stop_token_ids == (2,)  # <|im_end|>
    prompts = first_turns({"gsm8k": 1, "humaneval": 1}, max_chars=200)
    report = decoder.generate(prompts, MAX_NEW, compare_plain=True)
    assert report.exact is True
    model = decoder.target.model
    for result in report.results:
        ids = torch.tensor([list(result.prompt_ids)])
        out = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False,
                             eos_token_id=list(decoder.stop_token_ids), pad_token_id=2)
        assert list(result.tokens) == out[0, ids.shape[1]:].tolist()
        assert result.text == decoder.tokenizer.decode(list(result.tokens),
                                                       skip_special_tokens=True)


@pytest.mark.gpu
def test_bf16_divergences_are_near_ties() -> None:
    """In bf16 the verification of K + 1 tokens and the one-token step run different kernels,
    so speculative and plain outputs may part; every place they part must be a near-tie: the
    target's top-2 margin there, in the path with the smaller one, at most a few bf16 steps of
    the winning logit. A wider margin would mean a bug, not rounding."""
    from draftsmith.cli.common import SHIPPED_DRAFTER

    config = SpecConfig.from_dict({
        "drafter": {"family": "dspark-gqa", "checkpoint": str(SHIPPED_DRAFTER)},
        "num_draft_tokens": 7,
        "target": {"model": "smollm2-135m", "device": "cuda", "dtype": "bfloat16"},
        "runtime": {"max_batch": 1},
    })
    decoder = load_decoder(config)
    assert decoder.spec.plan.record_margins
    prompts = first_turns({"gsm8k": 5, "humaneval": 5, "mt-bench": 5})
    report = decoder.generate(prompts, 256, compare_plain=True)
    parted = [(i, r.divergence) for i, r in enumerate(report.results) if r.divergence]
    for i, d in parted:
        assert d.spec is not None and d.plain is not None, (i, d)
        assert d.steps <= 4, f"prompt {i}: {d.describe()}"
    print(f"{len(parted)} of {len(prompts)} prompts parted; bf16 steps at the parting: "
          + ", ".join(f"{d.steps:.2f}" for _, d in parted))


@pytest.mark.parametrize("schedule", ["prefix", "top-budget"])
def test_smollm2_scheduled_verification_with_the_shipped_drafter_is_exact(schedule) -> None:
    """The shipped drafter's confidence head and STS table drive the verify scheduler on the
    real target (fp32, CPU; under ``prefix`` the ``sps`` table is measured at bind); the output
    equals plain greedy decoding token for token."""
    from draftsmith.cli.common import SHIPPED_DRAFTER

    config = SpecConfig.from_dict({
        "drafter": {"family": "dspark-gqa", "checkpoint": str(SHIPPED_DRAFTER)},
        "num_draft_tokens": 4,
        "target": {"model": "smollm2-135m", "device": "cpu"},
        "runtime": {"max_batch": 2, "verify_schedule": schedule},
    })
    decoder = load_decoder(config)
    plan = decoder.spec.plan
    assert plan.confidence == "scheduler" and plan.verify_schedule == schedule
    assert len(plan.sts_temperatures) == 4
    if schedule == "prefix":
        assert plan.verify_costs.source.startswith("measured at bind on this target")
    else:
        assert plan.verify_costs is None  # top-budget reads no sps table: none is measured
    prompts = first_turns({"gsm8k": 1, "humaneval": 1}, max_chars=200)
    report = decoder.generate(prompts, MAX_NEW, compare_plain=True)
    assert report.exact is True
    if schedule == "top-budget":  # a fixed budget: drafts were verified (prefix: the measured
        # table decides, and on a CPU it may find no extra token worth verifying)
        assert max(max(r.accepted_lengths) for r in report.results) > 1
