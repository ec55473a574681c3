"""The optional members of the Protocols: an implementation without them reads as their declared
defaults, one with them is read as it defines them, and neither is needed for ``isinstance``."""

from __future__ import annotations

import pytest
import torch

from draftsmith.contract import (
    LogitsShard,
    SelectorCapabilities,
    SingleRank,
    TargetExtras,
    TokenSelector,
    drafter_extras,
    selector_extras,
    target_extras,
)


class _Plain:
    """A selector with the required members only."""

    @property
    def capabilities(self) -> SelectorCapabilities:
        return SelectorCapabilities(kind="plain", greedy=True)

    def prepare(self, **plan_choices) -> None:
        pass

    def select(self, logits, key, stream, collectives) -> torch.Tensor:
        return logits.logits.argmax(dim=1)

    def probs(self, logits, collectives) -> torch.Tensor:
        return torch.softmax(logits.logits, dim=1)


class _Route:
    kind = "local"
    reason = "the whole vocabulary is here"


class _Full(_Plain):
    """A selector that defines both optional members."""

    def select_with_probs(self, logits, key, stream, collectives):
        return torch.zeros(logits.logits.shape[0], dtype=torch.int64), logits.logits

    def route(self, tp_size: int, vocab_size: int) -> _Route:
        return _Route()


def _logits() -> LogitsShard:
    return LogitsShard(logits=torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 1.0]]), vocab_start=0,
                       vocab_size=3)


def test_a_selector_without_the_optional_members_gets_the_defaults() -> None:
    selector = _Plain()
    assert isinstance(selector, TokenSelector)
    extras = selector_extras(selector)
    tokens, probs = extras.select_with_probs(_logits(), None, 0, SingleRank())
    assert tokens.tolist() == [1, 0]
    assert torch.equal(probs, torch.softmax(_logits().logits, dim=1))
    assert extras.route is None


def test_a_selector_with_the_optional_members_is_read_as_it_defines_them() -> None:
    extras = selector_extras(_Full())
    tokens, probs = extras.select_with_probs(_logits(), None, 0, SingleRank())
    assert tokens.tolist() == [0, 0] and torch.equal(probs, _logits().logits)
    assert extras.route is not None
    assert extras.route(2, 3) == ("local", "the whole vocabulary is here")


def test_a_member_that_is_not_callable_counts_as_undefined() -> None:
    selector = _Plain()
    selector.route = "not a method"  # type: ignore[attr-defined]
    assert selector_extras(selector).route is None


class _Target:
    max_slots = 5
    layer_path = "transformers"


def test_a_target_reads_its_own_members_and_the_defaults_for_the_rest() -> None:
    assert target_extras(object()) == TargetExtras()  # type: ignore[arg-type]
    assert target_extras(_Target()) == TargetExtras(max_slots=5,  # type: ignore[arg-type]
                                                    layer_path="transformers")
    assert TargetExtras() == TargetExtras(layer_path="own", layer_path_reason="",
                                          layers_split=False, max_slots=None,
                                          max_position_embeddings=None)


@pytest.mark.parametrize("table", [None, torch.tensor([1.0, 0.5])])
def test_a_drafter_s_sts_table_is_read_when_it_has_one(table) -> None:
    class Calibrated:
        sts_temperatures = table

    assert drafter_extras(object()).sts_temperatures is None  # type: ignore[arg-type]
    assert drafter_extras(Calibrated()).sts_temperatures is table  # type: ignore[arg-type]
