"""The configuration of a training run: everything the trained drafter and its schedule depend on,
saved beside each checkpoint so that a run can be reproduced and resumed."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TrainConfig(BaseModel):
    """Everything a training run depends on (saved beside the checkpoint for reproduction).
    Integer fields are strict: ``--set steps=true`` is refused, not read as 1."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    family: Literal["dspark-gqa", "dflash"] = "dspark-gqa"
    """Drafter family to train (``dflash``: no Markov or confidence head)."""
    block_convention: Literal["shift", "bonus-silent"] = "shift"
    """How a block's slots map to drafts. ``shift``: ``[anchor, mask x (K-1)]``, ``W = K`` slots,
    slot ``j`` predicts draft ``j`` (DSpark and DeepSpec). ``bonus-silent`` (``dflash`` only):
    ``[anchor, mask x K]``, ``W = K + 1`` slots, the anchor's slot predicts nothing (z-lab
    DFlash: what ``draftsmith export --format zlab-dflash`` and the engines' DFlash readers
    run)."""
    num_layers: int = Field(default=2, ge=1, strict=True)
    """Drafter decoder layers ``L``."""
    num_heads: int = Field(default=9, ge=1, strict=True)
    """Query heads."""
    num_kv_heads: int = Field(default=3, ge=1, strict=True)
    """Key/value heads."""
    head_dim: int = Field(default=64, ge=2, strict=True)
    """Per-head width."""
    intermediate_size: int = Field(default=1536, ge=1, strict=True)
    """SwiGLU width."""
    block_size: int = Field(default=7, ge=1, strict=True)
    """Drafts ``K`` a block is trained to predict (the block holds ``K`` slots, or ``K + 1``
    under ``bonus-silent``)."""
    markov_rank: int = Field(default=64, ge=0, strict=True)
    """Markov head rank (``dspark-gqa`` only)."""
    target_layer_ids: tuple[int, ...] | None = None
    """Target layers the drafter reads; none spreads ``num_layers`` ids over the target
    (z-lab's default capture list). Set it to grow a checkpoint (``--init-from``) to more layers
    with the same inputs."""
    steps: int = Field(default=2000, ge=1, strict=True)
    """Optimizer steps in total (a resumed run continues to this count)."""
    batch_size: int = Field(default=16, ge=1, strict=True)
    """Sequences per step."""
    max_len: int = Field(default=640, ge=16, strict=True)
    """Sequences are truncated to this many tokens."""
    num_anchors: int = Field(default=48, ge=1, strict=True)
    """Blocks sampled per sequence."""
    pad_multiple: int = Field(default=64, ge=1, strict=True)
    """A batch's width is its longest sequence rounded up to a multiple of this (at most
    ``max_len``); padding is never attended to, and few distinct shapes let a GPU run reach its
    full step rate within a few steps instead of meeting a new shape on most of them."""
    lr: float = Field(default=6e-4, gt=0, allow_inf_nan=False)
    """Peak learning rate."""
    warmup: int = Field(default=100, ge=0, strict=True)
    """Linear warm-up steps."""
    weight_decay: float = Field(default=0.01, ge=0, allow_inf_nan=False)
    """AdamW weight decay."""
    val_fraction: float = Field(default=0.02, gt=0, lt=0.5, allow_inf_nan=False)
    """Share of sequences held out for validation (and STS calibration)."""
    eval_every: int = Field(default=250, ge=1, strict=True)
    """Validate every this many steps."""
    save_every: int = Field(default=500, ge=1, strict=True)
    """Checkpoint every this many steps."""
    seed: int = Field(default=0, ge=0, strict=True)
    """Seed of initialisation, data order and anchors."""
    init_from: Path | None = None
    """Checkpoint of the same family whose weights start a new run (fresh optimizer and
    schedule); ignored when the run resumes from its own ``last`` state."""
    start_step: int = Field(default=0, ge=0, strict=True)
    """With ``init_from``: the step the new run starts at. Its learning-rate schedule, batches and
    anchors continue from there as a run of this config would have them, so a run whose saved
    state was lost can be finished from a checkpoint of that step. The optimizer's moments start
    afresh, so the learning rate ramps linearly into the schedule over the first ``warmup``
    steps. 0 starts at the beginning."""

    @model_validator(mode="after")
    def _convention_of_the_family(self) -> TrainConfig:
        if self.family == "dspark-gqa" and self.block_convention != "shift":
            raise ValueError("block_convention: dspark-gqa drafters use the shift convention; "
                             "train family dflash for a bonus-silent (z-lab) block")
        if self.start_step and self.init_from is None:
            raise ValueError("start_step: continues from a checkpoint; give it with "
                             "--init-from (init_from), the checkpoint of that step")
        if self.start_step >= self.steps:
            raise ValueError(f"start_step: {self.start_step} leaves nothing of a run of "
                             f"{self.steps} steps; set it below steps")
        return self


__all__ = ["TrainConfig"]
