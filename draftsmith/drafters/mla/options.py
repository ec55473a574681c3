"""The architecture options of a ``dspark-mla`` drafter apart from the sizes it takes from its
target (:class:`MLAArchitecture`, with its YaRN RoPE parameters :class:`YarnRope`); the family's
options model extends them. May import ``contract`` and ``drafters`` only.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class YarnRope(BaseModel):
    """YaRN RoPE parameters of the rope slice (DeepSeek / Hugging Face ``rope_scaling``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    theta: float = Field(default=10000.0, gt=1.0)
    """``rope_theta``: base wavelength."""
    factor: float = Field(default=4.0, gt=0.0)
    """Context extension factor; ``<= 1`` leaves the frequencies and scales unchanged."""
    original_max_position_embeddings: int = Field(default=4096, ge=1)
    """Pre-training context length, which sets the YaRN correction range."""
    beta_fast: float = Field(default=32.0, gt=0.0)
    """Rotation count bounding pure extrapolation (high-frequency dims)."""
    beta_slow: float = Field(default=1.0, gt=0.0)
    """Rotation count bounding pure interpolation (low-frequency dims)."""
    mscale: float = 1.0
    """Numerator coefficient of the cos/sin attention factor."""
    mscale_all_dim: float = 1.0
    """Denominator coefficient of the cos/sin factor; also sets the softmax ``mscale``."""
    truncate: bool = True
    """Round the correction range outward to whole dims (Hugging Face default)."""



class MLAArchitecture(BaseModel):
    """Shape of a ``dspark-mla`` drafter apart from the sizes it takes from its target."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    num_layers: int = Field(default=2, ge=1)
    """``L``: drafter decoder layers."""
    num_heads: int = Field(default=4, ge=1)
    """``n_h``: attention heads (split over TP ranks)."""
    q_lora_rank: int = Field(default=32, ge=1)
    """Width of the query low-rank bottleneck (``q_a_proj`` output)."""
    kv_lora_rank: int = Field(default=32, ge=1)
    """Width of the normalised KV latent; the cached row is ``kv_lora_rank + qk_rope_head_dim``."""
    qk_nope_head_dim: int = Field(default=16, ge=1)
    """``d_nope``: per-head query/key dims without RoPE."""
    qk_rope_head_dim: int = Field(default=8, ge=2)
    """``d_rope``: per-head query dims and shared key dims with RoPE (even)."""
    v_head_dim: int = Field(default=16, ge=1)
    """``d_v``: per-head value dims."""
    intermediate_size: int = Field(default=64, ge=1)
    """``I``: SwiGLU intermediate size (split over TP ranks)."""
    rms_norm_eps: float = Field(default=1e-6, gt=0.0)
    """Epsilon of every RMSNorm."""
    rope: YarnRope = Field(default_factory=YarnRope)
    """YaRN RoPE of the rope slice (the only scaling this family accepts)."""
    max_position_embeddings: int = Field(default=16384, ge=1)
    """Largest position the drafter is meant to serve."""
    block_size: int = Field(default=7, ge=1)
    """Trained block width (``K`` under the shift convention)."""
    mask_token_id: int = Field(default=0, ge=0)
    """Token id whose embedding fills the mask slots of a block."""
    target_layer_ids: tuple[int, ...] | None = None
    """Target layers to capture; ``None`` spreads ``num_layers`` over the target
    (``build_target_layer_ids``)."""
    markov_rank: int = Field(default=0, ge=0)
    """``r`` of the vanilla Markov head; 0 for none."""
    confidence_head: bool = False
    """Whether a confidence head ``Linear(H [+ r], 1)`` is present."""
    confidence_head_with_markov: bool = False
    """Whether the confidence head also reads ``w1[prev]`` (needs ``markov_rank > 0``)."""

    @model_validator(mode="after")
    def _check(self) -> MLAArchitecture:
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even, got {self.qk_rope_head_dim}")
        if self.confidence_head_with_markov and not (self.confidence_head and self.markov_rank):
            raise ValueError(
                "confidence_head_with_markov needs confidence_head = true and markov_rank > 0"
            )
        return self
