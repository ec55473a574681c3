"""A drafter family built on another one: :func:`derive_family`.

A plugin that ships its own family on a built-in network (its own checkpoints, its own defaults
for random weights, its name in configs) registers ``derive_family("dspark-gqa", name=...)``:
the base family's loader, capabilities and checkpoint format under the new name. The drafter it
loads is the base's, wrapped so that its capabilities carry the new family name; everything
else is the base's own. May import ``contract`` and ``drafters`` only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

from draftsmith.contract import (
    DraftBlockInputs,
    DraftBlockPlacement,
    Drafter,
    DrafterCapabilities,
    DrafterFamily,
    LoadRequest,
    LogitsShard,
    MarkovHeadWeights,
    OutputHead,
    PagedContextCache,
    PluginError,
)
from draftsmith.drafters.builtin import BUILTIN_FAMILY_MODULES


def builtin_family(name: str) -> DrafterFamily:
    """The built-in family called ``name`` (``dflash``, ``dspark-gqa``, ``dspark-mla``).

    :raises PluginError: naming the built-in families when ``name`` is none of them.
    """
    families = {f.name: f for f in (importlib.import_module(m).FAMILY
                                    for m in BUILTIN_FAMILY_MODULES)}
    if name not in families:
        raise PluginError(f"no built-in drafter family {name!r}; built-in: "
                          f"{', '.join(sorted(families))}")
    return families[name]


def derive_family(
    base: DrafterFamily | str,
    name: str,
    summary: str,
    *,
    options_model: type[BaseModel] | None = None,
) -> DrafterFamily:
    """A family called ``name`` that loads, plans and saves exactly as ``base`` does.

    Its ``load(request)`` is ``base.load(request)`` with the drafter's capabilities renamed to
    ``name``; its ``capabilities(request)`` is ``base.capabilities(request)`` renamed the same
    way. Both are module-level objects holding ``base``'s own functions, so the family pickles to
    the ranks of a tensor-parallel group as the base does. A checkpoint the derived family saves
    is in the base's format (the base loads it too).

    :param base: a :class:`DrafterFamily`, or the name of a built-in one.
    :param name: the new family's name, what configs write as ``drafter.family``.
    :param summary: one line for ``draftsmith plugins``.
    :param options_model: the options of the new family: a subclass of the base's options model
        (other defaults for random weights, say); ``None`` keeps the base's.
    :raises PluginError: when ``base`` names no built-in family or has no loader, when ``name``
        is the base's, or when ``options_model`` does not extend the base's options model.
    """
    family = builtin_family(base) if isinstance(base, str) else base
    if family.load is None or family.capabilities is None:
        raise PluginError(f"cannot derive {name!r} from {family.name!r}: it has no loader")
    if name == family.name:
        raise PluginError(f"derive_family({family.name!r}) needs a name of its own, got "
                          f"{name!r}")
    options = options_model or family.options_model
    if not (isinstance(options, type) and issubclass(options, family.options_model)):
        raise PluginError(
            f"{name!r}: options_model {options!r} does not extend {family.name}'s "
            f"{family.options_model.__name__}, which its loader reads; subclass it")
    return DrafterFamily(name=name, summary=summary, load=_RenamedLoad(family.load, name),
                         options_model=options,
                         capabilities=_RenamedCapabilities(family.capabilities, name),
                         check_checkpoint=family.check_checkpoint)


@dataclass(frozen=True)
class _RenamedLoad:
    """``load(request)`` of a derived family: the base's drafter under the derived name."""

    load: Callable[[LoadRequest], Drafter]
    name: str

    def __call__(self, request: LoadRequest) -> Drafter:
        return RenamedDrafter(self.load(request), self.name)


@dataclass(frozen=True)
class _RenamedCapabilities:
    """``capabilities(request)`` of a derived family: the base's, under the derived name."""

    capabilities: Callable[[LoadRequest], DrafterCapabilities]
    name: str

    def __call__(self, request: LoadRequest) -> DrafterCapabilities:
        return self.capabilities(request).model_copy(update={"family": self.name})


class RenamedDrafter:
    """A drafter whose capabilities name another family; every call goes to ``inner``.

    The optional ``Drafter`` members the inner drafter defines (its STS calibration table, for
    one) are read through to it.
    """

    def __init__(self, inner: Drafter, family: str) -> None:
        self.inner = inner
        self._capabilities = inner.capabilities.model_copy(update={"family": family})

    @property
    def capabilities(self) -> DrafterCapabilities:
        """The inner drafter's capabilities with ``family`` renamed."""
        return self._capabilities

    def project_context(self, features: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``[T, n_cap * H_t]``, ``[T] int64`` -> entries ``[T, L, planes, heads, width]``."""
        return self.inner.project_context(features, positions)

    def embed_block(self, token_ids: torch.Tensor,
                    target_embedding: torch.Tensor | None) -> torch.Tensor:
        """``[G, W] int64`` -> ``[G, W, H]``."""
        return self.inner.embed_block(token_ids, target_embedding)

    def forward_block(self, inputs: DraftBlockInputs, placement: DraftBlockPlacement,
                      cache: PagedContextCache) -> torch.Tensor:
        """Final-normed hidden ``[G, W, H]``."""
        return self.inner.forward_block(inputs, placement, cache)

    def block_logits(self, hidden: torch.Tensor, head: OutputHead) -> LogitsShard:
        """``[rows, H]`` -> logits ``[rows, S] fp32``."""
        return self.inner.block_logits(hidden, head)

    def markov_head(self) -> MarkovHeadWeights | None:
        """The inner drafter's Markov head as data, or ``None``."""
        return self.inner.markov_head()

    def confidence(self, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        """``[G, K, H]``, ``[G, K] int64`` -> ``[G, K] fp32``."""
        return self.inner.confidence(hidden, prev_tokens)

    def save(self, directory: Path) -> None:
        """The inner drafter's checkpoint (the base family's format)."""
        self.inner.save(directory)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (unpickling): no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.inner, name)


__all__ = ["RenamedDrafter", "builtin_family", "derive_family"]
