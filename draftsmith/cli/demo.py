"""``draftsmith demo``: the embedded SmolLM2-135M-Instruct target with the shipped drafter.

Fetches and converts SmolLM2 on first use, then answers one prompt with the ``dspark-gqa``
drafter shipped in ``draftsmith/checkpoints/smollm2-135m-dspark-gqa`` (random weights if that
directory is missing). ``K`` is the cost model's choice from round times measured at load. The
answer is decoded in short segments after a warm-up; each segment is decoded twice from the same
prefix, speculatively and plainly, in alternating order, so a slow spell of a shared machine
falls on both. The demo prints the answer, each segment's speed-up, their median and spread, and
whether the speculative tokens equal plain greedy decoding's (exit code 1 where they do not).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

import torch

from draftsmith.cli.common import SHIPPED_DRAFTER
from draftsmith.runtime.api import Decoder, load_decoder
from draftsmith.runtime.config import SpecConfig, resolve_device
from draftsmith.runtime.decoder import GenerationResult

DEMO_PROMPT = "Write a short poem about the sea."
DEMO_SEGMENTS = 6
"""Segments timed; the median of their speed-ups is the figure printed."""
DEMO_SEGMENT_TOKENS = 16
"""New tokens per segment: long enough for several speculative rounds at any ``K``, short
enough that six of them, speculative and plain, take about 20 s on two CPU cores."""
DEMO_WARMUP_TOKENS = 8
"""Tokens of the untimed warm-up, speculative and plain (first calls allocate and, on a GPU,
capture CUDA graphs)."""
DEMO_NUM_DRAFT_TOKENS = "auto"
"""``K`` chosen by the cost model from round times measured on this host (0 turns speculation
off where no ``K`` is expected to beat plain decoding); the summary says which and why."""
DEMO_MAX_BATCH = 1
"""One prompt: only the one-row bucket is profiled."""
DEMO_CPU_THREADS = 1
"""torch threads on the CPU. On a two-core machine shared with other work, torch's two-thread
regions wait at every operation's barrier for a thread the scheduler has parked: a plain
decoding step measured 66-80 ms with either thread count at load average 3-4, and 640-720 ms
with two threads against 80 ms with one while three other processes ran (2026-12-03, 2-core
EPYC)."""


@dataclass(frozen=True)
class Segment:
    """One segment decoded both ways from the same prefix."""

    spec_tokens: tuple[int, ...]
    plain_tokens: tuple[int, ...]
    spec_decode_s: float
    """Seconds after the prefill, speculative (the prefill and its token are left out: both
    runs re-prefill the same prefix)."""
    plain_decode_s: float
    accepted_lengths: tuple[int, ...]
    """The speculative rounds' committed tokens (bonus included)."""
    stopped: bool
    """Plain decoding ended on a stop token."""
    spec_first: bool
    """Whether the speculative decoding ran before the plain one."""

    @property
    def exact(self) -> bool:
        """The speculative tokens equal plain greedy decoding's."""
        return self.spec_tokens == self.plain_tokens

    @property
    def spec_rate(self) -> float:
        """Speculative tokens per second after the prefill's token."""
        return max(len(self.spec_tokens) - 1, 0) / max(self.spec_decode_s, 1e-9)

    @property
    def plain_rate(self) -> float:
        """Plain tokens per second after the prefill's token."""
        return max(len(self.plain_tokens) - 1, 0) / max(self.plain_decode_s, 1e-9)

    @property
    def speedup(self) -> float:
        """``spec_rate / plain_rate``."""
        return self.spec_rate / max(self.plain_rate, 1e-9)


@dataclass(frozen=True)
class DemoReport:
    """The segments of one demo answer and the figures drawn from them."""

    segments: tuple[Segment, ...]
    num_draft_tokens: int
    draft_tokens_reason: str

    @property
    def exact(self) -> bool:
        """Every segment's speculative tokens equal plain greedy decoding's."""
        return all(s.exact for s in self.segments)

    @property
    def speedups(self) -> list[float]:
        """Each segment's speed-up, in order."""
        return [s.speedup for s in self.segments]

    @property
    def median_speedup(self) -> float:
        """The median of the segments' speed-ups."""
        return statistics.median(self.speedups)

    @property
    def mean_accepted_length(self) -> float:
        """Committed tokens per verify round over all segments (bonus included)."""
        lengths = [n for s in self.segments for n in s.accepted_lengths]
        return sum(lengths) / max(len(lengths), 1)


def decode_in_segments(decoder: Decoder, prompt_ids: Sequence[int], segments: int,
                       segment_tokens: int,
                       on_segment: Callable[[Segment], None] | None = None) -> DemoReport:
    """Decode ``segments`` pieces of ``segment_tokens`` new tokens after ``prompt_ids``, each
    from the prompt plus the plain tokens so far, speculatively (:meth:`Decoder.generate_ids`,
    which also feeds the cost model's online acceptance) and plainly (:attr:`Decoder.plain`),
    the speculative run first in even segments and second in odd ones. Stops after a segment
    that ended on a stop token or where the two differ."""
    stops = list(decoder.stop_token_ids)
    answer: list[int] = []
    done: list[Segment] = []
    report = None
    for i in range(segments):
        prefix = [*prompt_ids, *answer]
        plain: GenerationResult | None = None
        if i % 2:
            plain = _plain(decoder, prefix, segment_tokens, stops)
        report = decoder.generate_ids([prefix], segment_tokens, compare_plain=False)
        if plain is None:
            plain = _plain(decoder, prefix, segment_tokens, stops)
        spec = report.results[0]
        segment = Segment(spec_tokens=spec.tokens, plain_tokens=plain.tokens,
                          spec_decode_s=spec.decode_s, plain_decode_s=plain.decode_s,
                          accepted_lengths=spec.accepted_lengths,
                          stopped=plain.finish_reason == "stop", spec_first=i % 2 == 0)
        done.append(segment)
        if on_segment is not None:
            on_segment(segment)
        answer.extend(segment.plain_tokens)
        if segment.stopped or not segment.exact:
            break
    assert report is not None, "decode_in_segments needs at least one segment"
    return DemoReport(segments=tuple(done), num_draft_tokens=report.num_draft_tokens,
                      draft_tokens_reason=report.draft_tokens_reason)


def _plain(decoder: Decoder, prefix: list[int], max_new: int,
           stops: list[int]) -> GenerationResult:
    """Plain decoding of one request, its cache sized before it runs."""
    decoder.plain.prepare_for([prefix], max_new)
    return decoder.plain.generate([prefix], max_new, stops)[0]


def format_demo(report: DemoReport, threads: str) -> str:
    """The demo's summary: per-segment speed-ups, their median and spread, exactness."""
    k = report.num_draft_tokens
    lines = [f"--- summary: dspark-gqa, K = {k}, greedy, {threads} ---",
             f"K chosen by the cost model from round times measured at load: "
             f"{report.draft_tokens_reason}",
             f"{len(report.segments)} segments of up to {DEMO_SEGMENT_TOKENS} tokens, each "
             "decoded speculatively and plainly from the same prefix, alternating which runs "
             "first, after a warm-up; decode tokens/s (prefill excluded):",
             "  segment  speculative   plain   speed-up  accepted length"]
    for i, s in enumerate(report.segments, 1):
        tau = sum(s.accepted_lengths) / max(len(s.accepted_lengths), 1)
        lines.append(f"  {i:>7}  {s.spec_rate:>11.1f}  {s.plain_rate:>6.1f}"
                     f"  {s.speedup:>8.2f}x  {tau:>6.2f}")
    ups = report.speedups
    lines.append(f"speed-up: median {report.median_speedup:.2f}x (spread {min(ups):.2f}x - "
                 f"{max(ups):.2f}x over {len(ups)} segments)"
                 + ("; K = 0: speculation off, both runs are plain decoding" if k == 0 else ""))
    lines.append(f"accepted length per round (bonus included): mean "
                 f"{report.mean_accepted_length:.2f}")
    same = sum(len(s.spec_tokens) for s in report.segments if s.exact)
    total = sum(len(s.spec_tokens) for s in report.segments)
    lines.append(f"exact: speculative tokens {'equal' if report.exact else 'DIFFER FROM'} plain "
                 f"greedy tokens ({same}/{total} tokens in segments that agree)")
    return "\n".join(lines)


def demo_command(args: argparse.Namespace | None = None, out: TextIO | None = None) -> int:
    """Fetch/convert SmolLM2 if needed, then decode the demo prompt in timed segments."""
    out = out or sys.stdout
    start = time.perf_counter()
    shipped = (SHIPPED_DRAFTER / "config.json").is_file()
    drafter: dict[str, object] = {"family": "dspark-gqa"}
    if shipped:
        drafter["checkpoint"] = str(SHIPPED_DRAFTER)
    config = SpecConfig.from_dict({
        "drafter": drafter,
        "num_draft_tokens": DEMO_NUM_DRAFT_TOKENS,
        "target": {"model": "smollm2-135m", "device": "auto"},
        "runtime": {"max_batch": DEMO_MAX_BATCH},
    })
    if shipped:
        print("draftsmith demo: target SmolLM2-135M-Instruct (embedded default), drafter "
              f"dspark-gqa from {SHIPPED_DRAFTER.name} (v6), greedy selection, K chosen from "
              "measured costs.", file=out, flush=True)
    else:
        print("draftsmith demo: target SmolLM2-135M-Instruct (embedded default), drafter "
              "dspark-gqa with RANDOM weights (the shipped checkpoint is missing), greedy "
              "selection; expect an accepted length near 1.", file=out, flush=True)
    print("The output must equal plain greedy decoding token for token.\n", file=out, flush=True)
    threads = "device " + str(resolve_device(config.target.device))
    if resolve_device(config.target.device).type == "cpu":
        torch.set_num_threads(DEMO_CPU_THREADS)  # before the cost model times its rounds
        threads = f"CPU, {DEMO_CPU_THREADS} torch thread"
    decoder = load_decoder(config, log=lambda m: print(f"[draftsmith] {m}", file=sys.stderr,
                                                       flush=True))
    threads += f", target GEMM {decoder.target.gemm}, layers {decoder.target.layer_path}"
    prompt_ids = decoder.encode(DEMO_PROMPT)
    print(f"prompt: {DEMO_PROMPT}\n", file=out, flush=True)
    decoder.generate_ids([prompt_ids], DEMO_WARMUP_TOKENS)  # untimed: both decoders warm
    shown: list[int] = []

    def show(segment: Segment) -> None:
        before = decoder.decode(shown)
        shown.extend(segment.spec_tokens)
        print(decoder.decode(shown)[len(before):], end="", file=out, flush=True)

    report = decode_in_segments(decoder, prompt_ids, DEMO_SEGMENTS, DEMO_SEGMENT_TOKENS, show)
    print("\n" + format_demo(report, threads), file=out)
    print(f"(demo finished in {time.perf_counter() - start:.1f} s)", file=out)
    return 0 if report.exact else 1


__all__ = ["DemoReport", "Segment", "decode_in_segments", "demo_command", "format_demo"]
