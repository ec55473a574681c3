"""Built-in selection strategies ``greedy`` and ``sample``, registered through the plugin hook."""

from __future__ import annotations

from pydantic import BaseModel

from draftsmith import hookimpl
from draftsmith.contract import Registrar, SelectorFamily, TokenSelector
from draftsmith.selection.configs import GreedyConfig, SampleConfig


def _build_greedy(config: BaseModel) -> TokenSelector:
    from draftsmith.selection.strategies import GreedySelector

    assert isinstance(config, GreedyConfig)
    return GreedySelector(config)


def _build_sample(config: BaseModel) -> TokenSelector:
    from draftsmith.selection.strategies import SampleSelector

    assert isinstance(config, SampleConfig)
    return SampleSelector(config)


GREEDY = SelectorFamily(
    name="greedy",
    summary="argmax in torch.argmax order; vocab-parallel pair exchange; strict acceptance",
    config_model=GreedyConfig,
    build=_build_greedy,
)

SAMPLE = SelectorFamily(
    name="sample",
    summary="temperature / top-k / top-p sampling with keyed Gumbel noise; rejection sampling",
    config_model=SampleConfig,
    build=_build_sample,
)


@hookimpl
def draftsmith_register_selectors(registrar: Registrar) -> None:
    """Register ``greedy`` and ``sample``."""
    registrar.add_selector(GREEDY)
    registrar.add_selector(SAMPLE)
