"""``benchmarks/round.py``'s per-kernel charges: each kernel is charged only the time it alone
kept the stream busy, so kernels that overlap (programmatic dependent launch) are not counted
twice and the charges add up to the busy time. Span arithmetic and the profiler glue on the CPU."""

from __future__ import annotations

import random

import pytest
import torch
from _e2e_helpers import benchmark_module


@pytest.fixture(scope="module")
def round_bench():
    with benchmark_module("round.py", "round_benchmark") as module:
        yield module


def _union(spans):
    """Length of the union of the spans' intervals, merged the plain way."""
    total, cur_start, cur_end = 0.0, None, None
    for _, start, end in sorted(spans, key=lambda s: s[1]):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    return total + (0.0 if cur_end is None else cur_end - cur_start)


def test_back_to_back_kernels_keep_their_durations(round_bench):
    got = round_bench.alone_us([("a", 0.0, 10.0), ("b", 10.0, 15.0), ("a", 20.0, 23.0)], 1)
    assert got == {"a": (2, 13.0), "b": (1, 5.0)}


def test_an_overlapping_successor_is_charged_only_past_its_predecessor(round_bench):
    # b starts under a (programmatic dependent launch): the overlap is a's
    got = round_bench.alone_us([("b", 4.0, 12.0), ("a", 0.0, 10.0)], 1)
    assert got == {"a": (1, 10.0), "b": (1, 2.0)}


def test_a_kernel_inside_another_is_charged_nothing(round_bench):
    got = round_bench.alone_us([("a", 0.0, 10.0), ("b", 2.0, 5.0), ("c", 6.0, 14.0)], 1)
    assert got == {"a": (1, 10.0), "b": (1, 0.0), "c": (1, 4.0)}


def test_per_call_figures_divide_by_the_calls(round_bench):
    spans = [("a", 0.0, 4.0), ("b", 3.0, 6.0), ("a", 10.0, 14.0), ("b", 13.0, 16.0)]
    assert round_bench.alone_us(spans, 2) == {"a": (1, 4.0), "b": (1, 2.0)}


def test_charges_add_up_to_the_busy_time(round_bench):
    rng = random.Random(0)
    for _ in range(200):
        spans = []
        for _ in range(rng.randint(1, 30)):
            start = rng.uniform(0.0, 100.0)
            spans.append((rng.choice("abcd"), start, start + rng.uniform(0.0, 15.0)))
        got = round_bench.alone_us(spans, 1)
        assert sum(us for _, us in got.values()) == pytest.approx(_union(spans))
        assert sum(n for n, _ in got.values()) == len(spans)
        own = {}
        for name, start, end in spans:
            own[name] = own.get(name, 0.0) + end - start
        assert all(us <= own[name] + 1e-9 for name, (_, us) in got.items())


def test_spans_read_the_profiler_events(round_bench):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        x = torch.randn(32, 32)
        (x @ x).relu()
    spans = round_bench._spans(prof, "CPU")
    assert spans and all(isinstance(n, str) and s <= e for n, s, e in spans)
    assert "aten::relu" in {n for n, _, _ in spans}
    assert round_bench._spans(prof, "CUDA") == []
