"""What ``Decoder.generate`` / ``generate_ids`` accept: checked before anything is decoded."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from draftsmith.contract import ConfigError
from draftsmith.runtime.api import Decoder
from draftsmith.runtime.inputs import check_max_new_tokens, check_prompt_ids, check_prompt_texts


def _probe(vocab_size: int = 100) -> Decoder:
    """A decoder with nothing loaded: validation runs before anything it would need."""
    probe = Decoder.__new__(Decoder)
    probe.target = SimpleNamespace(vocab_size=vocab_size)
    return probe


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        ("hello", r"prompts is a single str; pass a list of prompts, e.g. generate\(\['hello'\]\)"),
        (b"hello", "prompts is a single bytes"),
        ([], "no prompts given"),
        (["ok", 3], "prompt 1 is a int, not a string"),
        (["ok", "bad \udcff"], "prompt 1 holds a lone surrogate '\\\\udcff' at character 4"),
        (7, "prompts is a int; pass a list of strings"),
    ],
)
def test_generate_refuses_prompts_that_are_not_a_list_of_text(prompts, message) -> None:
    with pytest.raises(ConfigError, match=message):
        _probe().generate(prompts, 4)


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([[1, 2.0]], r"token 1 of prompt 0 is 2.0 \(float\); token ids are integers"),
        ([[1, "2"]], r"token 1 of prompt 0 is '2' \(str\)"),
        ([[True]], "token 0 of prompt 0 is True"),
        (["12"], "prompt 0 is a str; pass token ids"),
        ("12", "prompt_ids is a string"),
        ([[]], "prompt 0 has no tokens"),
        ([[5, 100]], r"token 1 of prompt 0 is 100, outside the vocabulary \[0, 100\)"),
        ([[-1]], "is -1, outside the vocabulary"),
        ([torch.tensor([1.0, 2.0])], "token 0 of prompt 0 is tensor"),
    ],
)
def test_generate_ids_refuses_ids_that_are_not_integers_in_the_vocabulary(ids, message) -> None:
    with pytest.raises(ConfigError, match=message):
        _probe().generate_ids(ids, 4)


def test_integer_ids_of_any_kind_are_accepted() -> None:
    rows = [[1, 2], torch.tensor([3, 4]), np.array([5, 6], dtype=np.int64), (7,)]
    assert check_prompt_ids(rows, 10) == [[1, 2], [3, 4], [5, 6], [7]]
    assert check_prompt_texts(("a", "b")) == ["a", "b"]


@pytest.mark.parametrize(("budget", "ok"), [(1, True), ([3, 4], True), (0, False), (True, False),
                                            (2.5, False), ([3], False), ([3, 0], False)])
def test_the_token_budget_is_an_integer_or_one_per_prompt(budget, ok: bool) -> None:
    if ok:
        check_max_new_tokens(budget, 2)
    else:
        with pytest.raises(ConfigError, match="max_new_tokens"):
            check_max_new_tokens(budget, 2)
    if not ok:
        with pytest.raises(ConfigError, match="max_new_tokens"):
            _probe().generate_ids([[1], [2]], budget)
