"""The :class:`~draftsmith.contract.DrafterFamily` of a family on the GQA backbone (``dflash``,
``dspark-gqa``): the same loader, capability finder and checkpoint check, bound to its name.

May import ``contract`` and ``drafters`` only.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftsmith.contract import DrafterCapabilities, DrafterFamily, LoadRequest
from draftsmith.drafters.gqa.capabilities import check_gqa_checkpoint, gqa_capabilities
from draftsmith.drafters.gqa.load import load_gqa_drafter
from draftsmith.drafters.gqa.model import GQADrafter
from draftsmith.drafters.gqa.options import GQAArchitectureOptions


def gqa_family(name: str, summary: str,
               options_model: type[GQAArchitectureOptions]) -> DrafterFamily:
    """The family ``name`` on the GQA backbone.

    :param name: what configs write as ``drafter.family``; it also selects the checkpoint
        conventions :func:`load_gqa_drafter` applies.
    :param summary: one line for ``draftsmith plugins``.
    :param options_model: the options of a random drafter of this family.
    """
    functions = _GQAFunctions(name)
    return DrafterFamily(name=name, summary=summary, load=functions.load,
                         options_model=options_model, capabilities=functions.capabilities,
                         check_checkpoint=functions.check_checkpoint)


@dataclass(frozen=True)
class _GQAFunctions:
    """The backbone's functions for one family name. Its bound methods pickle (the family goes
    to the ranks of a tensor-parallel group), and each looks its function up in this module
    when called, so a stand-in put here (a test that must see no drafter built) is called."""

    family: str

    def load(self, request: LoadRequest) -> GQADrafter:
        """Load a drafter of this family from ``request.checkpoint``, or build a random one."""
        return load_gqa_drafter(request, self.family)

    def capabilities(self, request: LoadRequest) -> DrafterCapabilities:
        """The capabilities :meth:`load` declares for ``request``, found without weights."""
        return gqa_capabilities(request, self.family)

    def check_checkpoint(self, request: LoadRequest) -> None:
        """Check a checkpoint's tensor headers as :meth:`load` checks its tensors."""
        check_gqa_checkpoint(request, self.family)


__all__ = ["gqa_family"]
