"""Validated configs of the built-in selection strategies (one tagged variant each)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class GreedyConfig(BaseModel):
    """Deterministic argmax in torch.argmax order; verification is strict token matching."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    kind: Literal["greedy"] = "greedy"
    """Strategy name."""


class SampleConfig(BaseModel):
    """Temperature sampling with optional top-k / top-p; lossless rejection-sampling verification."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    kind: Literal["sample"] = "sample"
    """Strategy name."""
    temperature: float = Field(default=1.0, ge=0.0)
    """``T >= 0``; logits are divided by it before the softmax; ``T == 0`` rows are greedy."""
    top_k: int = Field(default=0, ge=0)
    """Keep the ``k`` largest logits; 0 disables the filter."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Keep the smallest sorted prefix whose mass before the element is below ``top_p``."""
    seed: int = Field(default=0, ge=0, lt=2**63)
    """Default request seed for the counter-based generator."""
    acceptance: Literal["rejection", "strict"] = "rejection"
    """``rejection``: lossless rejection sampling (3.6); ``strict``: sample the target per row and
    match (also lossless, lower acceptance)."""


__all__ = ["GreedyConfig", "SampleConfig"]
