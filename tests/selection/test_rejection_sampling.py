"""Rejection sampling: a lossless first token (chi-square against ``p``), a residual that is a
distribution (falling back to ``p``), padding, keys."""

from __future__ import annotations

import pytest
import torch
from selection_helpers import chi_square_pvalue

from draftsmith.contract import SamplingKey, ShapeError
from draftsmith.selection.rejection import (
    acceptance_uniforms,
    rejection_sample,
    residual_distribution,
)

V = 8
TRIALS = 200_000


def _dist(seed: int, sharp: float = 1.0) -> torch.Tensor:
    return torch.softmax(torch.randn(V, generator=torch.Generator().manual_seed(seed)) * sharp, 0)


def _block(trials: int, k: int, seed: int = 0):
    """Target rows p_0..p_K and draft rows q_0..q_{K-1} (q != p), drafts sampled from q."""
    p = torch.stack([_dist(100 + j, 1.5) for j in range(k + 1)])
    q = torch.stack([_dist(200 + j, 1.0) for j in range(k)])
    q[0, 3] = 0.0  # the draft never proposes id 3 at slot 0
    q[0] /= q[0].sum()
    g = torch.Generator().manual_seed(seed)
    drafts = torch.stack([torch.multinomial(q[j], trials, replacement=True, generator=g)
                          for j in range(k)], dim=1)
    key = SamplingKey(seeds=torch.arange(trials) + 7 * seed, offsets=torch.full((trials,), 40))
    return p, q, drafts, key


@pytest.mark.parametrize("ragged,trials", [(False, TRIALS), (True, TRIALS // 2)])
def test_first_token_distribution_equals_target(ragged: bool, trials: int) -> None:
    k = 2
    p, q, drafts, key = _block(trials, k, seed=1)
    verify_len = (torch.arange(trials) % (k + 1)) if ragged else None
    accepted, n = rejection_sample(drafts, q.expand(trials, k, V), p.expand(trials, k + 1, V),
                                   key, verify_len)
    counts = torch.bincount(accepted[:, 0], minlength=V)
    assert chi_square_pvalue(counts, p[0]) > 1e-3
    # the draft distribution itself is rejected by the same test (the check has power)
    assert chi_square_pvalue(counts, q[0] + 1e-3) < 1e-6
    # the second committed token, where the first draft was accepted, follows p_1 as well
    second = accepted[(n >= 2) & (accepted[:, 0] == drafts[:, 0]), 1]
    assert chi_square_pvalue(torch.bincount(second, minlength=V), p[1]) > 1e-3


def test_output_layout_and_counts() -> None:
    k, g = 4, 500
    p, q, drafts, key = _block(g, k, seed=2)
    verify_len = torch.arange(g) % (k + 1)
    accepted, n = rejection_sample(drafts, q.expand(g, k, V).contiguous(),
                                   p.expand(g, k + 1, V).contiguous(), key, verify_len)
    assert accepted.shape == (g, k + 1) and accepted.dtype == n.dtype == torch.int64
    assert bool((n >= 1).all()) and bool((n <= verify_len + 1).all())
    cols = torch.arange(k + 1)
    assert bool((accepted[cols >= n[:, None]] == -1).all())
    prefix = cols[None, :k] < (n - 1)[:, None]
    assert torch.equal(accepted[:, :k][prefix], drafts[prefix])
    assert bool((accepted[torch.arange(g), n - 1] >= 0).all())
    assert (n == 1).any() and (n == k + 1).any()


def test_certain_accept_and_certain_reject() -> None:
    g, k = 64, 3
    p = torch.full((g, k + 1, V), 1.0 / V)
    drafts = torch.randint(0, V, (g, k), generator=torch.Generator().manual_seed(0))
    key = SamplingKey(torch.arange(g), torch.zeros(g, dtype=torch.int64))
    # q == p: u * q < p always holds (u < 1) -> every draft accepted, bonus from p_K
    accepted, n = rejection_sample(drafts, p[:, :k].clone(), p, key)
    assert bool((n == k + 1).all()) and torch.equal(accepted[:, :k], drafts)
    # the target gives the first draft zero mass -> always rejected, bonus from the residual
    p0 = p.clone()
    p0[torch.arange(g), 0, drafts[:, 0]] = 0.0
    p0[:, 0] /= p0[:, 0].sum(-1, keepdim=True)
    accepted, n = rejection_sample(drafts, p[:, :k].clone(), p0, key)
    assert bool((n == 1).all()) and bool((accepted[:, 0] != drafts[:, 0]).all())


def test_residual_distribution() -> None:
    p = torch.stack([_dist(s) for s in range(6)])
    q = torch.stack([_dist(s + 50) for s in range(6)])
    r = residual_distribution(p, q)
    assert bool((r >= 0).all())
    torch.testing.assert_close(r.sum(-1), torch.ones(6), rtol=0, atol=1e-6)
    want = (p - q).clamp_min(0)
    torch.testing.assert_close(r, want / want.sum(-1, keepdim=True), rtol=0, atol=1e-6)
    # p == q: no residual mass -> fall back to p
    torch.testing.assert_close(residual_distribution(p, p), p, rtol=0, atol=1e-6)
    # residual mass <= 1e-8 also falls back to p (DeepSpec's threshold, where z-lab needs exactly 0)
    tiny = p.clone()
    tiny[:, 0] += 5e-9
    torch.testing.assert_close(residual_distribution(tiny, p), tiny, rtol=0, atol=0)


def test_keyed_deterministic_and_global_rng_untouched() -> None:
    k, g = 3, 256
    p, q, drafts, key = _block(g, k, seed=3)
    args = (drafts, q.expand(g, k, V), p.expand(g, k + 1, V))
    state = torch.random.get_rng_state()
    a1, n1 = rejection_sample(*args, key)
    a2, n2 = rejection_sample(*args, key)
    assert torch.equal(a1, a2) and torch.equal(n1, n2)
    a3, _ = rejection_sample(*args, SamplingKey(key.seeds + 1, key.offsets))
    assert not torch.equal(a1, a3)
    assert torch.equal(state, torch.random.get_rng_state())
    u = acceptance_uniforms(key, k)
    assert u.shape == (g, k) and float(u.min()) > 0 and float(u.max()) < 1


def test_k_zero_samples_the_target() -> None:
    g = 5
    p = torch.stack([_dist(s) for s in range(g)])[:, None]
    key = SamplingKey(torch.arange(g), torch.zeros(g, dtype=torch.int64))
    accepted, n = rejection_sample(torch.zeros(g, 0, dtype=torch.int64),
                                   torch.zeros(g, 0, V), p, key)
    assert accepted.shape == (g, 1) and bool((n == 1).all())


def test_shape_errors() -> None:
    p, q, drafts, key = _block(4, 2)
    with pytest.raises(ShapeError, match="target_probs"):
        rejection_sample(drafts, q.expand(4, 2, V), p[:2].expand(4, 2, V), key)
    with pytest.raises(ShapeError, match="verify_len"):
        rejection_sample(drafts, q.expand(4, 2, V), p.expand(4, 3, V), key,
                         torch.tensor([0, 1, 2, 3]))
