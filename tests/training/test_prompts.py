"""The training prompt recipe is reproducible and disjoint from the evaluation sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftsmith.training.prompts import BOXED, TESTED_SOLUTION, training_prompts

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


def test_same_seed_same_prompts() -> None:
    assert list(training_prompts(300, seed=3)) == list(training_prompts(300, seed=3))
    assert list(training_prompts(300, seed=3)) != list(training_prompts(300, seed=4))
    assert len(set(training_prompts(3000))) == 3000


@pytest.mark.skipif(not DATA.is_dir(), reason="shared/data not beside the checkout")
def test_disjoint_from_evaluation_sets() -> None:
    eval_turns = set()
    for path in DATA.glob("*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            eval_turns.update(t.strip() for t in json.loads(line)["turns"])

    def items(text: str) -> str:
        # the harnesses' instruction formats are shared on purpose; what they wrap must not be
        return text.replace(BOXED.strip(), "\0").replace(TESTED_SOLUTION, "\0")

    # 60-character shingles of every evaluation prompt; a training prompt sharing one is a leak
    bare = {items(t) for t in eval_turns}
    shingles = {t[i:i + 60] for t in bare for i in range(0, max(len(t) - 60, 1), 20)}
    formats = 0
    for prompt in training_prompts(3000):
        assert prompt.strip() not in eval_turns
        formats += items(prompt) != prompt
        prompt = items(prompt)
        assert not any(prompt[i:i + 60] in shingles for i in range(0, len(prompt) - 60, 7))
    assert formats > 100  # the formats are in use, so the replacement above is exercised
