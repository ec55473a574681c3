"""The prefix scheduler of Sequential Temperature Scaling: Algorithm 1 against a literal
early-stop walk (they must agree exactly), the paper's appendix counterexample (which returns
``l = 0``), and the fixed-shape top-budget variant."""

from __future__ import annotations

import random

import pytest
import torch

from draftsmith.contract import ConfigError, ShapeError
from draftsmith.runtime.scheduler import (
    schedule_prefix,
    schedule_top_budget,
    schedule_width,
    sps_values,
)


def _candidates(survival: torch.Tensor) -> list[tuple[float, int, int]]:
    """All ``(a, r, j)`` with 1-based ``j``, sorted by ``a`` desc, then ``j`` asc, then ``r`` asc."""
    a = survival.double().tolist()
    cand = [(a[r][j - 1], r, j) for r in range(len(a)) for j in range(1, len(a[0]) + 1)]
    return sorted(cand, key=lambda t: (-t[0], t[2], t[1]))


def _algorithm1(survival: torch.Tensor, sps) -> list[int]:
    """Algorithm 1 exactly as the DSpark paper writes it (Python floats, one at a time)."""
    r_count = survival.shape[0]
    length, best_len = [0] * r_count, [0] * r_count
    tokens, acc = r_count, float(r_count)
    best = r_count * sps(r_count)
    for a, r, j in _candidates(survival):
        if not a > 0:
            continue  # E holds only a > 0
        length[r] = j
        tokens += 1
        acc += a
        theta = acc * sps(tokens)
        if theta > best:
            best, best_len = theta, list(length)
        else:
            break
    return best_len


def _global_search(survival: torch.Tensor, sps) -> list[int]:
    """The same walk without the break (the retrospective search the appendix rules out)."""
    r_count = survival.shape[0]
    length, best_len = [0] * r_count, [0] * r_count
    tokens, acc = r_count, float(r_count)
    best = r_count * sps(r_count)
    for a, r, j in _candidates(survival):
        if a > 0:
            length[r] = j
            tokens += 1
            acc += a
            if acc * sps(tokens) > best:
                best, best_len = acc * sps(tokens), list(length)
    return best_len


def _random_survival(rng: random.Random, r: int, k: int) -> torch.Tensor:
    """Prefix products of confidences on a coarse grid (many exact ties and zeros)."""
    c = torch.tensor([[rng.choice((0.0, 0.25, 0.5, 0.75, 0.9, 1.0, rng.random()))
                       for _ in range(k)] for _ in range(r)], dtype=torch.float32)
    return torch.cumprod(c, dim=1)


def _random_sps(rng: random.Random, size: int):
    kind = rng.randrange(3)
    if kind == 0:  # smooth decay
        alpha = rng.uniform(0.005, 0.3)
        return torch.tensor([1.0 / (1.0 + alpha * b) for b in range(size)], dtype=torch.float64)
    if kind == 1:  # flat then a cliff (non-smooth)
        cliff = rng.randrange(1, size)
        return torch.tensor([1.0 if b < cliff else rng.uniform(0.2, 0.6) for b in range(size)],
                            dtype=torch.float64)
    return torch.tensor(sorted((rng.uniform(0.1, 1.0) for _ in range(size)), reverse=True),
                        dtype=torch.float64)


def test_matches_the_literal_early_stop_walk_on_random_inputs():
    rng = random.Random(1234)
    admitted_some = 0
    for trial in range(400):
        r, k = rng.randint(1, 7), rng.randint(1, 7)
        survival = _random_survival(rng, r, k)
        table = _random_sps(rng, r * (k + 1) + 1 + rng.randrange(3))
        want = _algorithm1(survival, lambda b, t=table: float(t[b]))
        got = schedule_prefix(survival, table)
        assert got.dtype == torch.int64 and got.tolist() == want, (trial, survival, table)
        if trial % 4 == 0:  # the callable form and fp64 input give the same answer
            assert schedule_prefix(survival.double(), lambda b, t=table: t[b]).tolist() == want
        admitted_some += sum(want) > 0
    assert 50 < admitted_some < 390  # both outcomes are exercised


def test_padding_rows_marked_by_live_schedule_like_the_live_rows_alone():
    """Padding rows anywhere in the batch, marked by ``live``: the live rows get the lengths they
    get alone, the padding rows 0 (what a captured round relies on: no host read to drop the
    padding rows); top-budget likewise."""
    rng = random.Random(99)
    for trial in range(200):
        r, k = rng.randint(1, 6), rng.randint(1, 6)
        survival = _random_survival(rng, r, k)
        table = _random_sps(rng, (r + 3) * (k + 1) + 1)
        budget = rng.randint(0, r * k)
        want = schedule_prefix(survival, table).tolist()
        want_tb = schedule_top_budget(survival, budget).tolist()
        padded = _random_survival(rng, r + 3, k)  # padding rows hold garbage, not zeros
        live = sorted(rng.sample(range(r + 3), r))
        padded[live] = survival
        mask = torch.tensor([i in live for i in range(r + 3)])
        got = schedule_prefix(padded, table, mask).tolist()
        got_tb = schedule_top_budget(padded, budget, live=mask).tolist()
        assert [got[i] for i in live] == want, trial
        assert [got_tb[i] for i in live] == want_tb, trial
        assert all(got[i] == got_tb[i] == 0 for i in range(r + 3) if i not in live), trial


def test_width_is_the_brute_force_best_round():
    """``schedule_width`` picks the width of most ``(live + expected drafts) * SPS(live * Q)``
    by brute force over the widths (smallest on ties); live rows get ``Q - 1``, padding rows 0."""
    rng = random.Random(5)
    chosen = set()
    for trial in range(300):
        r, k = rng.randint(1, 6), rng.randint(1, 7)
        survival = _random_survival(rng, r, k)
        table = _random_sps(rng, r * (k + 1) + 1)
        widths = [q for q in (1, 2, 3, 4, 6, 8) if q < k + 1] + [k + 1]
        live = [rng.random() < 0.8 for _ in range(r)]
        theta = {q: (sum(live) + sum(float(survival[i, :q - 1].sum()) for i in range(r)
                                     if live[i])) * float(table[sum(live) * q])
                 for q in widths}
        best = max(widths, key=lambda q: (theta[q], -q))
        got = schedule_width(survival, table, torch.tensor(widths), torch.tensor(live))
        assert got.tolist() == [best - 1 if x else 0 for x in live], trial
        chosen.add(best)
    assert len(chosen) > 3  # several widths win somewhere


def test_lengths_are_prefixes_of_positive_survival():
    rng = random.Random(7)
    for _ in range(100):
        survival = _random_survival(rng, 5, 6)
        lengths = schedule_prefix(survival, lambda b: 1.0)  # flat SPS: every a > 0 pays off
        assert lengths.tolist() == (survival > 0).sum(1).tolist()


def test_paper_appendix_counterexample_returns_zero():
    """R = 1, gamma = 2, a_1 = 0.8, SPS(1, 2, 3) = (1.0, 0.5, 0.45). Theta_1 = 0.9 < Theta_0 = 1,
    so Algorithm 1 stops before looking at c_2: l = 0 whatever x_1 made c_2 (0.9 or 0). The
    retrospective search would return 2 when c_2 = 0.9 (Theta_2 = 1.134) and 0 when c_2 = 0, which
    is what biases the output to (0.85, 0.15)."""
    sps = torch.tensor([0.0, 1.0, 0.5, 0.45], dtype=torch.float64)
    high = torch.tensor([[0.8, 0.8 * 0.9]])
    low = torch.tensor([[0.8, 0.0]])
    assert schedule_prefix(high, sps).tolist() == [0]
    assert schedule_prefix(low, sps).tolist() == [0]
    assert _global_search(high, lambda b: float(sps[b])) == [2]
    assert _global_search(low, lambda b: float(sps[b])) == [0]
    # the appendix's distribution: P(Y = A) = 0.5 * 1 + 0.5 * 0.7 under the retrospective scheduler
    p_t, p_d = (0.7, 0.3), (0.5, 0.5)
    retro_a = p_d[0] * min(1.0, p_t[0] / p_d[0]) + p_d[1] * p_t[0]
    assert retro_a == pytest.approx(0.85) and retro_a != pytest.approx(p_t[0])


def test_sps_forms_and_errors():
    counts = torch.arange(5)
    table = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])
    assert sps_values(table, counts).tolist() == [5.0, 4.0, 3.0, 2.0, 1.0]
    assert sps_values(lambda b: 10.0 - b, counts).tolist() == [10.0, 9.0, 8.0, 7.0, 6.0]
    assert sps_values(lambda b: 1.0 if b < 2 else 0.5, counts).tolist() == [1, 1, .5, .5, .5]
    with pytest.raises(ShapeError, match="cover token counts"):
        schedule_prefix(torch.ones(2, 3), torch.ones(8))  # needs entries 0..8
    with pytest.raises(ConfigError, match="callable"):
        schedule_prefix(torch.ones(2, 3), {2: 1.0})
    with pytest.raises(ShapeError):
        schedule_prefix(torch.ones(2, 3, 1), torch.ones(9))
    assert schedule_prefix(torch.ones(0, 3), torch.ones(1)).shape == (0,)
    assert schedule_prefix(torch.ones(2, 0), torch.ones(3)).tolist() == [0, 0]


def _top_budget_reference(survival, budget, floor):
    taken = [(r, j) for a, r, j in _candidates(survival) if a > floor][:budget]
    r_count = survival.shape[0]
    count = [sum(1 for r, _ in taken if r == q) for q in range(r_count)]
    longest = [max((j for r, j in taken if r == q), default=0) for q in range(r_count)]
    return count, longest


def test_top_budget_takes_the_best_prefixes_within_budget():
    rng = random.Random(99)
    for _ in range(300):
        r, k = rng.randint(1, 6), rng.randint(1, 6)
        survival = _random_survival(rng, r, k)
        budget = rng.randint(0, r * k + 2)
        floor = rng.choice((0.0, 1e-6, 0.3))
        count, longest = _top_budget_reference(survival, budget, floor)
        got = schedule_top_budget(survival, budget, floor=floor)
        assert got.tolist() == longest
        assert count == longest  # every request's admitted set is a prefix 1..len
        positive = int((survival.double() > floor).sum())
        assert int(got.sum()) == min(budget, positive) <= budget
        as_tensor = schedule_top_budget(survival, torch.tensor(budget), floor=floor)
        assert torch.equal(as_tensor, got)


def test_top_budget_clamps_and_validates():
    survival = torch.tensor([[0.9, 0.8, 0.1], [0.5, 0.0, 0.0]])
    assert schedule_top_budget(survival, 3).tolist() == [2, 1]
    assert schedule_top_budget(survival, 3, max_len=1).tolist() == [1, 1]
    assert schedule_top_budget(survival, 0, min_len=1).tolist() == [1, 1]
    assert schedule_top_budget(survival, 10).tolist() == [3, 1]  # zeros are never admitted
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="budget"):
            schedule_top_budget(survival, bad)
    with pytest.raises(ConfigError, match="min_len"):
        schedule_top_budget(survival, 2, min_len=2, max_len=1)
    with pytest.raises(ShapeError):
        schedule_top_budget(survival, torch.tensor([2]))


def _quantized_survival(rng: random.Random, r: int, k: int) -> torch.Tensor:
    """Confidences that are multiples of 1/4: every product and sum is exact in binary, so a
    parallel GPU scan and the sequential CPU sum agree bit for bit."""
    c = torch.tensor([[rng.choice((0.0, 0.25, 0.5, 0.75, 1.0)) for _ in range(k)]
                      for _ in range(r)], dtype=torch.float32)
    return torch.cumprod(c, dim=1)


@pytest.mark.gpu
def test_gpu_matches_cpu_and_replays_in_a_cuda_graph():
    rng = random.Random(5)
    r, k = 6, 7
    table = _random_sps(rng, r * (k + 1) + 1).cuda()
    for _ in range(50):
        survival = _quantized_survival(rng, r, k)
        want = schedule_prefix(survival, table.cpu())
        assert torch.equal(schedule_prefix(survival.cuda(), table).cpu(), want)
        budget = rng.randint(0, r * k)
        assert torch.equal(schedule_top_budget(survival.cuda(), budget).cpu(),
                           schedule_top_budget(survival, budget))
    static = _quantized_survival(rng, r, k).cuda()
    budget = torch.tensor(9, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        schedule_prefix(static, table)
        schedule_top_budget(static, budget)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_prefix = schedule_prefix(static, table)
        out_budget = schedule_top_budget(static, budget)
    for _ in range(5):
        fresh = _quantized_survival(rng, r, k)
        static.copy_(fresh)
        budget.fill_(rng.randint(0, r * k))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out_prefix.cpu(), schedule_prefix(fresh, table.cpu()))
        assert torch.equal(out_budget.cpu(), schedule_top_budget(fresh, int(budget)))
