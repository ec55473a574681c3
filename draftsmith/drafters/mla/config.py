"""A fully resolved ``dspark-mla`` drafter configuration (:class:`MLAConfig`), its YaRN numbers,
its tensor shapes, and its ``config.json`` both ways (format: ``docs/checkpoint-mla.md``).
May import ``contract`` and ``drafters`` only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from pydantic import Field, ValidationError, model_validator

from draftsmith.contract import (
    CheckpointError,
    TargetInfo,
)
from draftsmith.drafters.checkpoint import (
    CONFIG_FILE,
    build_target_layer_ids,
    confidence_flags,
    config_errors,
    config_float,
    config_int,
    config_layer_ids,
    config_mapping,
    draft_value,
    truthy,
    validate_target_layer_ids,
)
from draftsmith.drafters.mla.options import MLAArchitecture, YarnRope

FAMILY_NAME = "dspark-mla"
"""Registered family name of this drafter."""
ARCHITECTURE = "DSparkMLADraftModel"
"""``architectures[0]`` written to ``config.json`` by :meth:`DSparkMLADrafter.save`."""


def yarn_get_mscale(factor: float, mscale: float = 1.0) -> float:
    """``0.1 * mscale * ln(factor) + 1``, or 1 when ``factor <= 1``."""
    if factor <= 1.0:
        return 1.0
    return 0.1 * mscale * math.log(factor) + 1.0


def yarn_inv_freq(dim: int, rope: YarnRope) -> torch.Tensor:
    """YaRN inverse frequencies ``[dim // 2] fp32`` of a rope slice of width ``dim``.

    ``inv = inter * (1 - m) + extra * m`` with ``extra = theta^(-2i/dim)``,
    ``inter = extra / factor`` and ``m = 1 - clamp((i - low) / (high - low), 0, 1)``, where
    ``low, high`` are the dims at which ``beta_fast`` and ``beta_slow`` rotations fit in the
    original context.
    """

    def correction_dim(rotations: float) -> float:
        length = rope.original_max_position_embeddings
        return dim * math.log(length / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1.0 - ramp
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extra = 1.0 / pos_freqs
    inter = 1.0 / (rope.factor * pos_freqs)
    return inter * (1.0 - extrapolate) + extra * extrapolate


def yarn_attention_factor(rope: YarnRope) -> float:
    """Scale folded into cos and sin: ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)``."""
    return yarn_get_mscale(rope.factor, rope.mscale) / yarn_get_mscale(
        rope.factor, rope.mscale_all_dim
    )


def mla_softmax_scale(qk_nope_head_dim: int, qk_rope_head_dim: int, rope: YarnRope) -> float:
    """``mscale^2 / sqrt(d_nope + d_rope)`` with ``mscale = yarn_get_mscale(factor,
    mscale_all_dim)``; not ``1 / sqrt(D_lat)`` (the absorbed score reproduces the un-absorbed
    ``d_nope + d_rope`` dot product)."""
    m = yarn_get_mscale(rope.factor, rope.mscale_all_dim)
    return m * m / math.sqrt(qk_nope_head_dim + qk_rope_head_dim)


class MLAConfig(MLAArchitecture):
    """A fully resolved ``dspark-mla`` drafter: architecture plus the sizes shared with the target."""

    hidden_size: int = Field(ge=1)
    """``H``: drafter hidden size."""
    vocab_size: int = Field(ge=1)
    """``V``: vocabulary shared with the target."""
    target_hidden_size: int = Field(ge=1)
    """``H_t``: width of each captured target layer."""
    target_layer_ids: tuple[int, ...]
    """Target layers captured, in order; ``n_cap = len(target_layer_ids)``."""

    @model_validator(mode="after")
    def _check_vocab(self) -> MLAConfig:
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids must name at least one target layer")
        if self.mask_token_id >= self.vocab_size:
            raise ValueError(
                f"mask_token_id {self.mask_token_id} is outside the vocabulary of {self.vocab_size}"
            )
        return self

    @property
    def latent_width(self) -> int:
        """``D_lat = kv_lora_rank + qk_rope_head_dim``."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def feature_width(self) -> int:
        """``F = n_cap * H_t``: input width of ``fc``."""
        return len(self.target_layer_ids) * self.target_hidden_size

    @staticmethod
    def from_architecture(
        arch: MLAArchitecture, target: TargetInfo, num_target_layers: int | None = None
    ) -> MLAConfig:
        """Complete ``arch`` with the target's hidden size and vocabulary (random init)."""
        fields = arch.model_dump(exclude={"target_layer_ids"})
        layers = num_target_layers or target.num_layers
        ids = arch.target_layer_ids
        if ids is None:
            ids = build_target_layer_ids(layers, arch.num_layers)
        # checked here, as the GQA families do, so that save() never writes a checkpoint whose
        # capture list the loader refuses
        ids = validate_target_layer_ids(ids, layers)
        return MLAConfig(
            **fields,
            hidden_size=target.hidden_size,
            vocab_size=target.vocab_size,
            target_hidden_size=target.hidden_size,
            target_layer_ids=tuple(ids),
        )


def mla_tensor_shapes(cfg: MLAConfig) -> dict[str, tuple[int, ...]]:
    """Canonical tensor names of a full (unsharded) checkpoint and their shapes, in save order."""
    h, v = cfg.hidden_size, cfg.vocab_size
    qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "embed_tokens.weight": (v, h),
        "fc.weight": (h, cfg.feature_width),
        "hidden_norm.weight": (h,),
    }
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_a_proj.weight": (cfg.q_lora_rank, h),
            p + "self_attn.q_a_layernorm.weight": (cfg.q_lora_rank,),
            p + "self_attn.q_b_proj.weight": (cfg.num_heads * qk, cfg.q_lora_rank),
            p + "self_attn.kv_a_proj_with_mqa.weight": (cfg.latent_width, h),
            p + "self_attn.kv_a_layernorm.weight": (cfg.kv_lora_rank,),
            p + "self_attn.kv_b_proj.weight": (
                cfg.num_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank),
            p + "self_attn.o_proj.weight": (h, cfg.num_heads * cfg.v_head_dim),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (cfg.intermediate_size, h),
            p + "mlp.up_proj.weight": (cfg.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, cfg.intermediate_size),
        })
    shapes["norm.weight"] = (h,)
    if cfg.markov_rank:
        shapes["markov_head.markov_w1.weight"] = (v, cfg.markov_rank)
        shapes["markov_head.markov_w2.weight"] = (v, cfg.markov_rank)
    if cfg.confidence_head:
        width = h + (cfg.markov_rank if cfg.confidence_head_with_markov else 0)
        shapes["confidence_head.proj.weight"] = (1, width)
        shapes["confidence_head.proj.bias"] = (1,)
    return shapes


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def mla_config_to_json(cfg: MLAConfig, dtype: torch.dtype) -> dict[str, Any]:
    """The ``config.json`` that :func:`mla_config_from_json` reads back (docs/checkpoint-mla.md)."""
    rope = cfg.rope
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "dspark_mla",
        "torch_dtype": _dtype_name(dtype),
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "q_lora_rank": cfg.q_lora_rank,
        "kv_lora_rank": cfg.kv_lora_rank,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim,
        "intermediate_size": cfg.intermediate_size,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": rope.theta,
        "rope_scaling": {
            "type": "yarn",
            "rope_type": "yarn",
            "factor": rope.factor,
            "original_max_position_embeddings": rope.original_max_position_embeddings,
            "beta_fast": rope.beta_fast,
            "beta_slow": rope.beta_slow,
            "mscale": rope.mscale,
            "mscale_all_dim": rope.mscale_all_dim,
            "truncate": rope.truncate,
        },
        "target_hidden_size": cfg.target_hidden_size,
        "dspark_config": {
            "block_size": cfg.block_size,
            "mask_token_id": cfg.mask_token_id,
            "target_layer_ids": list(cfg.target_layer_ids),
            "shift_label": True,
            "markov_rank": cfg.markov_rank,
            "markov_head_type": "vanilla",
            "use_confidence_head": cfg.confidence_head,
            "confidence_head_with_markov": cfg.confidence_head_with_markov,
        },
    }


def _required(raw: Mapping[str, Any], key: str, origin: str) -> Any:
    if raw.get(key) is None:
        raise CheckpointError(f"{origin} lacks {key!r}; a dspark-mla drafter needs it")
    return raw[key]


def _rope_from_json(raw: Mapping[str, Any], origin: str) -> YarnRope:
    key = "rope_parameters" if raw.get("rope_parameters") else "rope_scaling"
    scaling = config_mapping(raw.get(key), key)
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "yarn":
        raise CheckpointError(
            f"{origin} declares rope type {kind!r}; the dspark-mla drafter accepts only 'yarn' "
            "(rope_scaling or rope_parameters with rope_type = 'yarn')"
        )
    for key in ("factor", "original_max_position_embeddings"):
        _required(scaling, key, f"{origin} rope_scaling")
    values = {
        "theta": scaling.get("rope_theta") or raw.get("rope_theta") or 10000.0,
        "factor": scaling["factor"],
        "original_max_position_embeddings": scaling["original_max_position_embeddings"],
        "beta_fast": scaling.get("beta_fast") or 32.0,
        "beta_slow": scaling.get("beta_slow") or 1.0,
        "mscale": scaling.get("mscale", 1.0),
        "mscale_all_dim": scaling.get("mscale_all_dim", 0.0),
        "truncate": scaling.get("truncate", True),
    }
    try:
        return YarnRope(**values)
    except ValidationError as exc:
        raise CheckpointError(f"{origin}: invalid YaRN parameters: {exc}") from None


def mla_config_from_json(
    raw: Mapping[str, Any], target: TargetInfo | None = None, origin: str = CONFIG_FILE
) -> MLAConfig:
    """Resolve a ``config.json`` (drafter keys: ``dspark_config``, then ``dflash_config``, then
    the top level) into an :class:`MLAConfig`; :class:`CheckpointError` on anything unusable."""
    with config_errors(origin):
        return _mla_config_from_json(raw, target, origin)


def _mla_config_from_json(
    raw: Mapping[str, Any], target: TargetInfo | None, origin: str
) -> MLAConfig:
    if raw.get("q_lora_rank") is None:
        raise CheckpointError(
            f"{origin}: q_lora_rank is missing or null; the dspark-mla drafter needs the "
            "q_a_proj/q_b_proj low-rank query path"
        )
    if not truthy(draft_value(raw, "shift_label", True), "shift_label"):
        raise CheckpointError(f"{origin}: shift_label = false; dspark-mla uses the shift convention")
    if truthy(draft_value(raw, "causal", False), "causal"):
        raise CheckpointError(f"{origin}: causal = true; DSpark block attention is non-causal")
    markov_rank = config_int(draft_value(raw, "markov_rank", 0) or 0, "markov_rank")
    head_type = str(draft_value(raw, "markov_head_type", "vanilla") or "vanilla").lower()
    if markov_rank and head_type != "vanilla":
        raise CheckpointError(
            f"{origin}: markov_head_type {head_type!r} is not supported by dspark-mla "
            "(only 'vanilla')"
        )
    confidence, with_markov = confidence_flags(raw)

    def integer(key: str) -> int:
        return config_int(_required(raw, key, origin), key)

    num_layers = integer("num_hidden_layers")
    num_target_layers = raw.get("num_target_layers")
    if num_target_layers:
        num_target_layers = config_int(num_target_layers, "num_target_layers", minimum=1)
        # as dspark-gqa's reader: the depth of the training target is known only from here
        if target is not None and num_target_layers != target.num_layers:
            raise CheckpointError(
                f"{origin}: checkpoint was trained on a target of {num_target_layers} layers, "
                f"the target has {target.num_layers}; use a drafter trained for this target"
            )
    else:
        num_target_layers = target.num_layers if target else None
    ids = draft_value(raw, "target_layer_ids")
    if ids is None:
        if num_target_layers is None:
            raise CheckpointError(
                f"{origin} has neither target_layer_ids nor num_target_layers, and no target "
                "was given to derive them from"
            )
        ids = build_target_layer_ids(num_target_layers, num_layers)
    ids = config_layer_ids(ids)
    if num_target_layers is not None:
        ids = validate_target_layer_ids(ids, num_target_layers)
    mask = draft_value(raw, "mask_token_id")
    if mask is None:
        raise CheckpointError(f"{origin} lacks mask_token_id (in dspark_config or top level)")
    hidden = integer("hidden_size")
    vocab = integer("vocab_size")
    # the drafter's sizes are the checkpoint's own; whether they fit the target is bind's check
    target_hidden = config_int(
        draft_value(raw, "target_hidden_size")
        or (target.hidden_size if target is not None else hidden),
        "target_hidden_size",
    )
    try:
        return MLAConfig(
            num_layers=num_layers,
            num_heads=integer("num_attention_heads"),
            q_lora_rank=config_int(raw["q_lora_rank"], "q_lora_rank"),
            kv_lora_rank=integer("kv_lora_rank"),
            qk_nope_head_dim=integer("qk_nope_head_dim"),
            qk_rope_head_dim=integer("qk_rope_head_dim"),
            v_head_dim=integer("v_head_dim"),
            intermediate_size=integer("intermediate_size"),
            rms_norm_eps=config_float(raw.get("rms_norm_eps", 1e-6), "rms_norm_eps"),
            rope=_rope_from_json(raw, origin),
            max_position_embeddings=config_int(raw.get("max_position_embeddings", 16384),
                                               "max_position_embeddings"),
            block_size=config_int(draft_value(raw, "block_size", 16), "block_size"),
            mask_token_id=config_int(mask, "mask_token_id"),
            target_layer_ids=tuple(ids),
            markov_rank=markov_rank,
            confidence_head=confidence,
            confidence_head_with_markov=with_markov,
            hidden_size=hidden,
            vocab_size=vocab,
            target_hidden_size=target_hidden,
        )
    except ValidationError as exc:
        raise CheckpointError(f"{origin} describes an invalid dspark-mla drafter: {exc}") from None
