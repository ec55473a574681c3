"""The evaluation metrics of ``draftsmith eval`` (DeepSpec's definitions, spec 2.8)."""

from __future__ import annotations

import pytest

from draftsmith.contract import ConfigError
from draftsmith.runtime.evaluate import acceptance_by_position, read_prompt_file


def test_acceptance_by_position_counts_rounds_that_accepted_each_draft() -> None:
    # round lengths include the bonus: accepted drafts are 0, 2, 4, 1
    assert acceptance_by_position([1, 3, 5, 2], 4) == [0.75, 0.5, 0.25, 0.25]
    assert acceptance_by_position([], 3) == [0.0, 0.0, 0.0]
    assert acceptance_by_position([1, 1], 2) == [0.0, 0.0]


def test_read_prompt_file_first_turn_and_limit(tmp_path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"turns": ["a", "b"]}\n\n{"turns": ["c"]}\n{"turns": ["d"]}\n')
    assert read_prompt_file(path) == ["a", "c", "d"]
    assert read_prompt_file(path, limit=2) == ["a", "c"]


@pytest.mark.parametrize(("text", "message"), [
    ('{"turns": ["ok"]}\n[1, 2]\n', ":2: expected an object with 'turns'"),
    ('{"turns": ["  "]}\n', ":1: the prompt is empty"),
    ('{"turns": ["ok"]}\n{oops\n', ":2: not valid JSON"),
])
def test_read_prompt_file_names_the_bad_line(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        read_prompt_file(path)
