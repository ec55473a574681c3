"""Built-in drafter family ``dflash``: the z-lab DFlash block drafter (KV injection from target
layers).

Loads z-lab ``DFlashDraftModel`` checkpoints and DeepSpec "DFlash" checkpoints (a
``Qwen3DSparkModel`` with ``markov_rank = 0``). The block convention is bonus-silent unless the
checkpoint says shift (``shift_label``, ``projector_type = "dspark"`` or a DeepSpec architecture);
the decision is logged. ``DFlash2DraftModel`` is rejected.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict

from draftsmith import hookimpl
from draftsmith.contract import (
    DrafterCapabilities,
    DrafterFamily,
    LoadRequest,
    Registrar,
    TargetInfo,
)
from draftsmith.drafters.gqa import GQAArchitectureOptions, GQADrafter, load_gqa_drafter
from draftsmith.drafters.gqa.capabilities import check_gqa_checkpoint, gqa_capabilities

NAME = "dflash"


class DFlashOptions(GQAArchitectureOptions):
    """Architecture of a random ``dflash`` drafter. With a checkpoint its ``config.json`` decides;
    a field set explicitly must then agree with it (``init_std`` aside)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    is_causal: bool | None = None
    """Global override of the per-layer causal flag; ``None`` makes sliding layers causal."""
    shift_label: bool = False
    """Use the shift convention (``W = K``) instead of the bonus-silent block (``W = K + 1``)."""

    def to_config(self, target: TargetInfo, family: str) -> dict[str, Any]:
        """A z-lab style config for these options."""
        config = super().to_config(target, family)
        if self.is_causal is not None:
            config["is_causal"] = self.is_causal
        config["dflash_config"]["shift_label"] = self.shift_label
        return config


def capabilities(request: LoadRequest) -> DrafterCapabilities:
    """The capabilities :func:`load` declares for ``request``, found without weights."""
    return gqa_capabilities(request, NAME)


def load(request: LoadRequest) -> GQADrafter:
    """Load a ``dflash`` drafter from ``request.checkpoint``, or build a random one."""
    return load_gqa_drafter(request, NAME)


def check_checkpoint(request: LoadRequest) -> None:
    """Check a ``dflash`` checkpoint's tensor headers as :func:`load` checks its tensors."""
    check_gqa_checkpoint(request, NAME)


FAMILY = DrafterFamily(
    name=NAME,
    summary="z-lab DFlash block drafter (bonus-silent block, KV injection from target layers)",
    load=load,
    options_model=DFlashOptions,
    capabilities=capabilities,
    check_checkpoint=check_checkpoint,
)


@hookimpl
def draftsmith_register_drafters(registrar: Registrar) -> None:
    """Register ``dflash``."""
    registrar.add_family(FAMILY)
