"""Swapping strategies is a configuration change only: greedy -> sample -> a plugin strategy,
each validated by SpecConfig against the registry and built through its SelectorFamily."""

from __future__ import annotations

from typing import Literal

import pytest
import torch
from pydantic import BaseModel, ConfigDict, Field

import draftsmith
from draftsmith.contract import (
    ConfigError,
    LogitsShard,
    SamplingKey,
    SelectorCapabilities,
    SelectorFamily,
    SingleRank,
    TokenSelector,
)
from draftsmith.runtime.config import SpecConfig
from draftsmith.runtime.registry import load_registry, make_plugin_manager
from draftsmith.selection.strategies import GreedySelector, SampleSelector


class LowestOfTopConfig(BaseModel):
    """Test strategy: the lowest id among the ``width`` best logits."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    kind: Literal["lowest-of-top"] = "lowest-of-top"
    """Strategy name."""
    width: int = Field(default=3, ge=1)
    """How many of the best logits to consider."""


class LowestOfTop:
    def __init__(self, config: LowestOfTopConfig) -> None:
        self.config = config

    @property
    def capabilities(self) -> SelectorCapabilities:
        return SelectorCapabilities(kind="lowest-of-top", greedy=True)

    def prepare(self, **_plan_choices) -> None:
        pass

    def select(self, logits, key, stream, collectives) -> torch.Tensor:
        top = torch.topk(logits.logits.float(), self.config.width, dim=1).indices
        return top.min(dim=1).values + logits.vocab_start

    def probs(self, logits, collectives) -> torch.Tensor:
        token = self.select(logits, None, 0, collectives)
        return torch.nn.functional.one_hot(token, logits.vocab_size).float()


class LowestOfTopPlugin:
    @draftsmith.hookimpl
    def draftsmith_register_selectors(self, registrar) -> None:
        registrar.add_selector(SelectorFamily(
            name="lowest-of-top", summary="test strategy", config_model=LowestOfTopConfig,
            build=lambda cfg: LowestOfTop(cfg),
        ))


@pytest.fixture
def registry():
    pm = make_plugin_manager(extra_plugins=[LowestOfTopPlugin()], load_entrypoints=False)
    return load_registry(pm)


def _build(registry, selection: dict) -> TokenSelector:
    config = SpecConfig.from_dict({"selection": selection}, registry=registry)
    selector = registry.selector(config.selection.kind).build(config.selection)
    assert isinstance(selector, TokenSelector)
    return selector


def test_switching_is_configuration_only(registry) -> None:
    logits = LogitsShard.full(torch.tensor([[0.0, 5.0, 1.0, 4.0, 4.5, -1.0]] * 3))
    key = SamplingKey(torch.arange(3), torch.zeros(3, dtype=torch.int64))

    greedy = _build(registry, {"kind": "greedy"})
    assert isinstance(greedy, GreedySelector) and greedy.capabilities.greedy
    assert greedy.select(logits, None, 0, SingleRank()).tolist() == [1, 1, 1]

    sample = _build(registry, {"kind": "sample", "temperature": 0.8, "top_k": 2, "seed": 5})
    assert isinstance(sample, SampleSelector) and not sample.capabilities.greedy
    assert sample.capabilities.filters == ("top-k = 2",) and sample.capabilities.default_seed == 5
    picked = sample.select(logits, key, 0, SingleRank())
    assert set(picked.tolist()) <= {1, 4}
    probs = sample.probs(logits, SingleRank())
    assert torch.equal(probs[0] > 0, torch.tensor([False, True, False, False, True, False]))

    plugin = _build(registry, {"kind": "lowest-of-top", "width": 3})
    assert plugin.select(logits, None, 0, SingleRank()).tolist() == [1, 1, 1]
    plugin = _build(registry, {"kind": "lowest-of-top", "width": 5})
    assert plugin.select(logits, None, 0, SingleRank()).tolist() == [0, 0, 0]


@pytest.mark.parametrize("selection,field", [
    ({"kind": "sample", "temperature": -0.5}, "temperature"),
    ({"kind": "sample", "top_p": 0.0}, "top_p"),
    ({"kind": "sample", "top_p": 1.5}, "top_p"),
    ({"kind": "sample", "top_k": -1}, "top_k"),
    ({"kind": "sample", "acceptance": "maybe"}, "acceptance"),
    ({"kind": "lowest-of-top", "width": 0}, "width"),
    ({"kind": "greedy", "temperature": 1.0}, "temperature"),
])
def test_invalid_fields_raise_config_error_naming_the_field(registry, selection, field) -> None:
    with pytest.raises(ConfigError, match=rf"selection\.{field}"):
        SpecConfig.from_dict({"selection": selection}, registry=registry)


def test_unknown_strategy_lists_the_valid_ones(registry) -> None:
    with pytest.raises(ConfigError, match="lowest-of-top"):
        SpecConfig.from_dict({"selection": {"kind": "nucleus"}}, registry=registry)
    # without the plugin the same config is rejected
    with pytest.raises(ConfigError, match="lowest-of-top"):
        SpecConfig.from_dict({"selection": {"kind": "lowest-of-top"}},
                             registry=load_registry(make_plugin_manager(load_entrypoints=False)))
