"""The :class:`~draftsmith.contract.DrafterFamily` of a family on the GQA backbone (``dflash``,
``dspark-gqa``): the same loader, capability finder and checkpoint check, bound to its name.

May import ``contract`` and ``drafters`` only.
"""

from __future__ import annotations

from functools import partial

from draftsmith.contract import DrafterFamily
from draftsmith.drafters.gqa.capabilities import check_gqa_checkpoint, gqa_capabilities
from draftsmith.drafters.gqa.load import load_gqa_drafter
from draftsmith.drafters.gqa.options import GQAArchitectureOptions


def gqa_family(name: str, summary: str,
               options_model: type[GQAArchitectureOptions]) -> DrafterFamily:
    """The family ``name`` on the GQA backbone.

    Its ``load``, ``capabilities`` and ``check_checkpoint`` are :func:`load_gqa_drafter`,
    :func:`gqa_capabilities` and :func:`check_gqa_checkpoint` with ``family=name``: partials of
    module-level functions, so the family pickles to the ranks of a tensor-parallel group.

    :param name: what configs write as ``drafter.family``; it also selects the checkpoint
        conventions :func:`load_gqa_drafter` applies.
    :param summary: one line for ``draftsmith plugins``.
    :param options_model: the options of a random drafter of this family.
    """
    return DrafterFamily(
        name=name,
        summary=summary,
        load=partial(load_gqa_drafter, family=name),
        options_model=options_model,
        capabilities=partial(gqa_capabilities, family=name),
        check_checkpoint=partial(check_gqa_checkpoint, family=name),
    )


__all__ = ["gqa_family"]
