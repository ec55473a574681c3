"""What plugins register: drafter families and selection strategies, and the registrar they use.

A family or strategy is plain data plus a factory. Plugins build these records in their
``draftsmith_register_drafters`` / ``draftsmith_register_selectors`` hook implementations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from draftsmith.contract.capabilities import DrafterCapabilities
from draftsmith.contract.protocols import Collectives, Drafter, SingleRank, TokenSelector


class ParallelMapping(BaseModel):
    """How this process sits in the tensor-parallel group."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    tp_size: int = Field(default=1, ge=1)
    """``TP``: ranks sharing the drafter weights and the vocabulary."""
    tp_rank: int = Field(default=0, ge=0)
    """``rho``: this rank's index, ``0 <= tp_rank < tp_size``."""
    attention_dp: bool = False
    """Attention data parallelism: ranks own different requests (disables vocab-parallel exchange)."""

    @model_validator(mode="after")
    def _rank_in_group(self) -> ParallelMapping:
        if self.tp_rank >= self.tp_size:
            raise ValueError(
                f"tp_rank {self.tp_rank} must be < tp_size {self.tp_size}; ranks of a group of "
                f"{self.tp_size} are numbered 0..{self.tp_size - 1}"
            )
        return self


@dataclass(frozen=True, eq=False)
class TargetInfo:
    """What a drafter loader may know about the target it will serve."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    dtype: torch.dtype = torch.float32
    graph_blocker: str | None = None
    """Why a CUDA graph cannot capture the target's forward (``None``: it can)."""
    gemm: str = "torch"
    """How the target's linear layers multiply at decoding row counts (``TargetModel.gemm``)."""
    gemm_reason: str = ""
    """Why that GEMM, where a preferred one could not run (the target's ``gemm_reason``)."""
    layer_path: str = "own"
    """What runs the target's decoder layers: a Hugging Face target's ``layer_path`` (``fused`` or
    ``transformers``; ``own`` for a target that runs its own forward)."""
    layer_path_reason: str = ""
    """Why (a Hugging Face target's ``layer_path_reason``)."""


@dataclass(frozen=True, eq=False)
class LoadRequest:
    """Arguments of a family's loader.

    ``checkpoint`` is a directory (``config.json`` + ``*.safetensors``), or ``None`` to build
    random weights from ``options`` (tests and benchmarks). With a checkpoint, its config decides
    the architecture; a loader raises :class:`ConfigError` for an architecture option that was set
    explicitly and disagrees with it, rather than ignoring it.
    """

    options: BaseModel
    checkpoint: Path | None = None
    target: TargetInfo | None = None
    collectives: Collectives = field(default_factory=SingleRank)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtype: torch.dtype | None = None
    seed: int = 0


class _NoOptions(BaseModel):
    """A family with no options of its own."""

    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass(frozen=True, eq=False)
class DrafterFamily:
    """A registered drafter family.

    ``load`` is ``None`` for a family that is declared but whose model does not exist yet; bind
    then fails with a :class:`PlanError` that says so. A family with a ``load`` declares its
    ``capabilities`` too.
    """

    name: str
    summary: str
    load: Callable[[LoadRequest], Drafter] | None
    options_model: type[BaseModel] = _NoOptions
    capabilities: Callable[[LoadRequest], DrafterCapabilities] | None = None
    """The capabilities of the drafter ``load`` builds for the same request, found without
    building or reading any weights (from the options, or the checkpoint's config and tensor
    headers): ``draftsmith plan`` plans from them. Required when ``load`` is set."""
    check_checkpoint: Callable[[LoadRequest], None] | None = None
    """Check ``request.checkpoint``'s files against its config as ``load`` would, on their
    tensor headers alone (no weight read): a tensor missing, left over, in two files, of another
    shape or dtype, a shard that does not parse. The plan calls it once the declared
    capabilities fit the target (so a checkpoint made for another target is named as such),
    before any model loads. ``None``: the files are checked only when the checkpoint loads."""
    distribution: str = "draftsmith"
    """Distribution that registered the family (filled in by the registry)."""


@dataclass(frozen=True, eq=False)
class SelectorFamily:
    """A registered token-selection strategy.

    ``config_model`` must have a ``kind: Literal[name]`` field; ``build`` turns a validated config
    into a :class:`TokenSelector`.
    """

    name: str
    summary: str
    config_model: type[BaseModel]
    build: Callable[[BaseModel], TokenSelector]
    distribution: str = "draftsmith"
    """Distribution that registered the strategy (filled in by the registry)."""


class Registrar(Protocol):
    """Passed to the registration hooks; collects what plugins add."""

    def add_family(self, family: DrafterFamily) -> None:
        """Register a drafter family; a duplicate name raises :class:`PluginError`."""
        ...

    def add_selector(self, selector: SelectorFamily) -> None:
        """Register a selection strategy; a duplicate name raises :class:`PluginError`."""
        ...


__all__ = [
    "DrafterFamily",
    "LoadRequest",
    "ParallelMapping",
    "Registrar",
    "SelectorFamily",
    "TargetInfo",
]
