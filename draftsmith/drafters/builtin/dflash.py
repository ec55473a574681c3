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
from draftsmith.contract import Registrar, TargetInfo
from draftsmith.drafters.gqa import GQAArchitectureOptions
from draftsmith.drafters.gqa.family import gqa_family

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


FAMILY = gqa_family(
    NAME, "z-lab DFlash block drafter (bonus-silent block, KV injection from target layers)",
    DFlashOptions)


@hookimpl
def draftsmith_register_drafters(registrar: Registrar) -> None:
    """Register ``dflash``."""
    registrar.add_family(FAMILY)
