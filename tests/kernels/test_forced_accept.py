"""Forced acceptance counts, capped by the ragged rule (``n <= verify_len + 1``), including a
forced mean above ``K``."""

from __future__ import annotations

import math

import pytest
import torch

from draftsmith.contract import ConfigError, ShapeError
from draftsmith.kernels.forced_accept import (
    FORCED_POOL_SIZE,
    forced_accept,
    forced_accept_pool,
    forced_accept_reference,
)

K = 7


def _run_both(forced: float, rows: int, steps: int, verify_len, device: str = "cpu"):
    pool = forced_accept_pool(device)
    counter_k = torch.zeros(1, dtype=torch.int64, device=device)
    counter_r = counter_k.clone()
    outs = []
    for _ in range(steps):
        n_k = torch.full((rows,), -5, dtype=torch.int64, device=device)
        n_r = n_k.clone()
        assert forced_accept(n_k, verify_len, pool, counter_k, forced, K) is n_k
        assert forced_accept_reference(n_r, verify_len, pool, counter_r, forced, K) is n_r
        assert torch.equal(n_k, n_r)
        assert torch.equal(counter_k, counter_r)
        outs.append(n_k.clone())
    return torch.stack(outs), int(counter_k.item())


def test_pool_is_the_seeded_cpu_stream() -> None:
    pool = forced_accept_pool()
    want = torch.rand(FORCED_POOL_SIZE, generator=torch.Generator().manual_seed(0xACCE9D))
    assert pool.dtype == torch.float32 and pool.shape == (65536,)
    assert torch.equal(pool, want)
    assert 0.0 <= pool.min().item() and pool.max().item() < 1.0


@pytest.mark.parametrize("forced", [0.5, 1.0, 2.25, 3.75, 6.5, 7.0, 7.5, 100.3])
@pytest.mark.parametrize("ragged", [False, True])
def test_kernel_equals_reference_over_steps(forced: float, ragged: bool) -> None:
    rows = 9
    verify_len = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 7]) if ragged else None
    counts, counter = _run_both(forced, rows, 4, verify_len)
    ip = math.floor(forced)
    base = min(ip + 1, K + 1)
    draws = forced > ip and base < K + 1
    assert counter == (4 if draws else 0)
    hi = min(base + 1, K + 1) if draws else base
    cap = (verify_len + 1) if ragged else torch.full((rows,), K + 1)
    assert bool(((counts >= torch.minimum(torch.tensor(base), cap)) & (counts <= hi)).all())
    assert bool((counts <= cap).all())


def test_f_above_k_clamps_and_ignores_the_fraction() -> None:
    counts, counter = _run_both(K + 0.9, 5, 2, None)
    assert counter == 0
    assert counts.eq(K + 1).all()
    counts, _ = _run_both(3 * K + 0.5, 5, 1, torch.tensor([0, 1, 2, 7, 3]))
    assert counts[0].tolist() == [1, 2, 3, 8, 4]


def test_fraction_frequency() -> None:
    """``n = base + 1`` happens with probability ``fr`` (pool draws through the counter)."""
    forced, rows, steps = 2.3, 64, 40
    counts, _ = _run_both(forced, rows, steps, None)
    assert set(counts.unique().tolist()) <= {3, 4}
    trials = rows * steps
    hits = int((counts == 4).sum())
    mean, sd = trials * 0.3, math.sqrt(trials * 0.3 * 0.7)
    assert abs(hits - mean) < 4.5 * sd, (hits, mean, sd)
    assert not torch.equal(counts[0], counts[1])  # fresh draws every step


def test_forced_rejects_bad_values() -> None:
    n = torch.zeros(3, dtype=torch.int64)
    pool, counter = forced_accept_pool(), torch.zeros(1, dtype=torch.int64)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError):
            forced_accept(n, None, pool, counter, bad, K)
    with pytest.raises(ShapeError):
        forced_accept(n, None, pool[:100], counter, 1.5, K)
    with pytest.raises(ShapeError):
        forced_accept(n, torch.zeros(4, dtype=torch.int64), pool, counter, 1.5, K)
    bad_inputs = (
        (n, None, pool[0], counter),  # a 0-d pool
        (n.float(), None, pool, counter),
        (n[::2], None, pool, counter),  # not contiguous
        (n, None, pool, torch.zeros(2, dtype=torch.int64)),
        (n, torch.zeros(3, dtype=torch.int32), pool, counter),
        (n[None], None, pool, counter),
    )
    for args in bad_inputs:
        with pytest.raises(ShapeError):
            forced_accept(*args, 1.5, K)
    with pytest.raises(ConfigError):
        forced_accept(n, None, pool, counter, 1.5, -1)


def test_the_ragged_cap_spec_examples() -> None:
    """Spec 3.4: a count of 6 made over the full window commits ``min(6, v + 1)``: (6, 2) -> 3,
    (6, 0) -> 1; an uncapped row keeps its 6."""
    pool = forced_accept_pool()
    v = torch.tensor([2, 0, 7, 5])
    for fn in (forced_accept, forced_accept_reference):
        n = torch.zeros(4, dtype=torch.int64)
        fn(n, v, pool, torch.zeros(1, dtype=torch.int64), 5.0, K)
        assert n.tolist() == [3, 1, 6, 6]


@pytest.mark.gpu
def test_gpu_graph_replay_draws_fresh_values() -> None:
    pool = forced_accept_pool("cuda")
    counter = torch.zeros(1, dtype=torch.int64, device="cuda")
    n = torch.zeros(128, dtype=torch.int64, device="cuda")
    verify_len = torch.randint(0, K + 1, (128,), generator=torch.Generator().manual_seed(2)).cuda()
    forced_accept(n, verify_len, pool, counter, 3.5, K)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        forced_accept(n, verify_len, pool, counter, 3.5, K)
    ref_counter = counter.clone()
    seen = []
    for _ in range(3):
        graph.replay()
        want = torch.empty_like(n)
        forced_accept_reference(want, verify_len, pool, ref_counter, 3.5, K)
        assert torch.equal(n, want) and torch.equal(counter, ref_counter)
        seen.append(n.clone())
    assert not torch.equal(seen[0], seen[1])
