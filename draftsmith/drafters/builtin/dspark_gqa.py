"""Built-in drafter family ``dspark-gqa``: DSpark with GQA attention: the DFlash
backbone under the shift convention, a Markov head exposed as data, and a scored confidence head.

Loads DeepSpec native checkpoints (``Qwen3DSparkModel``: ``markov_head.markov_w1.weight``,
``confidence_head.proj.*``, own ``embed_tokens``) and DFlash-style exports (``markov_w1.weight``,
``confidence_proj.*``, head fields in ``dspark_config`` / ``dflash_config``). Sliding layers are
non-causal with a symmetric window; a config with ``causal = true`` is rejected.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from draftsmith import hookimpl
from draftsmith.contract import Registrar
from draftsmith.drafters.gqa import GQAArchitectureOptions
from draftsmith.drafters.gqa.family import gqa_family

NAME = "dspark-gqa"


class DSparkGQAOptions(GQAArchitectureOptions):
    """Architecture of a random ``dspark-gqa`` drafter. With a checkpoint its ``config.json`` decides;
    a field set explicitly must then agree with it (``init_std`` aside)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    block_size: int = Field(default=7, ge=1)
    """Trained block width ``K`` (7 in every shipped DeepSpec config); ``W = K``."""
    markov_rank: int = Field(default=16, ge=0)
    """``r``: rank of the Markov head; 0 means no head."""
    markov_head_type: Literal["vanilla", "gated", "rnn"] = "vanilla"
    """Kind of sequential head when ``markov_rank > 0``."""
    confidence_head: bool = True
    """Whether the drafter has a confidence head ``Linear(H [+ r], 1)``."""
    confidence_head_with_markov: bool = True
    """Feed ``w1[prev]`` to the confidence head next to the slot's hidden state."""

    @model_validator(mode="after")
    def _heads_consistent(self) -> DSparkGQAOptions:
        if self.confidence_head and self.confidence_head_with_markov and self.markov_rank == 0:
            raise ValueError(
                "confidence_head_with_markov needs markov_rank > 0; set markov_rank or "
                "confidence_head_with_markov = false"
            )
        return self

    def draft_fields(self) -> dict[str, Any]:
        """DSpark keys of the ``dspark_config`` section."""
        fields: dict[str, Any] = {
            "projector_type": "dspark",
            "shift_label": True,
            "markov_rank": self.markov_rank,
            "use_confidence_head": self.confidence_head,
            "confidence_head_with_markov": self.confidence_head and self.confidence_head_with_markov,
        }
        if self.markov_rank > 0:
            fields["markov_head_type"] = self.markov_head_type
        sliding = self.layer_types is not None and "sliding_attention" in self.layer_types
        fields["use_swa"] = sliding
        if sliding:
            fields["swa_window_size"] = self.sliding_window
        return fields


FAMILY = gqa_family(
    NAME, "DSpark with GQA attention: shift convention, Markov head, confidence head",
    DSparkGQAOptions)


@hookimpl
def draftsmith_register_drafters(registrar: Registrar) -> None:
    """Register ``dspark-gqa``."""
    registrar.add_family(FAMILY)
