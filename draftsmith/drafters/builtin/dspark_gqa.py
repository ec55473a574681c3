"""Built-in drafter family ``dspark-gqa``: DSpark with GQA attention: shift convention, Markov head, confidence head."""

from __future__ import annotations

from draftsmith import hookimpl
from draftsmith.contract import DrafterFamily, Registrar

FAMILY = DrafterFamily(
    name="dspark-gqa",
    summary="DSpark with GQA attention: shift convention, Markov head, confidence head",
    load=None,
)


@hookimpl
def draftsmith_register_drafters(registrar: Registrar) -> None:
    """Register ``dspark-gqa``."""
    registrar.add_family(FAMILY)
