"""The shipped DFlash drafter (z-lab layout, ``draftsmith/checkpoints/smollm2-135m-dflash``)
runs in z-lab's own ``dflash_generate`` and in draftsmith with the same tokens and the same
accepted length per round: 5 prompts (gsm8k, humaneval, mt-bench), SmolLM2-135M-Instruct in
fp32 on the CPU. Both loops run the bf16 checkpoint in fp32 (z-lab's ``.float()``,
draftsmith's ``drafter.dtype``): a drafter left in bf16 beside the fp32 target drafts
differently at near-ties."""

from __future__ import annotations

import time
from pathlib import Path

import dflash.model as zlab  # make test installs dflash==0.1.0 (--no-deps)
import pytest
import torch
from _e2e_helpers import assert_same_rounds, first_turns

from draftsmith.runtime.api import load_decoder
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.targets.smollm2 import smollm2_available, smollm2_dir

SHIPPED_DFLASH = Path(__file__).parents[2] / "draftsmith" / "checkpoints" / "smollm2-135m-dflash"
MAX_NEW = 32

pytestmark = pytest.mark.skipif(
    not smollm2_available(),
    reason=f"SmolLM2-135M-Instruct is not converted in {smollm2_dir()} yet (run `make demo`)",
)


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")
def test_shipped_dflash_agrees_with_zlab_dflash_generate(monkeypatch) -> None:
    monkeypatch.setattr(zlab, "_cuda_time", time.perf_counter)
    zlab_model = zlab.DFlashDraftModel.from_pretrained(SHIPPED_DFLASH).float().eval()
    block = zlab_model.block_size
    config = SpecConfig.from_dict({
        "drafter": {"family": "dflash", "checkpoint": str(SHIPPED_DFLASH), "dtype": "float32"},
        "num_draft_tokens": block - 1,
        "target": {"model": "smollm2-135m", "device": "cpu"}, "runtime": {"max_batch": 5},
    })
    decoder = load_decoder(config)
    decoder.stop_token_ids = ()  # z-lab's loop runs to MAX_NEW with stop_token_ids=None
    ids = [decoder.encode(p) for p in first_turns({"gsm8k": 3, "humaneval": 1, "mt-bench": 1})]
    report = decoder.generate_ids(ids, MAX_NEW, compare_plain=False)
    rounds = []
    for i, (p, ours) in enumerate(zip(ids, report.results, strict=True)):
        # z-lab gets one block more of budget: see assert_same_rounds
        ref = zlab.dflash_generate(zlab_model, decoder.target.model, torch.tensor([p]),
                                   MAX_NEW + block, stop_token_ids=None, temperature=0.0,
                                   block_size=block, return_stats=True)
        theirs = ref.output_ids[0, len(p):len(p) + MAX_NEW].tolist()
        assert list(ours.tokens) == theirs, f"prompt {i}"
        got = list(ours.accepted_lengths)
        assert_same_rounds(got, list(ref.acceptance_lengths), MAX_NEW, f"prompt {i}")
        rounds += got
    assert sum(rounds) / len(rounds) > 2.0, "the shipped drafter should be trained"
