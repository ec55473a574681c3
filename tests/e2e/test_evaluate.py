"""The evaluation metrics of ``draftsmith eval`` (DeepSpec's definitions of acceptance length)."""

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


def test_capped_responses_and_tau_over_the_ended_ones(tmp_path) -> None:
    """``capped`` counts responses that ran to the budget; ``accept_len_ended`` is tau over the
    rounds of the others only (a looping answer that hits the cap would otherwise lift tau)."""
    from types import SimpleNamespace

    from draftsmith.runtime.api import GenerateReport, TextResult
    from draftsmith.runtime.evaluate import evaluate, format_table

    def result(lengths: tuple[int, ...], reason: str) -> TextResult:
        return TextResult(prompt="p", prompt_ids=(1,), tokens=(5,) * sum(lengths), text="",
                          accepted_lengths=lengths, finish_reason=reason, prefill_s=0.0,
                          decode_s=0.0)

    runs = [[result((8, 8, 8), "length"), result((1, 3), "stop"), result((2, 2, 1), "stop")],
            [result((8, 8), "length")]]
    calls = iter(runs)
    decoder = SimpleNamespace(
        config=SimpleNamespace(num_draft_tokens=7),
        generate=lambda prompts, n, compare_plain=False: GenerateReport(
            results=next(calls), spec_seconds=1.0, plain_seconds=None, greedy=True,
            num_draft_tokens=7, family="x"),
    )
    files = []
    for name, count in (("a", 3), ("b", 1)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text('{"turns": ["q"]}\n' * count)
        files.append(path)
    a, b = evaluate(decoder, files, warmup=False)
    assert (a.capped, b.capped) == (1, 1)
    assert a.accept_len == pytest.approx(33 / 8)
    assert a.accept_len_ended == pytest.approx(9 / 5) and b.accept_len_ended is None
    assert [p.finish_reason for p in a.per_prompt] == ["length", "stop", "stop"]
    table = format_table([a, b]).splitlines()
    assert table[0].split()[7:9] == ["capped", "tau-end"]
    assert table[1].split()[7:9] == ["1", "1.80"] and table[2].split()[7:9] == ["1", "-"]


def test_format_divergences_lists_the_inexact_prompts() -> None:
    from draftsmith.runtime.evaluate import DatasetEval, PromptEval, format_divergences

    def prompt(divergence=None):
        return PromptEval(rounds=1, tokens=2, accept_len=2.0, exact=divergence is None,
                          finish_reason="length", divergence=divergence)

    result = DatasetEval(name="gsm8k", prompts=3, rounds=3, tokens=6, accept_len=2.0,
                         accept_rate_by_position=[1.0], verify_rate=1.0, spec_tokens_per_s=1.0,
                         plain_tokens_per_s=1.0, exact=False,
                         per_prompt=[prompt(), prompt("first difference at generated token 5"),
                                     prompt()],
                         capped=3, accept_len_ended=None)
    assert format_divergences([result]) == "gsm8k prompt 1: first difference at generated token 5"
    assert format_divergences([]) == ""
