"""``run_generate``'s warm-up: one untimed short call first, then the measured one."""

from __future__ import annotations

import io

from draftsmith.cli.generate import run_generate


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int, bool]] = []

    def generate(self, prompts, max_new_tokens, *, chat=True, compare_plain=False, progress=None):
        self.calls.append((list(prompts), max_new_tokens, compare_plain))
        return f"report {len(self.calls)}"


def test_warmup_runs_a_short_untimed_call_first() -> None:
    dec = _Recorder()
    report = run_generate(dec, ["a", "b"], 32, as_json=True, out=io.StringIO(),
                          err=io.StringIO(), warmup=True)
    assert dec.calls == [(["a"], 8, True), (["a", "b"], 32, True)]
    assert report == "report 2"  # the measured call's report


def test_no_warmup_by_default() -> None:
    dec = _Recorder()
    run_generate(dec, ["a"], 4, as_json=True, out=io.StringIO(), err=io.StringIO())
    assert dec.calls == [(["a"], 4, True)]
