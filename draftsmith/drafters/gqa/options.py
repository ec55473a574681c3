"""The options of a randomly initialised GQA drafter (:class:`GQAArchitectureOptions`), which
the ``dflash`` and ``dspark-gqa`` families extend. May import ``contract`` and ``drafters`` only.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from draftsmith.contract import (
    ConfigError,
    TargetInfo,
)
from draftsmith.drafters.checkpoint import (
    build_target_layer_ids,
)
from draftsmith.drafters.gqa.config import DFLASH_ARCH

LayerType = Literal["full_attention", "sliding_attention"]


class GQAArchitectureOptions(BaseModel):
    """Architecture of a randomly initialised GQA drafter (used when no checkpoint is given).

    ``H``, ``V`` and ``L_t`` come from the load request's target.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    num_layers: int = Field(default=2, ge=1)
    """``L``: drafter decoder layers."""
    num_heads: int = Field(default=4, ge=1)
    """``n_h``: query heads."""
    num_kv_heads: int = Field(default=2, ge=1)
    """``n_kv``: key/value heads; must divide ``num_heads``."""
    head_dim: int = Field(default=16, ge=2, multiple_of=2)
    """``hd``: per-head width (even, for rotate-half RoPE)."""
    intermediate_size: int = Field(default=64, ge=1)
    """``I``: SwiGLU intermediate width."""
    block_size: int = Field(default=16, ge=1)
    """Trained block width; the runtime's ``W`` must not exceed it."""
    mask_token_id: int | None = None
    """Id that fills mask slots; ``None`` picks ``V - 1``."""
    target_layer_ids: tuple[int, ...] | None = None
    """Captured target layers; ``None`` uses ``build_target_layer_ids(L_t, L)``."""
    layer_types: tuple[LayerType, ...] | None = None
    """Per-layer attention kind; ``None`` makes every layer ``full_attention``."""
    sliding_window: int | None = Field(default=None, ge=1)
    """Window ``w`` of the sliding layers."""
    rope_theta: float = Field(default=10000.0, gt=0)
    """RoPE base."""
    rms_norm_eps: float = Field(default=1e-6, gt=0)
    """RMSNorm epsilon."""
    attention_bias: bool = False
    """Whether q/k/v/o projections carry biases."""
    max_position_embeddings: int = Field(default=32768, ge=1)
    """Largest position the RoPE table must cover."""
    input_embedding_scale: float = 1.0
    """Multiplier on raw embedding rows of the block (``sqrt(H)`` for a Gemma target)."""
    output_multiplier: float = 1.0
    """Multiplier on draft logits."""
    final_logit_softcapping: float | None = Field(default=None, gt=0)
    """Soft cap ``c``: logits become ``c * tanh(logits / c)``; ``None`` disables it."""
    init_std: float = Field(default=0.02, gt=0)
    """Standard deviation of the random weights (norm weights are ``1 + init_std * noise``)."""

    @model_validator(mode="after")
    def _buildable(self) -> GQAArchitectureOptions:
        # no target or checkpoint changes this: refused when the config validates
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} must be a multiple of num_kv_heads "
                f"{self.num_kv_heads} (each key/value head serves a group of query heads)")
        return self

    def draft_fields(self) -> dict[str, Any]:
        """Family-specific keys for the drafter config section (overridden by families)."""
        return {}

    def to_config(self, target: TargetInfo, family: str) -> dict[str, Any]:
        """A checkpoint config describing these options for ``target``."""
        if self.layer_types is not None and len(self.layer_types) != self.num_layers:
            raise ConfigError(
                f"layer_types has {len(self.layer_types)} entries for num_layers {self.num_layers}"
            )
        layer_types = list(self.layer_types or ["full_attention"] * self.num_layers)
        if "sliding_attention" in layer_types and self.sliding_window is None:
            raise ConfigError("layer_types has sliding layers; set sliding_window")
        ids = (list(self.target_layer_ids) if self.target_layer_ids is not None
               else build_target_layer_ids(target.num_layers, self.num_layers))
        mask = self.mask_token_id if self.mask_token_id is not None else target.vocab_size - 1
        if not 0 <= mask < target.vocab_size:
            raise ConfigError(f"mask_token_id {mask} is outside the target vocabulary "
                              f"0..{target.vocab_size - 1}")
        section = {
            "target_layer_ids": ids,
            "mask_token_id": mask,
            "block_size": self.block_size,
            "input_embedding_scale": self.input_embedding_scale,
            "output_multiplier": self.output_multiplier,
            **self.draft_fields(),
        }
        if self.final_logit_softcapping is not None:
            section["final_logit_softcapping"] = self.final_logit_softcapping
        config: dict[str, Any] = {
            "architectures": [DFLASH_ARCH],
            "hidden_size": target.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "attention_bias": self.attention_bias,
            "vocab_size": target.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "layer_types": layer_types,
            "num_target_layers": target.num_layers,
            "dspark_config" if family == "dspark-gqa" else "dflash_config": section,
        }
        if self.sliding_window is not None:
            config["sliding_window"] = self.sliding_window
        return config
