"""Built-in drafter family ``dspark-mla``: DSpark with MLA attention: single-latent paged context, TP fusions."""

from __future__ import annotations

from draftsmith import hookimpl
from draftsmith.contract import DrafterFamily, Registrar

FAMILY = DrafterFamily(
    name="dspark-mla",
    summary="DSpark with MLA attention: single-latent paged context, TP fusions",
    load=None,
)


@hookimpl
def draftsmith_register_drafters(registrar: Registrar) -> None:
    """Register ``dspark-mla``."""
    registrar.add_family(FAMILY)
