"""Built-in drafter family ``dflash``: the z-lab DFlash block drafter (KV injection from target layers)."""

from __future__ import annotations

from draftsmith import hookimpl
from draftsmith.contract import DrafterFamily, Registrar

FAMILY = DrafterFamily(
    name="dflash",
    summary="z-lab DFlash block drafter (bonus-silent block, KV injection from target layers)",
    load=None,
)


@hookimpl
def draftsmith_register_drafters(registrar: Registrar) -> None:
    """Register ``dflash``."""
    registrar.add_family(FAMILY)
