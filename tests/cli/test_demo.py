"""``draftsmith demo``'s timing: segments decoded both ways from the same prefix, alternating
which runs first, the median speed-up and its spread, and the exactness verdict."""

from __future__ import annotations

from dataclasses import dataclass, field

from draftsmith.cli.demo import decode_in_segments, format_demo
from draftsmith.runtime.decoder import GenerationResult

STOP = 99


def _continue(prefix: list[int], n: int) -> tuple[int, ...]:
    """The stand-in model's greedy continuation: a function of the prefix alone."""
    out, seq = [], list(prefix)
    for _ in range(n):
        seq.append((sum(seq) * 7 + len(seq)) % 50)
        out.append(seq[-1])
    return tuple(out)


@dataclass
class _Plain:
    log: list[tuple[str, tuple[int, ...]]]
    seconds: float = 2.0
    stop_after: int | None = None

    def prepare_for(self, prompts, max_new_tokens) -> None:
        pass

    def generate(self, prompts, max_new_tokens, stops):
        self.log.append(("plain", tuple(prompts[0])))
        tokens = _continue(prompts[0], max_new_tokens)
        done = sum(1 for name, _ in self.log if name == "plain") == self.stop_after
        if done:
            tokens = tokens[:3] + (STOP,)
        return [GenerationResult(tokens, (1,) * len(tokens), "stop" if done else "length",
                                 0.1, self.seconds * (len(tokens) - 1))]


@dataclass
class _Report:
    results: list
    num_draft_tokens: int = 3
    draft_tokens_reason: str = "1 rows: K = 3 expects ..."


@dataclass
class _Decoder:
    """What the demo reads of a :class:`~draftsmith.runtime.api.Decoder`."""

    log: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    spec_seconds: list[float] = field(default_factory=lambda: [1.0, 0.8, 1.25, 0.5, 1.0, 1.0])
    wrong_in: int | None = None
    stop_after: int | None = None
    stop_token_ids: tuple[int, ...] = (STOP,)

    def __post_init__(self) -> None:
        self.plain = _Plain(self.log, stop_after=self.stop_after)

    def generate_ids(self, prompts, max_new_tokens, *, compare_plain=True):
        assert not compare_plain  # the demo times plain decoding itself
        self.log.append(("spec", tuple(prompts[0])))
        segment = sum(1 for name, _ in self.log if name == "spec") - 1
        tokens = _continue(prompts[0], max_new_tokens)
        if self.stop_after is not None and segment + 1 == self.stop_after:
            tokens = tokens[:3] + (STOP,)
        if segment == self.wrong_in:
            tokens = tokens[:-1] + ((tokens[-1] + 1) % 50,)
        per_token = self.spec_seconds[segment]
        result = GenerationResult(tokens, (3, 4, 2), "length", 0.1,
                                  per_token * (len(tokens) - 1))
        return _Report([result])


def test_segments_alternate_and_continue_from_the_plain_prefix() -> None:
    dec = _Decoder()
    report = decode_in_segments(dec, [1, 2, 3], 6, 5)  # type: ignore[arg-type]
    assert [name for name, _ in dec.log] == ["spec", "plain", "plain", "spec"] * 3
    prefix = [1, 2, 3]
    for i in range(6):
        assert dec.log[2 * i][1] == dec.log[2 * i + 1][1] == tuple(prefix)
        prefix += _continue(prefix, 5)
    assert report.exact and len(report.segments) == 6
    assert [s.spec_first for s in report.segments] == [True, False] * 3
    # plain 2 s a token; speculative 1, 0.8, 1.25, 0.5, 1, 1 s a token
    assert [round(x, 6) for x in report.speedups] == [2.0, 2.5, 1.6, 4.0, 2.0, 2.0]
    assert report.median_speedup == 2.0
    assert report.mean_accepted_length == 3.0
    text = format_demo(report, "CPU, 1 torch thread")
    assert "median 2.00x (spread 1.60x - 4.00x over 6 segments)" in text
    assert "speculative tokens equal plain greedy tokens (30/30" in text
    assert "K = 3" in text and "K = 3 expects" in text


def test_a_stop_token_ends_the_answer() -> None:
    dec = _Decoder(stop_after=2)
    report = decode_in_segments(dec, [4], 6, 5)  # type: ignore[arg-type]
    assert len(report.segments) == 2 and report.segments[-1].stopped and report.exact


def test_a_difference_is_reported_and_ends_the_run() -> None:
    dec = _Decoder(wrong_in=1)
    report = decode_in_segments(dec, [4], 6, 5)  # type: ignore[arg-type]
    assert len(report.segments) == 2 and not report.exact
    assert [s.exact for s in report.segments] == [True, False]
    assert "speculative tokens DIFFER FROM plain greedy tokens (5/10" in format_demo(report, "")
