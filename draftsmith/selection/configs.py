"""Validated configs of the built-in selection strategies (one tagged variant each) and what a
strategy bound to each declares (:func:`capabilities_of`)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from draftsmith.contract import SelectorCapabilities

MIN_TEMPERATURE = 1e-5
"""Smallest positive temperature; below it ``z / T`` overflows (DeepSpec treats it as greedy)."""


class GreedyConfig(BaseModel):
    """Deterministic argmax in torch.argmax order; verification is strict token matching."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    kind: Literal["greedy"] = "greedy"
    """Strategy name."""
    vocab_parallel: bool = True
    """Under tensor parallelism, select on the vocabulary shards where the plan allows it;
    ``false`` all-gathers the logits on every rank first (the path vocab-parallel selection is
    measured against; the plan records it as a gather)."""


class SampleConfig(BaseModel):
    """Temperature sampling with optional top-k / top-p; lossless rejection-sampling verification."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    kind: Literal["sample"] = "sample"
    """Strategy name."""
    vocab_parallel: bool = True
    """Under tensor parallelism, select on the vocabulary shards where the plan allows it;
    ``false`` all-gathers the logits on every rank first (the path vocab-parallel selection is
    measured against; the plan records it as a gather)."""
    temperature: float = Field(default=1.0, ge=0.0)
    """``T == 0`` (greedy) or finite ``T >= 1e-5``; logits are divided by it before the softmax."""
    top_k: int = Field(default=0, ge=0)
    """Keep the ``k`` largest logits; 0 disables the filter."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Keep the smallest sorted prefix whose mass before the element is below ``top_p``."""
    seed: int = Field(default=0, ge=0, lt=2**63)
    """Default request seed for the counter-based generator."""
    acceptance: Literal["rejection", "strict"] = "rejection"
    """``rejection``: lossless rejection sampling; ``strict``: sample the target per row and
    match (also lossless, lower acceptance)."""

    @field_validator("temperature", mode="before")
    @classmethod
    def _not_nan(cls, value: object) -> object:
        # NaN would otherwise fail the ">= 0" bound with a message that does not say what to do
        if isinstance(value, float) and math.isnan(value):
            raise _temperature_error(value, "is not finite")
        return value

    @field_validator("temperature")
    @classmethod
    def _usable_temperature(cls, value: float) -> float:
        # A tiny T makes z / T overflow to inf and the softmax NaN, so decoding would stop being
        # lossless; refuse it rather than silently treating it as greedy.
        if not math.isfinite(value):
            raise _temperature_error(value, "is not finite")
        if 0.0 < value < MIN_TEMPERATURE:
            raise _temperature_error(value, "is too small")
        return value


    @field_validator("top_p", mode="before")
    @classmethod
    def _top_p_not_nan(cls, value: object) -> object:
        # NaN fails every bound, so pydantic would say "should be <= 1", which is misleading
        if isinstance(value, float) and math.isnan(value):
            raise PydanticCustomError(
                "top_p", "top_p is nan; use a nucleus mass in (0, 1] (1 disables the filter)")
        return value


def _temperature_error(value: float, problem: str) -> PydanticCustomError:
    return PydanticCustomError(
        "temperature", f"temperature {value!r} {problem}; use 0 for greedy or a temperature >= 1e-5"
    )


def capabilities_of(config: GreedyConfig | SampleConfig) -> SelectorCapabilities:
    """What the built-in strategy bound to ``config`` declares: both select on vocabulary
    shards through one pair exchange unless ``vocab_parallel`` is off; sampling at ``T = 0`` is
    greedy."""
    if isinstance(config, GreedyConfig):
        return SelectorCapabilities(kind=config.kind, greedy=True,
                                    vocab_parallel=config.vocab_parallel)
    if config.temperature == 0.0:  # filters cannot change an argmax
        return SelectorCapabilities(kind=config.kind, greedy=True,
                                    vocab_parallel=config.vocab_parallel,
                                    default_seed=config.seed)
    filters = []
    if config.top_k > 0:
        filters.append(f"top-k = {config.top_k}")
    if config.top_p < 1.0:
        filters.append(f"top-p = {config.top_p}")
    return SelectorCapabilities(
        kind=config.kind, greedy=False, temperature=config.temperature,
        acceptance=config.acceptance, filters=tuple(filters),
        vocab_parallel=config.vocab_parallel,
        default_seed=config.seed)


__all__ = ["MIN_TEMPERATURE", "GreedyConfig", "SampleConfig", "capabilities_of"]
