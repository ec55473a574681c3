"""Keyed sampling: distributions (chi-square), top-k / top-p semantics against z-lab DFlash's
``_sampling_probs``, determinism, and independence from the torch global RNG."""

from __future__ import annotations

import pytest
import torch
from selection_helpers import chi_square_pvalue

from draftsmith.contract import DraftsmithError, LogitsShard, SamplingKey, SingleRank
from draftsmith.selection.configs import SampleConfig
from draftsmith.selection.sampling import filtered_probs, sample_from_probs
from draftsmith.selection.strategies import GreedySelector, SampleSelector

TRIALS = 20_000


def _many_draws(logits_row: torch.Tensor, config: SampleConfig, stream: int = 0,
                trials: int = TRIALS) -> torch.Tensor:
    """One draw per trial: the same row, one key per trial (distinct offsets and seeds), on the
    row's device (on CUDA temperature-only rows take the ``gumbel_pair`` kernel)."""
    dev = logits_row.device
    rows = logits_row.expand(trials, -1).contiguous()
    key = SamplingKey(seeds=torch.arange(trials, device=dev) % 7 + 12345,
                      offsets=torch.arange(trials, device=dev))
    return SampleSelector(config).select(LogitsShard.full(rows), key, stream, SingleRank())


DISTRIBUTIONS = [
    ("uniformish-v8", torch.tensor([0.1, 0.3, -0.2, 0.0, 0.5, -0.4, 0.2, 0.05]),
     SampleConfig(temperature=1.0)),
    ("peaked-v40-T0.5", torch.linspace(-3, 2, 40), SampleConfig(temperature=0.5)),
    ("topk-topp-v16", torch.randn(16, generator=torch.Generator().manual_seed(2)),
     SampleConfig(temperature=0.9, top_k=6, top_p=0.85)),
    ("topp-only-v12", torch.randn(12, generator=torch.Generator().manual_seed(5)),
     SampleConfig(temperature=1.5, top_p=0.6)),
]


@pytest.mark.parametrize("name,row,config", DISTRIBUTIONS, ids=[d[0] for d in DISTRIBUTIONS])
def test_sampled_distribution_chi_square(name: str, row: torch.Tensor,
                                         config: SampleConfig) -> None:
    tokens = _many_draws(row[None], config)
    counts = torch.bincount(tokens, minlength=row.numel())
    probs = SampleSelector(config).probs(LogitsShard.full(row[None]), SingleRank())[0]
    assert chi_square_pvalue(counts, probs) > 1e-3


@pytest.mark.parametrize("row", [torch.zeros(4), torch.zeros(8), torch.tensor(
    [0.0, 0.1, 0.2, 0.3, 1.0, 0.9, 0.8, 0.7])], ids=["flat-v4", "flat-v8", "two-calls-v8"])
def test_ids_sharing_a_philox_call_sample_independently(row: torch.Tensor) -> None:
    """Ids ``4q .. 4q+3`` draw their noise from the four words of one Philox call: a flat or
    mildly tilted row over one or two calls is still sampled as ``softmax``."""
    tokens = _many_draws(row[None], SampleConfig(temperature=1.0))
    probs = torch.softmax(row, dim=0)
    assert chi_square_pvalue(torch.bincount(tokens, minlength=row.numel()), probs) > 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("name,row,config", DISTRIBUTIONS, ids=[d[0] for d in DISTRIBUTIONS])
def test_kernel_sampled_distribution_chi_square_gpu(name: str, row: torch.Tensor,
                                                     config: SampleConfig) -> None:
    """On CUDA, the ``gumbel_pair`` kernel (its own logarithms) samples ``softmax(z / T)`` and
    the filtered rows (Philox-kernel noise over the kept candidates) their filtered
    distribution: 200000 draws, one key each."""
    tokens = _many_draws(row[None].cuda(), config, trials=200_000).cpu()
    counts = torch.bincount(tokens, minlength=row.numel())
    probs = SampleSelector(config).probs(LogitsShard.full(row[None]), SingleRank())[0]
    assert chi_square_pvalue(counts, probs) > 1e-3


def test_chi_square_detects_a_wrong_distribution() -> None:
    row = torch.linspace(-3, 2, 40)
    tokens = _many_draws(row[None], SampleConfig(temperature=0.5))
    wrong = torch.softmax(row / 0.6, dim=0)  # a slightly different temperature
    assert chi_square_pvalue(torch.bincount(tokens, minlength=40), wrong) < 1e-6


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.5, 12, 0.6), (2.0, 100, 0.95), (1.0, 1, 1.0),
])
def test_filter_semantics_match_dflash(temperature: float, top_k: int, top_p: float) -> None:
    import dflash.model as dflash_model  # the z-lab reference (make test installs it)
    logits = torch.randn(6, 100, generator=torch.Generator().manual_seed(top_k)) * 3
    want = dflash_model._sampling_probs(logits, temperature, top_p, top_k)
    got = filtered_probs(logits, temperature, top_k, top_p)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(got > 0, want > 0)  # the same kept set


def test_top_k_keeps_exactly_k_with_ties_to_lower_ids() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.0, 2.0]])
    probs = filtered_probs(logits, 1.0, 2, 1.0)
    assert (probs > 0).nonzero()[:, 1].tolist() == [1, 2]


def test_top_p_keeps_the_prefix_whose_mass_before_is_below_p() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    got = filtered_probs(probs.log(), 1.0, 0, 0.8)  # mass before: 0, .5, .8, .95
    torch.testing.assert_close(got, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    one = filtered_probs(probs.log(), 1.0, 0, 0.01)  # always keeps the top one
    assert torch.equal(one, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))


def test_sampling_is_keyed_and_leaves_global_rng_alone() -> None:
    logits = LogitsShard.full(torch.randn(64, 300, generator=torch.Generator().manual_seed(0)))
    key = SamplingKey(torch.arange(64), torch.full((64,), 17))
    state = torch.random.get_rng_state()
    for config in (SampleConfig(temperature=1.0), SampleConfig(top_k=20),
                   SampleConfig(top_p=0.9)):
        sel = SampleSelector(config)
        a = sel.select(logits, key, 1, SingleRank())
        assert torch.equal(a, sel.select(logits, key, 1, SingleRank()))
        other_stream = sel.select(logits, key, 0, SingleRank())
        later = sel.select(logits, SamplingKey(key.seeds, key.offsets + 1), 1, SingleRank())
        assert not torch.equal(a, other_stream) and not torch.equal(a, later)
    assert torch.equal(state, torch.random.get_rng_state())


def test_temperature_zero_is_argmax_and_key_optional() -> None:
    logits = LogitsShard.full(torch.randn(5, 50))
    sel = SampleSelector(SampleConfig(temperature=0.0, top_p=0.5))
    assert sel.capabilities.greedy and sel.capabilities.filters == ()
    want = torch.argmax(logits.logits, dim=1)
    assert torch.equal(sel.select(logits, None, 0, SingleRank()), want)
    assert torch.equal(GreedySelector().select(logits, None, 0, SingleRank()), want)
    assert torch.equal(sel.probs(logits, SingleRank()).argmax(1), want)


def test_sampling_without_key_is_an_error() -> None:
    with pytest.raises(DraftsmithError, match="SamplingKey"):
        SampleSelector(SampleConfig()).select(LogitsShard.full(torch.randn(2, 8)), None, 0,
                                              SingleRank())


def test_sample_from_probs_distribution() -> None:
    p = torch.tensor([0.05, 0.0, 0.4, 0.25, 0.3])
    key = SamplingKey(torch.full((TRIALS,), 99), torch.arange(TRIALS))
    tokens = sample_from_probs(p.expand(TRIALS, -1), key, 0)
    assert chi_square_pvalue(torch.bincount(tokens, minlength=5), p) > 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_selectors_match_cpu(dtype: torch.dtype) -> None:
    """On CUDA the selectors run the Triton kernels (the pair kernels; the Philox kernel for the
    keyed noise of top-k / top-p candidates); tokens equal the CPU references, and the one-sort
    select_with_probs equals select and probs there."""
    x = (torch.randn(32, 163840, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
    key = SamplingKey(torch.arange(32), torch.arange(32) * 3)
    cuda_key = SamplingKey(key.seeds.cuda(), key.offsets.cuda())
    for sel in (GreedySelector(), SampleSelector(SampleConfig(temperature=0.7)),
                SampleSelector(SampleConfig(temperature=1.0, top_k=50)),
                SampleSelector(SampleConfig(temperature=0.7, top_p=0.95)),
                SampleSelector(SampleConfig(temperature=0.9, top_k=40, top_p=0.8))):
        cpu = sel.select(LogitsShard.full(x), key, 1, SingleRank())
        gpu = sel.select(LogitsShard.full(x.cuda()), cuda_key, 1, SingleRank())
        assert torch.equal(gpu.cpu(), cpu)
        tokens, probs = sel.select_with_probs(LogitsShard.full(x.cuda()), cuda_key, 1,
                                              SingleRank())
        assert torch.equal(tokens, gpu)
        assert torch.equal(probs, sel.probs(LogitsShard.full(x.cuda()), SingleRank()))


@pytest.mark.parametrize("config", [
    SampleConfig(temperature=0.7, top_p=0.95), SampleConfig(temperature=0.7, top_k=40),
    SampleConfig(temperature=1.3, top_k=300, top_p=0.8), SampleConfig(temperature=0.7),
    SampleConfig(temperature=0.0),
])
def test_select_with_probs_equals_select_and_probs(config: SampleConfig) -> None:
    """The drafter chain's one-sort path gives the tokens and the distribution of the two
    separate calls, bit for bit (bf16-like ties included)."""
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(7, 1001, generator=g) * 3).to(torch.bfloat16).float()
    shard = LogitsShard.full(logits)
    key = SamplingKey(seeds=torch.arange(7) * 11 + 3, offsets=torch.arange(7) + 40)
    selector = SampleSelector(config)
    tokens, probs = selector.select_with_probs(shard, key, 1, SingleRank())
    assert torch.equal(tokens, selector.select(shard, key, 1, SingleRank()))
    assert torch.equal(probs, selector.probs(shard, SingleRank()))
    if config.temperature > 0:
        with pytest.raises(DraftsmithError, match="rows"):
            selector.select_with_probs(shard, SamplingKey(seeds=key.seeds[:3],
                                                          offsets=key.offsets[:3]), 1,
                                       SingleRank())
