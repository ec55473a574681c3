"""Bad selection inputs raise a DraftsmithError that says what to change, not a bare torch error."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from draftsmith.contract import ConfigError, DraftsmithError, SamplingKey, ShapeError
from draftsmith.runtime.config import SpecConfig
from draftsmith.selection.configs import SampleConfig
from draftsmith.selection.rejection import rejection_sample, residual_distribution
from draftsmith.selection.sampling import filtered_probs, sample_from_probs

V = 16
HINT = "use 0 for greedy or a temperature >= 1e-5"


@pytest.mark.parametrize("temperature", [1e-40, 5e-324, 9.99e-6, float("inf"), float("nan"),
                                         "inf", "1e-40"])
def test_unusable_temperature_is_a_config_error(temperature: object) -> None:
    with pytest.raises(ConfigError) as info:
        SpecConfig.from_dict({"selection": {"kind": "sample", "temperature": temperature}})
    text = str(info.value)
    assert text.startswith("selection.temperature: ") and len(text.splitlines()) == 1, text
    if temperature != "nan":  # the string "nan" fails the ">= 0" bound first
        assert HINT in text
    with pytest.raises(ValidationError, match="temperature"):
        SampleConfig(temperature=temperature)


@pytest.mark.parametrize("temperature", [0.0, 1e-5, 0.7, 100.0])
def test_usable_temperatures_are_kept(temperature: float) -> None:
    assert SampleConfig(temperature=temperature).temperature == temperature


def test_smallest_temperature_gives_a_distribution() -> None:
    # the subnormal temperatures refused above overflow z / T to inf and give NaN probabilities
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(0)) * 5
    assert bool(torch.isnan(filtered_probs(logits, 1e-40)).any())
    probs = filtered_probs(logits, SampleConfig(temperature=1e-5).temperature)
    assert bool(torch.isfinite(probs).all())
    assert torch.equal(probs.argmax(1), logits.argmax(1))


def _block(g: int = 3, k: int = 2):
    gen = torch.Generator().manual_seed(1)
    q = torch.softmax(torch.randn(g, k, V, generator=gen), -1)
    p = torch.softmax(torch.randn(g, k + 1, V, generator=gen), -1)
    drafts = torch.randint(0, V, (g, k), generator=gen)
    key = SamplingKey(torch.arange(g), torch.zeros(g, dtype=torch.int64))
    return drafts, q, p, key


@pytest.mark.parametrize("bad_id", [V, -1, 2**40])
def test_rejection_sample_rejects_draft_ids_outside_the_vocabulary(bad_id: int) -> None:
    drafts, q, p, key = _block()
    drafts[1, 1] = bad_id
    with pytest.raises(ShapeError, match=f"draft_tokens must be token ids in 0..V-1 = 0..{V - 1}"):
        rejection_sample(drafts, q, p, key)
    # also when that position would not be verified: the id still indexes the distributions
    with pytest.raises(ShapeError, match="draft_tokens"):
        rejection_sample(drafts, q, p, key, torch.tensor([2, 1, 2]))


def test_rejection_sample_accepts_boundary_ids_and_still_checks_verify_len() -> None:
    drafts, q, p, key = _block()
    drafts[0] = torch.tensor([0, V - 1])
    accepted, n = rejection_sample(drafts, q, p, key)
    assert accepted.shape == (3, 3) and bool(((n >= 1) & (n <= 3)).all())
    with pytest.raises(ShapeError, match="verify_len must lie in 0..K = 0..2"):
        rejection_sample(drafts, q, p, key, torch.tensor([0, 3, -1]))


def test_residual_distribution_shapes_must_match() -> None:
    p = torch.softmax(torch.randn(3, V), -1)
    with pytest.raises(ShapeError, match=r"q dim 0 must be 3 \[3, 16\], got shape \(2, 16\)"):
        residual_distribution(p, p[:2])
    with pytest.raises(ShapeError, match="q dim 1 must be 16"):
        residual_distribution(p, p[:, :8])
    with pytest.raises(ShapeError, match="q must be a torch.Tensor"):
        residual_distribution(p, p.tolist())
    with pytest.raises(ShapeError, match="scalar"):
        residual_distribution(torch.tensor(1.0), torch.tensor(1.0))


def test_sample_from_probs_rows_must_match_the_key() -> None:
    probs = torch.softmax(torch.randn(4, V), -1)
    key = SamplingKey(torch.arange(3), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ShapeError, match=r"key.seeds dim 0 \(rows\) must be 4"):
        sample_from_probs(probs, key, 0)
    key4 = SamplingKey(torch.arange(4), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(ShapeError, match=r"offsets dim 0 \(rows\) must be 4"):
        sample_from_probs(probs, key4, 0, offsets=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ShapeError, match="probs must have dtype float32"):
        sample_from_probs(probs.double(), key4, 0)
    with pytest.raises(ShapeError, match="probs must have 2 dims"):
        sample_from_probs(probs[0], key4, 0)
    assert sample_from_probs(probs, key4, 0).shape == (4,)


def test_errors_are_draftsmith_errors() -> None:
    assert issubclass(ShapeError, DraftsmithError) and issubclass(ConfigError, DraftsmithError)


@pytest.mark.gpu
def test_value_checks_are_skipped_while_capturing_a_graph() -> None:
    """The draft id and verify_len range checks read back to the host, which a CUDA graph
    capture cannot do: they are skipped there, and the captured graph replays correctly."""
    drafts, q, p, key = _block()
    drafts, q, p = drafts.cuda(), q.cuda(), p.cuda()
    key = SamplingKey(key.seeds.cuda(), key.offsets.cuda())
    verify_len = torch.tensor([2, 1, 0], device="cuda")
    want = rejection_sample(drafts, q, p, key, verify_len)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        rejection_sample(drafts, q, p, key, verify_len)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = rejection_sample(drafts, q, p, key, verify_len)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
