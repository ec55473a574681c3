"""gumbel_pair: kernel == reference (bit for bit on the CPU; the same ids, close values on a GPU),
skip == no-skip, greedy rows == argmax, TP-split invariance for even and uneven splits (the
same token for every split). Distribution tests live in tests/selection/test_selection_sampling.py."""

from __future__ import annotations

import math

import pytest
import torch

from draftsmith.contract import ShapeError
from draftsmith.kernels import _pair
from draftsmith.kernels import gumbel_pair as gp
from draftsmith.kernels.argmax_pair import EXCHANGE_COLUMNS, argmax_pair_reference
from draftsmith.kernels.gumbel_pair import (
    G_MAX,
    G_MIN,
    GUMBEL_SPAN,
    gumbel_from_uniform,
    gumbel_pair,
    gumbel_pair_reference,
)

CPU_SHAPES = [(7, 77), (3, 8192), (1, 19360)]
GPU_SHAPES = [(1, 19360), (6, 19360), (7, 77), (9, 38720), (3, 8192), (2, 151936)]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def make_case(rows: int, v: int, seed: int = 0, scale: float = 4.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, v, generator=g) * scale
    temps = torch.rand(rows, generator=g) + 0.25
    temps[0] = 0.0  # a greedy row
    seeds = torch.randint(0, 2**62, (rows,), generator=g)
    offsets = torch.randint(0, 2**40, (rows,), generator=g)
    return x, temps, seeds, offsets


def test_constants() -> None:
    assert math.isclose(G_MAX, 16.63553, abs_tol=1e-5)
    assert math.isclose(G_MIN, -2.81154, abs_tol=1e-5)
    assert math.isclose(GUMBEL_SPAN, 19.44707, abs_tol=1e-5)
    u = torch.tensor([2.0**-24, 1 - 2.0**-24, 0.5])
    g = gumbel_from_uniform(u)
    assert float(g[0]) == G_MIN and float(g[1]) == G_MAX
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("rows,v", CPU_SHAPES)
def test_kernel_equals_reference_fp32(rows: int, v: int) -> None:
    x, temps, seeds, offsets = make_case(rows, v, seed=v)
    out = torch.full((rows, EXCHANGE_COLUMNS), float("nan"))
    ref = gumbel_pair_reference(x, temps, seeds, offsets, 1, 500, out.clone(), 2)
    got = gumbel_pair(x, temps, seeds, offsets, 1, 500, out.clone(), 2)
    assert torch.equal(got[:, 4], ref[:, 4])  # indices
    assert torch.equal(bits(got), bits(ref))  # fp64 logs: identical after rounding


def test_an_exact_score_tie_resolves_alike_in_kernel_and_reference() -> None:
    """Ids ``a < b`` tie exactly on ``s = z / T + g``, at an ``a`` whose fp32 noise differs by an
    ulp between torch and numpy (the interpreter's ``log``): with fp32 logs the kernel picked
    ``b``; with the fp64 noise both take ``a``, the lowest id of the tie."""
    import numpy as np

    from draftsmith.kernels.philox import philox_uniform_reference

    width, seeds, offsets = 4096, torch.tensor([-7]), torch.tensor([2**35])
    u = philox_uniform_reference(seeds, offsets, torch.arange(width), 0)[0]
    g = gumbel_from_uniform(u)
    fp32_torch = (-torch.log(-torch.log(u))).clamp(G_MIN, G_MAX)
    fp32_numpy = torch.from_numpy(np.clip(-np.log(-np.log(u.numpy())), np.float32(G_MIN),
                                          np.float32(G_MAX)).astype(np.float32))
    # where the fp32 logs disagree (on this CPU a third of the ids); any id elsewhere
    differs = torch.nonzero(fp32_torch != fp32_numpy)[:, 0].tolist() or list(range(width))
    case = None
    for a in differs:
        for b in range(a + 1, width):
            z_b = (g[a] - g[b]).to(torch.float32)
            if z_b + g[b] == g[a]:
                case = a, b, float(z_b)
                break
        if case:
            break
    assert case is not None
    a, b, z_b = case
    x = torch.full((1, width), float("-inf"))
    x[0, a], x[0, b] = 0.0, z_b
    temps = torch.ones(1)
    ref = gumbel_pair_reference(x, temps, seeds, offsets, 0)
    got = gumbel_pair(x, temps, seeds, offsets, 0)
    assert int(ref[0, 0]) == a
    assert torch.equal(bits(got), bits(ref))


@pytest.mark.parametrize("rows,v", CPU_SHAPES)
def test_skip_equals_no_skip(rows: int, v: int) -> None:
    x, temps, seeds, offsets = make_case(rows, v, seed=1, scale=12.0)  # many dominated ids
    for fn in (gumbel_pair_reference, gumbel_pair):
        a = fn(x, temps, seeds, offsets, 0, 0, None, 0, True)
        b = fn(x, temps, seeds, offsets, 0, 0, None, 0, False)
        assert torch.equal(bits(a), bits(b))


def test_many_chunks_per_row(monkeypatch) -> None:
    """Small tiles over many chunks per row merge in order T, with skipped tiles and a NaN."""
    x, temps, seeds, offsets = make_case(3, 8192, seed=4, scale=12.0)  # many dominated ids
    x[2, 4000] = float("nan")
    want = gumbel_pair_reference(x, temps, seeds, offsets, 2, 64)
    monkeypatch.setattr(gp, "_launch_sizes", lambda *_: (256, 1))
    monkeypatch.setattr(_pair, "PROGRAMS_PER_SM", 16)
    for skip in (True, False):
        got = gumbel_pair(x, temps, seeds, offsets, 2, 64, None, 0, skip)
        assert torch.equal(bits(got), bits(want))
    counts = gp._SCRATCH._by_device[torch.device("cpu")][0]
    assert not counts.any()


def test_greedy_rows_equal_argmax_pair() -> None:
    x, _, seeds, offsets = make_case(4, 333)
    x[1, 7] = float("nan")
    x[2] = float("-inf")
    temps = torch.zeros(4)
    want = argmax_pair_reference(x, 10)
    for fn in (gumbel_pair_reference, gumbel_pair):
        assert torch.equal(bits(fn(x, temps, seeds, offsets, 0, 10)), bits(want))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_nan_and_inf_rows() -> None:
    x, temps, seeds, offsets = make_case(4, 200)
    temps[:] = 0.8
    x[0, 150] = float("nan")  # NaN wins (never skipped), even when dominated-looking
    x[0, 3] = 1e30
    x[1] = float("-inf")  # all -inf -> id 0
    x[2, 20] = float("inf")
    x[2, 90] = float("inf")  # +inf ties: Gumbel noise is finite, +inf + g = +inf -> first
    for fn in (gumbel_pair_reference, gumbel_pair):
        pair = fn(x, temps, seeds, offsets, 1, 0)
        assert pair[:, 0].tolist()[:3] == [150.0, 0.0, 20.0]


def _split_token(x, temps, seeds, offsets, tp: int, fn) -> torch.Tensor:
    """Emulate TP ranks in one process: per-shard pairs summed into one staging buffer."""
    v = x.shape[1]
    s = v // tp
    total = torch.zeros(x.shape[0], EXCHANGE_COLUMNS)
    for rank in range(tp):
        staging = torch.empty(x.shape[0], EXCHANGE_COLUMNS)
        fn(x[:, rank * s:(rank + 1) * s], temps, seeds, offsets, 1, rank * s, staging, rank)
        total += staging
    winner = torch.argmax(total[:, 1:2 * tp:2], dim=1)
    return total.gather(1, 2 * winner[:, None])[:, 0].long()


@pytest.mark.parametrize("fn,rows", [(gumbel_pair_reference, 6), (gumbel_pair, 3)])
def test_same_token_for_every_tp_split(fn, rows: int) -> None:
    x, temps, seeds, offsets = make_case(rows, 256, seed=3, scale=2.0)
    temps[1:] = 1.0
    tokens = [_split_token(x, temps, seeds, offsets, tp, fn) for tp in (1, 2, 4, 8)]
    for t in tokens[1:]:
        assert torch.equal(t, tokens[0])
    full = fn(x, temps, seeds, offsets, 1, 0)[:, 0].long()
    assert torch.equal(tokens[0], full)
    assert not torch.equal(full[1:], torch.argmax(x[1:], dim=1))  # noise actually moved picks


@pytest.mark.parametrize("fn", [gumbel_pair_reference, gumbel_pair])
def test_same_token_for_uneven_splits(fn) -> None:
    """Shard borders that cut through a Philox call (ids 4q .. 4q+3 share one): the kernel reads
    such a shard from a column phase of 1, 2 or 3, and the token stays the full row's."""
    x, temps, seeds, offsets = make_case(3, 203, seed=6, scale=1.5)
    temps[0] = 0.9
    full = fn(x, temps, seeds, offsets, 0, 0)[:, 0].long()
    for cut in (37, 38, 39, 101):
        total = torch.zeros(3, EXCHANGE_COLUMNS)
        for rank, (lo, hi) in enumerate(((0, cut), (cut, 203))):
            staging = torch.empty(3, EXCHANGE_COLUMNS)
            fn(x[:, lo:hi], temps, seeds, offsets, 0, lo, staging, rank)
            total += staging
        winner = torch.argmax(total[:, 1:4:2], dim=1)
        assert torch.equal(total.gather(1, 2 * winner[:, None])[:, 0].long(), full), cut


def test_launcher_validates() -> None:
    x, temps, seeds, offsets = make_case(3, 64)
    with pytest.raises(ShapeError, match="temperatures"):
        gumbel_pair(x, temps.double(), seeds, offsets, 0)
    with pytest.raises(ShapeError, match="offsets"):
        gumbel_pair(x, temps, seeds, offsets[:2], 0)
    with pytest.raises(ShapeError, match="stream"):
        gumbel_pair_reference(x, temps, seeds, offsets, -2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows,v", GPU_SHAPES)
def test_kernel_equals_reference_gpu(rows: int, v: int, dtype: torch.dtype) -> None:
    x, temps, seeds, offsets = make_case(rows, v, seed=v)
    x = x.to(dtype)
    ref = gumbel_pair_reference(x, temps, seeds, offsets, 0, 0)
    got = gumbel_pair(*(t.cuda() for t in (x, temps, seeds, offsets)), 0, 0).cpu()
    assert torch.equal(got[:, 0], ref[:, 0])
    torch.testing.assert_close(got[:, 1], ref[:, 1], rtol=4e-6, atol=4e-6)
    no_skip = gumbel_pair(*(t.cuda() for t in (x, temps, seeds, offsets)), 0, 0, None, 0, False)
    assert torch.equal(bits(no_skip.cpu()), bits(got))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_close_to_the_cuda_reference(dtype: torch.dtype) -> None:
    """On CUDA the kernel's outer logarithm is the hardware approximation: every id equals the
    CUDA reference's (scores this close to a tie do not occur here) and every score is within a
    few 1e-7 of it."""
    x, temps, seeds, offsets = make_case(64, 163840, seed=8)
    args = [t.cuda() for t in (x.to(dtype), temps, seeds, offsets)]
    got = gumbel_pair(*args, 1, 0)
    want = gumbel_pair_reference(*args, 1, 0)
    assert torch.equal(got[:, 0], want[:, 0])
    torch.testing.assert_close(got[:, 1], want[:, 1], rtol=2e-6, atol=2e-6)


@pytest.mark.gpu
def test_graph_replay_draws_fresh_noise() -> None:
    rows, v = 8, 163840
    x = torch.randn(rows, v, generator=torch.Generator().manual_seed(5)).to("cuda", torch.bfloat16)
    temps = torch.ones(rows, device="cuda")
    seeds = torch.arange(rows, device="cuda", dtype=torch.int64)
    offsets = torch.zeros(rows, device="cuda", dtype=torch.int64)
    out = torch.zeros(rows, EXCHANGE_COLUMNS, device="cuda")
    gumbel_pair(x, temps, seeds, offsets, 0, 0, out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gumbel_pair(x, temps, seeds, offsets, 0, 0, out)
    seen = []
    for step in range(3):
        offsets.fill_(step)
        graph.replay()
        eager = gumbel_pair(x, temps, seeds, offsets, 0, 0)
        assert torch.equal(bits(out[:, :2]), bits(eager))
        seen.append(out[:, 0].clone())
    assert not torch.equal(seen[0], seen[1])
