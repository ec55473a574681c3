"""The shared GQA drafter backbone of the ``dflash`` and ``dspark-gqa`` families (spec 1.5-1.7,
2.2-2.5, 2.9) and its loader.

It owns: the architecture resolved from a checkpoint config (:class:`GQADrafterSpec`), per-layer
attention visibility (:class:`LayerVisibility`), the network (:class:`GQADrafter`, which implements
the ``Drafter`` Protocol), random initialisation from family options, and loading/saving with
safetensors. It never runs the Markov chain, picks tokens or manages pages: it reads the pages the
runtime lends it through ``DraftBlockPlacement``.

May import ``contract`` (and ``kernels``) only; never ``runtime`` or ``selection``.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from draftsmith.contract import (
    BlockConvention,
    CheckpointError,
    ConfigError,
    ContextCacheKind,
    ContextEntrySpec,
    DraftBlockInputs,
    DraftBlockPlacement,
    DrafterCapabilities,
    LoadRequest,
    LogitsShard,
    MarkovHeadKind,
    MarkovHeadWeights,
    OutputHead,
    PagedContextCache,
    PlanError,
    ShapeError,
    TargetInfo,
    check_tensor,
)
from draftsmith.drafters.calibration import check_temperatures
from draftsmith.drafters.checkpoint import (
    CONFIG_FILE,
    WEIGHT_DTYPES,
    WEIGHTS_FILE,
    TensorSource,
    build_target_layer_ids,
    check_options_agree,
    confidence_flags,
    config_dtype,
    config_errors,
    config_float,
    config_int,
    config_layer_ids,
    config_mapping,
    draft_value,
    load_tensors,
    read_config,
    require,
    save_tensors,
    shape_str,
    truthy,
    validate_target_layer_ids,
    write_text_atomic,
)
from draftsmith.drafters.nn import (
    RMSNorm,
    SwiGLU,
    check_token_range,
    context_columns,
    context_index,
    gather_context,
    norm_rope,
    rope_cos_sin,
    rope_inv_freq,
)

logger = logging.getLogger(__name__)

DFLASH_ARCH = "DFlashDraftModel"
"""``architectures[0]`` of z-lab DFlash checkpoints and of DFlash-style DSpark exports."""
DFLASH2_ARCH = "DFlash2DraftModel"
"""The z-lab "DFlash 2" variant, which draftsmith does not implement (spec 1.9)."""
DEEPSPEC_SUFFIX = "DSparkModel"
"""DeepSpec native architectures end with this (``Qwen3DSparkModel``)."""

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


class Flavour(StrEnum):
    """Which reference a checkpoint follows; it fixes the sliding-window rule (spec 9, item 8)."""

    ZLAB = "z-lab"
    """z-lab DFlash: sliding layers causal unless ``is_causal`` says otherwise."""
    DSPARK = "dspark"
    """DeepSpec / DSpark exports: sliding layers non-causal with a symmetric window."""


@dataclass(frozen=True)
class LayerVisibility:
    """Which keys a block query sees in one layer (spec 1.6).

    ``window = None`` means unbounded. A key at position ``kp`` is visible to a query at ``qp`` iff
    ``(not causal or kp <= qp)`` and, with a window ``w``, ``qp - kp < w`` and (non-causal)
    ``kp - qp < w``.
    """

    causal: bool = False
    window: int | None = None

    def window_tuple(self) -> tuple[int, int]:
        """Flash-attention ``(left, right)``: ``-1`` for unbounded, ``0`` right when causal."""
        left = -1 if self.window is None else self.window - 1
        right = 0 if self.causal else left
        return left, right

    def mask(self, query_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
        """``query_pos: [G, W]``, ``key_pos: [G, N]`` int64 -> visible ``[G, W, N] bool``."""
        qp, kp = query_pos[:, :, None], key_pos[:, None, :]
        visible = torch.ones(qp.shape[0], qp.shape[1], kp.shape[2], dtype=torch.bool,
                             device=query_pos.device)
        if self.causal:
            visible &= kp <= qp
        if self.window is not None:
            visible &= (qp - kp) < self.window
            if not self.causal:
                visible &= (kp - qp) < self.window
        return visible


@dataclass(frozen=True)
class GQADrafterSpec:
    """The resolved architecture of one GQA drafter (everything but the weights)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    target_hidden_size: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None
    block_size: int
    mask_token_id: int
    visibility: tuple[LayerVisibility, ...]
    block_convention: BlockConvention
    flavour: Flavour
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    max_position_embeddings: int = 32768
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    markov_head: MarkovHeadKind = MarkovHeadKind.NONE
    markov_rank: int = 0
    confidence_head: bool = False
    confidence_head_with_markov: bool = False
    own_embedding: bool = False
    sts_temperatures: tuple[float, ...] | None = None
    """Sequential Temperature Scaling table (spec 2.6): one ``tau > 0`` per block position."""

    @property
    def feature_width(self) -> int:
        """``n_cap * H_t``."""
        return len(self.target_layer_ids) * self.target_hidden_size

    @property
    def confidence_in_features(self) -> int:
        """Input width of the confidence projection: ``H + r`` with the Markov feature, else ``H``."""
        return self.hidden_size + (self.markov_rank if self.confidence_head_with_markov else 0)


# --------------------------------------------------------------------------------------------
# Config resolution
# --------------------------------------------------------------------------------------------


def _architecture(config: Mapping[str, Any]) -> str:
    archs = config.get("architectures") or [DFLASH_ARCH]
    if isinstance(archs, str):
        archs = [archs]
    if not isinstance(archs, list):
        raise CheckpointError(f"config architectures is {archs!r}; it must be a list of names")
    arch = str(archs[0])
    if arch == DFLASH2_ARCH:
        raise CheckpointError(
            f"architecture {DFLASH2_ARCH} (DFlash 2: dynamic convolutions and a candidate selector)"
            " is not supported by draftsmith; use a DFlashDraftModel or DSpark checkpoint"
        )
    if arch != DFLASH_ARCH and not arch.endswith(DEEPSPEC_SUFFIX):
        raise CheckpointError(
            f"unknown drafter architecture {arch!r}; expected {DFLASH_ARCH} or a DeepSpec "
            f"*{DEEPSPEC_SUFFIX}"
        )
    return arch


SPECULATORS_KINDS = {"dflash": "DFlashSpeculator", "dspark": "DSparkSpeculator"}
"""``speculators_model_type`` -> ``architectures[0]`` of the ``speculators`` package's block
drafters (its ``DFlashSpeculatorConfig`` / ``DSparkSpeculatorConfig``)."""


def is_speculators_config(config: Mapping[str, Any]) -> bool:
    """Whether ``config`` is in the ``speculators`` layout (it names ``speculators_model_type``)."""
    return "speculators_model_type" in config


def from_speculators_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A ``speculators`` DFlash / DSpark config rewritten as the DFlash-style config this module
    reads (docs/serving.md, "speculators").

    ``transformer_layer_config`` supplies the backbone keys; ``aux_hidden_state_layer_ids``
    counts Hugging Face hidden-state entries (embedding output = 0), so the target layers are
    those ids minus one; ``sample_from_anchor`` is the shift convention; full-attention layers
    are bidirectional and sliding layers causal unless ``sliding_window_non_causal``. Absent keys
    take the package's defaults (block 8, DSpark rank 256 vanilla with a Markov-fed confidence
    head, DSpark anchors sampled). A reduced draft vocabulary cannot be expressed and raises.
    """
    kind = config.get("speculators_model_type")
    if kind not in SPECULATORS_KINDS:
        raise CheckpointError(
            f"speculators_model_type {kind!r} is not a block drafter draftsmith reads; it reads "
            f"{sorted(SPECULATORS_KINDS)}"
        )
    layer = dict(config_mapping(config.get("transformer_layer_config"),
                                "transformer_layer_config"))
    if not layer:
        raise CheckpointError(
            "speculators config lacks transformer_layer_config (the backbone's Qwen3 keys)"
        )
    vocab = layer.get("vocab_size")
    draft_vocab = config.get("draft_vocab_size", vocab)
    if draft_vocab != vocab:
        raise CheckpointError(
            f"speculators draft_vocab_size {draft_vocab} differs from vocab_size {vocab}: a "
            "reduced draft vocabulary (d2t/t2d tables) is not supported; drafter and target "
            "must share one vocabulary"
        )
    aux = config.get("aux_hidden_state_layer_ids")
    if aux is None:
        raise CheckpointError("speculators config lacks aux_hidden_state_layer_ids")
    dspark = kind == "dspark"
    shift = truthy(config.get("sample_from_anchor", dspark), "sample_from_anchor")
    non_causal = truthy(config.get("sliding_window_non_causal", False),
                        "sliding_window_non_causal")
    sliding = any(t == "sliding_attention" for t in layer.get("layer_types") or ())
    section: dict[str, Any] = {
        "target_layer_ids": [i - 1 for i in config_layer_ids(aux, "aux_hidden_state_layer_ids")],
        "mask_token_id": config.get("mask_token_id"),
        "block_size": config.get("block_size", 8),
        "shift_label": shift,
    }
    out = {k: v for k, v in layer.items() if k not in ("dflash_config", "dspark_config")}
    out["architectures"] = [DFLASH_ARCH]
    for key in ("torch_dtype", "sts_temperatures"):
        if key in config:
            out[key] = config[key]
    if dspark:
        if sliding and not non_causal:
            raise CheckpointError(
                "speculators DSpark config has causal sliding layers (sliding_window_non_causal "
                "is false); DSpark drafters attend non-causally: set it to true"
            )
        rank = config.get("markov_rank", 256)
        section.update(
            projector_type="dspark",
            causal=False,
            markov_rank=rank,
            markov_head_type=config.get("markov_head_type", "vanilla"),
            use_confidence_head=config.get("enable_confidence_head", True),
            confidence_head_with_markov=config.get("confidence_head_with_markov", True),
            **_swa_fields(layer.get("sliding_window") if sliding else None),
        )
        out["dspark_config"] = section
    else:
        if sliding and non_causal:
            out["is_causal"] = False
        out["dflash_config"] = section
    return out


def _rope_theta(config: Mapping[str, Any]) -> float:
    params = config_mapping(config.get("rope_parameters"), "rope_parameters")
    scaling = config_mapping(config.get("rope_scaling"), "rope_scaling")
    for table in (params, scaling):
        kind = table.get("rope_type", table.get("type", "default"))
        if kind not in (None, "default"):
            raise CheckpointError(
                f"rope type {kind!r} is not supported by the GQA drafters; only default RoPE is"
            )
    theta = config_float(config.get("rope_theta", params.get("rope_theta", 10000.0)),
                         "rope_theta")
    if theta <= 0:
        raise CheckpointError(f"config rope_theta is {theta}; it must be > 0")
    return theta


def resolve_visibility(
    config: Mapping[str, Any], num_layers: int, flavour: Flavour, native: bool = False
) -> tuple[LayerVisibility, ...]:
    """Per-layer visibility (spec 1.6, 2.9 and 9 item 8).

    * z-lab: ``layer_types`` / ``sliding_window``, sliding layers causal unless ``is_causal``.
    * DSpark, DeepSpec native (``native``): Hugging Face semantics, ``sliding_window`` on the
      ``sliding_attention`` layers, non-causal.
    * DSpark, DFlash-style export: the window is on only when ``use_swa`` is true; it is
      ``swa_window_size`` on the sliding layers (every layer when ``layer_types`` is absent),
      non-causal and symmetric, as TensorRT-LLM's ``dspark_layer_window_size`` reads it.
    """
    layer_types = config.get("layer_types")
    if layer_types is not None and (
        isinstance(layer_types, str) or not isinstance(layer_types, (list, tuple))
    ):
        raise CheckpointError(
            f"config layer_types is {layer_types!r}; it must be a list with one entry per layer"
        )
    if layer_types is not None and len(layer_types) != num_layers:
        raise CheckpointError(
            f"config layer_types has {len(layer_types)} entries for {num_layers} drafter layers"
        )
    for kind in layer_types or ():
        if kind not in ("full_attention", "sliding_attention"):
            raise CheckpointError(
                f"layer type {kind!r} is not supported; use full_attention or sliding_attention"
            )
    if flavour is Flavour.DSPARK:
        if truthy(draft_value(config, "causal", False), "causal"):
            raise CheckpointError(
                "DSpark config sets causal = true; DSpark drafters attend non-causally over the "
                "block (spec 2.9). Set causal to false or remove it"
            )
        if native:
            window = config.get("sliding_window")
        elif truthy(draft_value(config, "use_swa", False), "use_swa"):
            window = draft_value(config, "swa_window_size")
            if window is None or config_int(window, "swa_window_size") < 1:
                raise CheckpointError(
                    f"DSpark config sets use_swa but swa_window_size is {window!r}; give a "
                    "window >= 1 or set use_swa to false"
                )
            layer_types = layer_types or ["sliding_attention"] * num_layers
        else:
            return tuple(LayerVisibility() for _ in range(num_layers))
        width = None if window is None else config_int(window, "sliding_window", minimum=1)
        return tuple(
            LayerVisibility(False, width)
            if width is not None and layer_types is not None and kind == "sliding_attention"
            else LayerVisibility()
            for kind in (layer_types or ["full_attention"] * num_layers)
        )
    is_causal = config.get("is_causal")
    window = config.get("sliding_window")
    width = None if not window else config_int(window, "sliding_window", minimum=1)
    out = []
    for i in range(num_layers):
        sliding = layer_types is not None and layer_types[i] == "sliding_attention"
        causal = sliding if is_causal is None else truthy(is_causal, "is_causal")
        out.append(LayerVisibility(causal, width if sliding else None))
    return tuple(out)


def has_dspark_heads(config: Mapping[str, Any]) -> bool:
    """Whether a (DFlash-style or DeepSpec) config declares a Markov or a confidence head."""
    rank = config_int(draft_value(config, "markov_rank", 0) or 0, "markov_rank")
    return rank > 0 or confidence_flags(config)[0]


def resolve_flavour(config: Mapping[str, Any], family: str, arch: str) -> Flavour:
    """Spec 9 item 8: which reference a checkpoint follows, from the checkpoint alone.

    DeepSpec architectures and ``projector_type == "dspark"`` are DSpark. A DFlash-style DSpark
    export that omits ``projector_type`` still says what it is (a ``dspark_config`` section,
    DSpark heads, ``shift_label = true``), which a ``dspark-gqa`` load accepts. A plain z-lab
    DFlash config is not read as DSpark: that would shift its block and turn its causal sliding
    layers into symmetric windows, so ``dspark-gqa`` refuses it.
    """
    if arch.endswith(DEEPSPEC_SUFFIX) or draft_value(config, "projector_type") == "dspark":
        return Flavour.DSPARK
    if family != "dspark-gqa":
        return Flavour.ZLAB
    if (
        isinstance(config.get("dspark_config"), Mapping)
        or has_dspark_heads(config)
        or truthy(draft_value(config, "shift_label", False), "shift_label")
    ):
        return Flavour.DSPARK
    raise CheckpointError(
        f"config describes a z-lab DFlash drafter ({arch} without projector_type = \"dspark\", "
        "shift_label, a dspark_config section or DSpark heads), not a DSpark one; load it with "
        "family 'dflash', or add a dspark_config section with projector_type = \"dspark\" if it "
        "really is a DSpark export"
    )


def resolve_block_convention(
    config: Mapping[str, Any], family: str, arch: str, flavour: Flavour
) -> BlockConvention:
    """Spec 9 item 7: ``Qwen3DSparkModel`` and DSpark exports shift; ``DFlashDraftModel`` shifts
    only when ``shift_label`` (or ``projector_type == "dspark"``) says so. The decision is logged."""
    shift_label = draft_value(config, "shift_label")
    if shift_label is not None:
        shift, why = truthy(shift_label, "shift_label"), f"shift_label = {shift_label!r}"
    elif arch.endswith(DEEPSPEC_SUFFIX):
        shift, why = True, f"DeepSpec architecture {arch}"
    elif flavour is Flavour.DSPARK:
        shift, why = True, (
            'projector_type = "dspark"' if draft_value(config, "projector_type") == "dspark"
            else "DSpark export"
        )
    else:
        shift, why = False, f"z-lab {arch} without shift_label"
    if family == "dspark-gqa" and not shift:
        raise CheckpointError(
            f"dspark-gqa drafters use the shift convention, but the checkpoint says {why}; "
            "load it with family 'dflash' or remove shift_label"
        )
    convention = BlockConvention.SHIFT if shift else BlockConvention.BONUS_SILENT
    logger.info("%s checkpoint: block convention %s (%s)", family, convention.value, why)
    return convention


def spec_from_config(
    config: Mapping[str, Any],
    family: str,
    own_embedding: bool = False,
    target: TargetInfo | None = None,
    origin: str = CONFIG_FILE,
) -> GQADrafterSpec:
    """Resolve a checkpoint config (z-lab, DeepSpec native or DFlash-style export) for ``family``.

    Every unusable value raises :class:`CheckpointError` that names ``origin`` and the key.
    """
    with config_errors(origin):
        if is_speculators_config(config):
            config = from_speculators_config(config)
        return _spec_from_config(config, family, own_embedding, target)


def _spec_from_config(
    config: Mapping[str, Any],
    family: str,
    own_embedding: bool,
    target: TargetInfo | None,
) -> GQADrafterSpec:
    arch = _architecture(config)
    flavour = resolve_flavour(config, family, arch)
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"hidden_act {act!r} is not supported; GQA drafters use silu")
    hidden = config_int(require(config, "hidden_size"), "hidden_size", minimum=1)
    num_layers = config_int(require(config, "num_hidden_layers"), "num_hidden_layers", minimum=1)
    num_heads = config_int(require(config, "num_attention_heads"), "num_attention_heads",
                           minimum=1)
    num_kv = config_int(config.get("num_key_value_heads") or num_heads, "num_key_value_heads",
                        minimum=1)
    head_dim = config_int(config.get("head_dim") or hidden // num_heads, "head_dim", minimum=2)
    if head_dim % 2:
        raise CheckpointError(f"config head_dim is {head_dim}; rotate-half RoPE needs it even")
    if num_heads % num_kv:
        raise CheckpointError(
            f"num_attention_heads {num_heads} is not a multiple of num_key_value_heads {num_kv}"
        )
    intermediate = config_int(require(config, "intermediate_size"), "intermediate_size",
                              minimum=1)
    num_target_layers = config.get("num_target_layers")
    if num_target_layers is not None:
        num_target_layers = config_int(num_target_layers, "num_target_layers", minimum=1)
    elif target is not None:
        num_target_layers = target.num_layers
    ids = draft_value(config, "target_layer_ids")
    if ids is None:
        if num_target_layers is None:
            raise CheckpointError(
                "config has neither target_layer_ids nor num_target_layers; add one of them"
            )
        ids = build_target_layer_ids(num_target_layers, num_layers)
    ids = config_layer_ids(ids)
    if num_target_layers is not None:
        ids = validate_target_layer_ids(ids, num_target_layers)
    elif not ids:
        raise CheckpointError("target_layer_ids is empty; name at least one target layer")
    vocab = config_int(require(config, "vocab_size"), "vocab_size", minimum=1)
    mask_token_id = draft_value(config, "mask_token_id")
    if mask_token_id is None:
        raise CheckpointError("config lacks mask_token_id (in dflash_config or at top level)")
    mask_token_id = config_int(mask_token_id, "mask_token_id")
    if not 0 <= mask_token_id < vocab:
        raise CheckpointError(
            f"config mask_token_id {mask_token_id} is outside the vocabulary 0..{vocab - 1}; "
            "set it to the id the drafter was trained to use for mask slots"
        )
    softcap = draft_value(config, "final_logit_softcapping")
    softcap = None if softcap is None else config_float(softcap, "final_logit_softcapping")
    softcap = softcap if softcap is not None and softcap > 0 else None

    markov_rank = config_int(draft_value(config, "markov_rank", 0) or 0, "markov_rank")
    if markov_rank < 0:
        raise CheckpointError(f"markov_rank must be >= 0, got {markov_rank}")
    markov = MarkovHeadKind.NONE
    if markov_rank > 0:
        kind = str(draft_value(config, "markov_head_type", "vanilla")).lower()
        try:
            markov = MarkovHeadKind(kind)
        except ValueError:
            raise CheckpointError(
                f"markov_head_type {kind!r} is unknown; use vanilla, gated or rnn"
            ) from None
        if markov is MarkovHeadKind.NONE:
            raise CheckpointError("markov_head_type 'none' needs markov_rank 0")
    confidence, with_markov = confidence_flags(config)
    if with_markov and markov_rank == 0:
        raise CheckpointError(
            "confidence_head_with_markov is true but markov_rank is 0; the confidence feature "
            "needs the Markov embedding w1"
        )
    if family == "dflash" and (markov_rank > 0 or confidence):
        raise CheckpointError(
            f"checkpoint has a DSpark head (markov_rank {markov_rank}, confidence head "
            f"{confidence}); load it with family 'dspark-gqa'"
        )
    block_size = config_int(draft_value(config, "block_size", 16), "block_size", minimum=1)
    sts = _sts_from_config(draft_value(config, "sts_temperatures"), block_size, confidence)
    rms_norm_eps = config_float(config.get("rms_norm_eps", 1e-6), "rms_norm_eps")
    if rms_norm_eps <= 0:
        raise CheckpointError(f"config rms_norm_eps is {rms_norm_eps}; it must be > 0")
    return GQADrafterSpec(
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=vocab,
        target_hidden_size=int(target.hidden_size) if target is not None else hidden,
        target_layer_ids=tuple(ids),
        num_target_layers=num_target_layers,
        block_size=block_size,
        mask_token_id=mask_token_id,
        visibility=resolve_visibility(config, num_layers, flavour,
                                      native=arch.endswith(DEEPSPEC_SUFFIX)),
        block_convention=resolve_block_convention(config, family, arch, flavour),
        flavour=flavour,
        rms_norm_eps=rms_norm_eps,
        rope_theta=_rope_theta(config),
        attention_bias=truthy(config.get("attention_bias", False), "attention_bias"),
        max_position_embeddings=config_int(config.get("max_position_embeddings", 32768),
                                           "max_position_embeddings", minimum=1),
        input_embedding_scale=config_float(draft_value(config, "input_embedding_scale", 1.0),
                                           "input_embedding_scale"),
        output_multiplier=config_float(draft_value(config, "output_multiplier", 1.0),
                                       "output_multiplier"),
        final_logit_softcapping=softcap,
        markov_head=markov,
        markov_rank=markov_rank,
        confidence_head=confidence,
        confidence_head_with_markov=with_markov,
        own_embedding=own_embedding,
        sts_temperatures=sts,
    )


def _sts_from_config(
    value: Any, block_size: int, confidence: bool
) -> tuple[float, ...] | None:
    """The optional ``sts_temperatures`` key: ``block_size`` finite floats, each ``> 0``."""
    if value is None:
        return None
    if not confidence:
        raise CheckpointError(
            "config sets sts_temperatures but the drafter has no confidence head; remove the "
            "table or enable use_confidence_head"
        )
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(t, (int, float)) and not isinstance(t, bool) for t in value
    ):
        raise CheckpointError(f"sts_temperatures must be a list of floats, got {value!r}")
    if len(value) != block_size:
        raise CheckpointError(
            f"sts_temperatures has {len(value)} entries; it needs one per block position "
            f"(block_size {block_size})"
        )
    for index, tau in enumerate(value):
        if not math.isfinite(tau) or tau <= 0:
            raise CheckpointError(
                f"sts_temperatures[{index}] is {tau!r}; every temperature must be a finite "
                "float > 0"
            )
    return tuple(float(t) for t in value)


def _layer_types_for(
    spec: GQADrafterSpec, window: int | None
) -> tuple[list[str], bool | None]:
    """``layer_types`` and ``is_causal`` that :func:`resolve_visibility` maps back to exactly
    ``spec.visibility`` under the spec's flavour."""
    candidates = (None,) if spec.flavour is Flavour.DSPARK else (None, False, True)
    for is_causal in candidates:
        types = [
            "sliding_attention"
            if v.window is not None or (v.causal and is_causal is None) else "full_attention"
            for v in spec.visibility
        ]
        probe: dict[str, Any] = {"layer_types": types, "sliding_window": window,
                                 "dspark_config": _swa_fields(window)}
        if is_causal is not None:
            probe["is_causal"] = is_causal
        try:
            if resolve_visibility(probe, spec.num_layers, spec.flavour) == spec.visibility:
                return types, is_causal
        except CheckpointError:
            continue
    raise CheckpointError(
        f"per-layer visibility {spec.visibility} cannot be written as a {spec.flavour.value} config"
    )


def _swa_fields(window: int | None) -> dict[str, Any]:
    """The DFlash-style export's window keys."""
    return {"use_swa": window is not None, "swa_window_size": window or 0}


def architecture_config(spec: GQADrafterSpec) -> dict[str, Any]:
    """The Qwen3 keys of the backbone that every layout shares: sizes, RoPE, ``layer_types`` and,
    when the spec has them, ``sliding_window`` / ``use_sliding_window`` / ``is_causal`` and
    ``num_target_layers``. Written so that :func:`resolve_visibility` maps them back to
    ``spec.visibility`` under ``spec.flavour``; :class:`CheckpointError` when no such keys exist
    (per-layer windows of different widths, or a visibility the flavour's rule cannot produce)."""
    windows = {v.window for v in spec.visibility if v.window is not None}
    if len(windows) > 1:
        raise CheckpointError(f"cannot save per-layer windows {sorted(windows)}: config.json "
                              "holds one sliding_window")
    window = windows.pop() if windows else None
    layer_types, is_causal = _layer_types_for(spec, window)
    config: dict[str, Any] = {
        "model_type": "qwen3",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "attention_bias": spec.attention_bias,
        "rms_norm_eps": spec.rms_norm_eps,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "rope_theta": spec.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
        "layer_types": layer_types,
        "tie_word_embeddings": False,
    }
    if window is not None:
        config["sliding_window"] = window
        config["use_sliding_window"] = True
    if spec.num_target_layers is not None:
        config["num_target_layers"] = spec.num_target_layers
    if is_causal is not None:
        config["is_causal"] = is_causal
    return config


def spec_to_config(spec: GQADrafterSpec, family: str) -> dict[str, Any]:
    """The config ``save`` writes: z-lab layout for ``dflash`` (``dflash_config``), DFlash-style
    DSpark export for ``dspark-gqa`` (``dspark_config``). ``spec_from_config`` reads it back."""
    config: dict[str, Any] = {"architectures": [DFLASH_ARCH], **architecture_config(spec)}
    draft: dict[str, Any] = {
        "target_layer_ids": list(spec.target_layer_ids),
        "mask_token_id": spec.mask_token_id,
        "block_size": spec.block_size,
        "input_embedding_scale": spec.input_embedding_scale,
        "output_multiplier": spec.output_multiplier,
    }
    if spec.final_logit_softcapping is not None:
        draft["final_logit_softcapping"] = spec.final_logit_softcapping
    if spec.flavour is Flavour.DSPARK:
        draft.update(_swa_fields(config.get("sliding_window")))
    if family == "dflash":
        draft["shift_label"] = spec.block_convention is BlockConvention.SHIFT
        if spec.flavour is Flavour.DSPARK:
            draft["projector_type"] = "dspark"
        config["dflash_config"] = draft
    else:
        draft.update(
            projector_type="dspark",
            shift_label=True,
            causal=False,
            markov_rank=spec.markov_rank,
            use_confidence_head=spec.confidence_head,
            confidence_head_with_markov=spec.confidence_head_with_markov,
        )
        if spec.markov_rank > 0:
            draft["markov_head_type"] = spec.markov_head.value
        if spec.sts_temperatures is not None:
            draft["sts_temperatures"] = list(spec.sts_temperatures)
        config["dspark_config"] = draft
    return config


# --------------------------------------------------------------------------------------------
# The network
# --------------------------------------------------------------------------------------------


class GQAAttention(nn.Module):
    """Projections and per-head q/k norms of one drafter layer (``self_attn.*`` tensors)."""

    def __init__(self, spec: GQADrafterSpec) -> None:
        super().__init__()
        h, hd, bias = spec.hidden_size, spec.head_dim, spec.attention_bias
        self.q_proj = nn.Linear(h, spec.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(h, spec.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(h, spec.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(spec.num_heads * hd, h, bias=bias)
        self.q_norm = RMSNorm(hd, spec.rms_norm_eps)
        self.k_norm = RMSNorm(hd, spec.rms_norm_eps)


class GQALayer(nn.Module):
    """One drafter decoder layer: pre-norm attention and SwiGLU MLP."""

    def __init__(self, spec: GQADrafterSpec) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = GQAAttention(spec)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = SwiGLU(spec.hidden_size, spec.intermediate_size)


class GQADrafter(nn.Module):
    """A DFlash / DSpark GQA drafter (spec 1.5-1.7, 2.3-2.5) implementing ``Drafter``.

    Parameter names are the z-lab ones (``fc``, ``hidden_norm``, ``norm``, ``layers.{i}.*``) plus
    ``embed_tokens.weight``, ``markov_w1.weight``, ``markov_w2.weight``, ``markov_gate_proj.*``,
    ``markov_joint_proj.*`` and ``confidence_proj.*`` when the checkpoint has them.
    """

    def __init__(self, spec: GQADrafterSpec, family: str, tp_rank: int = 0,
                 tp_size: int = 1) -> None:
        super().__init__()
        if len(spec.visibility) != spec.num_layers:
            raise CheckpointError(
                f"{len(spec.visibility)} visibility rules for {spec.num_layers} layers"
            )
        self.spec = spec
        self.family = family
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.fc = nn.Linear(spec.feature_width, spec.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.layers = nn.ModuleList(GQALayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        v, r = spec.vocab_size, spec.markov_rank
        self.embed_tokens = (
            nn.Embedding(v, spec.hidden_size) if spec.own_embedding else None
        )
        self.markov_w1 = nn.Embedding(v, r) if r > 0 else None
        self.markov_w2 = nn.Linear(r, v, bias=False) if r > 0 else None
        self.markov_gate_proj = (
            nn.Linear(spec.hidden_size + r, r) if spec.markov_head is MarkovHeadKind.GATED
            else None
        )
        self.markov_joint_proj = (
            nn.Linear(2 * r + spec.hidden_size, 3 * r) if spec.markov_head is MarkovHeadKind.RNN
            else None
        )
        self.confidence_proj = (
            nn.Linear(spec.confidence_in_features, 1) if spec.confidence_head else None
        )
        if r > 0 and v % tp_size:
            raise CheckpointError(
                f"vocabulary {v} does not split evenly over {tp_size} ranks for the Markov head"
            )

    # -- Drafter protocol -----------------------------------------------------------------

    @property
    def capabilities(self) -> DrafterCapabilities:
        """What this drafter declares (fixed for its lifetime; rebuilt only after a dtype move)."""
        cached = getattr(self, "_capabilities", None)
        if cached is None or cached.dtype != str(self.dtype).removeprefix("torch."):
            cached = self._build_capabilities()
            self._capabilities = cached
        return cached

    def _build_capabilities(self) -> DrafterCapabilities:
        s = self.spec
        return DrafterCapabilities(
            family=self.family,
            block_convention=s.block_convention,
            trained_block_size=s.block_size,
            hidden_size=s.hidden_size,
            vocab_size=s.vocab_size,
            mask_token_id=s.mask_token_id,
            target_layer_ids=s.target_layer_ids,
            target_hidden_size=s.target_hidden_size,
            markov_head=s.markov_head,
            markov_rank=s.markov_rank,
            confidence_head=s.confidence_head,
            context_entry=ContextEntrySpec(
                kind=ContextCacheKind.PAGED_GQA_KV,
                num_layers=s.num_layers,
                planes=2,
                heads=s.num_kv_heads,
                width=s.head_dim,
            ),
            shares_target_embedding=not s.own_embedding,
            shares_target_lm_head=True,
            max_position_embeddings=s.max_position_embeddings,
            dtype=str(self.dtype).removeprefix("torch."),
        )

    @property
    def inv_freq(self) -> torch.Tensor:
        """RoPE inverse frequencies ``[hd / 2] fp32`` (kept fp32 whatever the weight dtype)."""
        return self._inv_freq_on(self.fc.weight.device)

    def _inv_freq_on(self, device: torch.device) -> torch.Tensor:
        """:attr:`inv_freq` cached per device, so a captured forward copies nothing from the host.

        Not a registered buffer: ``Module.to(dtype)`` would round it."""
        cache: dict[torch.device, torch.Tensor] = self.__dict__.setdefault("_inv_freq_cache", {})
        freq = cache.get(device)
        if freq is None:
            freq = rope_inv_freq(self.spec.head_dim, self.spec.rope_theta).to(device)
            cache[device] = freq
        return freq

    @property
    def dtype(self) -> torch.dtype:
        """Weight dtype."""
        return self.fc.weight.dtype

    def project_context(self, features: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Context K/V (spec 1.5): ``features: [T, n_cap * H_t]``, ``positions: [T] int64`` ->
        ``[T, L, 2, n_kv, hd]`` (K with ``k_norm`` and RoPE, V plain) in the weight dtype."""
        sizes: dict[str, int] = {}
        check_tensor("features", features, ("T", self.spec.feature_width), _FLOATS, sizes)
        check_tensor("positions", positions, ("T",), torch.int64, sizes, device=features.device)
        s = self.spec
        with torch.no_grad():
            ctx = self.hidden_norm(self.fc(features.to(self.dtype)))
            cos, sin = rope_cos_sin(positions, self._inv_freq_on(positions.device), ctx.dtype)
            per_layer = []
            for layer in self.layers:
                attn = layer.self_attn
                k = norm_rope(attn.k_norm, attn.k_proj(ctx).view(-1, s.num_kv_heads, s.head_dim),
                              cos, sin)
                v = attn.v_proj(ctx).view(-1, s.num_kv_heads, s.head_dim)
                per_layer.append(torch.stack((k, v), dim=1))
            return torch.stack(per_layer, dim=1)

    def embed_block(
        self, token_ids: torch.Tensor, target_embedding: torch.Tensor | None
    ) -> torch.Tensor:
        """``token_ids: [G, W] int64`` -> ``[G, W, H]``: rows of the drafter's own table when the
        checkpoint ships one, else of ``target_embedding: [V, H]``, times input_embedding_scale.
        An id outside ``0 .. V-1`` raises :class:`ShapeError` (not checked during graph capture)."""
        check_tensor("token_ids", token_ids, ("G", "W"), torch.int64)
        s = self.spec
        check_token_range(token_ids, s.vocab_size)
        if self.embed_tokens is not None:
            table = self.embed_tokens.weight
        else:
            if target_embedding is None:
                raise ShapeError(
                    f"{self.family} embeds blocks with the target's input table; pass "
                    "target_embedding [V, H]"
                )
            table = check_tensor("target_embedding", target_embedding,
                                 (s.vocab_size, s.hidden_size), _FLOATS)
        with torch.no_grad():
            out = F.embedding(token_ids, table)
            if s.input_embedding_scale != 1.0:
                out = out * s.input_embedding_scale
            return out.to(self.dtype)

    def forward_block(
        self,
        inputs: DraftBlockInputs,
        placement: DraftBlockPlacement,
        cache: PagedContextCache,
    ) -> torch.Tensor:
        """Block forward over the paged context (spec 1.6): final-normed hidden ``[G, W, H]``.

        Context column ``c`` of a request sits at RoPE position ``c``; columns ``>= num_ctx`` are
        never attended. Block RoPE positions are ``inputs.positions``. With
        ``placement.context_width`` set the forward reads nothing back to the host and allocates
        only fixed-shape tensors, so it can be captured in a CUDA graph (spec 7); without it one
        ``max(num_ctx)`` read-back sizes the gather.
        """
        s = self.spec
        if inputs.embeddings is None:
            raise ShapeError("DraftBlockInputs.embeddings is None; call embed_block first")
        x = check_tensor("DraftBlockInputs.embeddings", inputs.embeddings,
                         (None, None, s.hidden_size), _FLOATS)
        if placement.num_requests != inputs.num_requests:
            raise ShapeError(
                f"placement has {placement.num_requests} requests, inputs have "
                f"{inputs.num_requests}"
            )
        cache.check_entry(self.capabilities.context_entry)
        g, w = inputs.token_ids.shape
        pos_q = inputs.positions
        columns = context_columns(placement)
        with torch.no_grad():
            x = x.to(self.dtype)
            cos, sin = rope_cos_sin(pos_q, self._inv_freq_on(pos_q.device), x.dtype)
            where = context_index(cache, placement, columns)  # the same for every layer
            masks: dict[LayerVisibility, torch.Tensor] = {}
            for index, layer in enumerate(self.layers):
                entries, valid = gather_context(cache, placement, index, columns, where)
                entries = torch.where(valid[:, :, None, None, None], entries.to(x.dtype), 0)
                vis = s.visibility[index]
                if vis not in masks:
                    cols = torch.arange(entries.shape[1], device=pos_q.device)
                    key_pos = torch.cat((cols.expand(g, -1), pos_q), dim=1)
                    key_ok = torch.cat((valid, torch.ones_like(pos_q, dtype=torch.bool)), dim=1)
                    masks[vis] = vis.mask(pos_q, key_pos) & key_ok[:, None, :]
                x = self._layer(layer, x, entries, masks[vis], cos, sin)
            return self.norm(x)

    def _layer(
        self,
        layer: GQALayer,
        x: torch.Tensor,
        ctx_entries: torch.Tensor,
        mask: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        """One decoder layer. ``x: [G, W, H]``, ``ctx_entries: [G, C, 2, n_kv, hd]``,
        ``mask: [G, W, C + W] bool``, ``cos, sin: [G, W, hd]``."""
        s, attn = self.spec, layer.self_attn
        g, w, _ = x.shape
        a = layer.input_layernorm(x)
        q = norm_rope(attn.q_norm, attn.q_proj(a).view(g, w, s.num_heads, s.head_dim), cos, sin)
        k = norm_rope(attn.k_norm, attn.k_proj(a).view(g, w, s.num_kv_heads, s.head_dim), cos,
                      sin)
        v = attn.v_proj(a).view(g, w, s.num_kv_heads, s.head_dim)
        keys = torch.cat((ctx_entries[:, :, 0], k), dim=1).transpose(1, 2)
        values = torch.cat((ctx_entries[:, :, 1], v), dim=1).transpose(1, 2)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=mask[:, None],
            scale=s.head_dim ** -0.5, enable_gqa=s.num_heads != s.num_kv_heads,
        )
        x = x + attn.o_proj(o.transpose(1, 2).reshape(g, w, s.num_heads * s.head_dim))
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def block_logits(self, hidden: torch.Tensor, head: OutputHead) -> LogitsShard:
        """``hidden: [rows, H]`` -> logits ``[rows, S] fp32`` of ``head``'s shard, times
        output_multiplier, then ``cap * tanh(logits / cap)`` when soft-capping is set (spec 1.7)."""
        s = self.spec
        check_tensor("hidden", hidden, ("rows", s.hidden_size), _FLOATS)
        if head.vocab_size != s.vocab_size or head.weight.shape[1] != s.hidden_size:
            raise ShapeError(
                f"output head covers V={head.vocab_size} with width {head.weight.shape[1]}; the "
                f"drafter needs V={s.vocab_size}, H={s.hidden_size}"
            )
        with torch.no_grad():
            logits = F.linear(hidden.to(head.weight.dtype), head.weight).float()
            if s.output_multiplier != 1.0:
                logits = logits * s.output_multiplier
            cap = s.final_logit_softcapping
            if cap is not None:
                logits = torch.tanh(logits / cap) * cap
        return LogitsShard(logits=logits, vocab_start=head.vocab_start, vocab_size=head.vocab_size)

    def markov_head(self) -> MarkovHeadWeights | None:
        """The Markov head as data: ``w1: [V, r]`` and this rank's ``w2`` rows ``[S, r]``."""
        if self.markov_w1 is None or self.markov_w2 is None:
            return None
        width = self.spec.vocab_size // self.tp_size
        start = self.tp_rank * width
        w2 = self.markov_w2.weight.detach()[start:start + width]
        gate = self.markov_gate_proj
        joint = self.markov_joint_proj
        return MarkovHeadWeights(
            kind=self.spec.markov_head,
            w1=self.markov_w1.weight.detach(),
            w2=w2,
            vocab_start=start,
            gate_weight=None if gate is None else gate.weight.detach(),
            gate_bias=None if gate is None else gate.bias.detach(),
            joint_weight=None if joint is None else joint.weight.detach(),
            joint_bias=None if joint is None else joint.bias.detach(),
        )

    def confidence(self, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        """Raw survival logits ``[G, K] fp32`` (spec 2.5), computed in fp32.

        ``hidden: [G, K, H]`` are the draft slots' final-normed states; ``prev_tokens: [G, K]
        int64`` the anchor then the proposed drafts. With ``confidence_head_with_markov`` the
        feature is ``[h ; w1[prev].to(h.dtype)]``; ids outside ``0..V-1`` give a zero ``w1`` row.
        """
        s = self.spec
        if self.confidence_proj is None:
            raise PlanError(f"{self.family} drafter has no confidence head "
                            "(capabilities.confidence_head is False)")
        sizes: dict[str, int] = {}
        check_tensor("hidden", hidden, ("G", "K", s.hidden_size), _FLOATS, sizes)
        check_tensor("prev_tokens", prev_tokens, ("G", "K"), torch.int64, sizes)
        with torch.no_grad():
            feat = hidden.float()
            if s.confidence_head_with_markov:
                assert self.markov_w1 is not None
                feat = torch.cat((feat, self._w1_rows(prev_tokens).to(hidden.dtype).float()), -1)
            weight = self.confidence_proj.weight.float()
            bias = self.confidence_proj.bias.float()
            return F.linear(feat, weight, bias).squeeze(-1)

    def survival(self, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        """Calibrated prefix survival ``a: [G, K] fp32`` (spec 2.5, 2.6).

        ``c_j = sigmoid(raw_j / tau_j)`` with the drafter's STS table (plain ``sigmoid(raw_j)``
        when it has none), ``a_j = prod_{i <= j} c_i``; ``hidden`` and ``prev_tokens`` as in
        :meth:`confidence`, ``K <= block_size`` (the table's first ``K`` entries are used). The
        table was validated when it was loaded or set, so this reads nothing back to the host.
        """
        raw = self.confidence(hidden, prev_tokens)
        k = raw.shape[1]
        table = self._sts_on(raw.device)
        if table is not None:
            if k > table.shape[0]:
                raise ShapeError(
                    f"{k} draft positions but the STS table covers block_size {table.shape[0]}"
                )
            raw = raw / table[:k]
        return torch.cumprod(torch.sigmoid(raw), dim=1)

    @property
    def sts_temperatures(self) -> torch.Tensor | None:
        """The STS table ``[block_size] fp32`` (CPU), or ``None`` when the drafter has none."""
        table = self.spec.sts_temperatures
        return None if table is None else torch.tensor(table, dtype=torch.float32)

    def set_sts(self, tau: torch.Tensor | None) -> None:
        """Install an STS table ``tau: [block_size]`` (each finite and ``> 0``, else
        ``ConfigError``; e.g. from :func:`draftsmith.drafters.calibration.fit_sts`), or remove it
        with ``None``. :meth:`save` writes it to ``config.json``."""
        if tau is not None:
            if self.confidence_proj is None:
                raise PlanError(f"{self.family} drafter has no confidence head to calibrate")
            table = check_temperatures(torch.as_tensor(tau).detach().cpu(),
                                       self.spec.block_size)
            tau = tuple(float(t) for t in table.tolist())
        self.spec = replace(self.spec, sts_temperatures=tau)
        self.__dict__.pop("_sts_cache", None)

    def _sts_on(self, device: torch.device) -> torch.Tensor | None:
        """The STS table on ``device`` (cached, so a captured step copies nothing)."""
        if self.spec.sts_temperatures is None:
            return None
        cache: dict[torch.device, torch.Tensor] = self.__dict__.setdefault("_sts_cache", {})
        table = cache.get(device)
        if table is None:
            table = torch.tensor(self.spec.sts_temperatures, dtype=torch.float32, device=device)
            cache[device] = table
        return table

    def _w1_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """``w1[ids]`` with zero rows for ids outside the vocabulary (spec 2.3)."""
        assert self.markov_w1 is not None
        inside = (ids >= 0) & (ids < self.spec.vocab_size)
        rows = F.embedding(ids.clamp(0, self.spec.vocab_size - 1), self.markov_w1.weight)
        return rows * inside[..., None].to(rows.dtype)

    def save(self, directory: Path) -> None:
        """Write ``config.json`` + ``model.safetensors`` that :func:`load_gqa_drafter` reads."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = spec_to_config(self.spec, self.family)
        config["torch_dtype"] = str(self.dtype).removeprefix("torch.")
        write_text_atomic(directory / CONFIG_FILE, json.dumps(config, indent=2, sort_keys=True)
                          + "\n")
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        save_tensors(tensors, directory / WEIGHTS_FILE, metadata={"format": "pt"})

    def with_visibility(self, visibility: tuple[LayerVisibility, ...]) -> GQADrafter:
        """A copy with the same weights and other per-layer visibility (for negative controls)."""
        other = GQADrafter(replace(self.spec, visibility=visibility), self.family,
                           self.tp_rank, self.tp_size)
        other.load_state_dict(self.state_dict())
        return _finish(other, self.fc.weight.device, self.dtype)


# --------------------------------------------------------------------------------------------
# Options for random initialisation
# --------------------------------------------------------------------------------------------

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

    def draft_fields(self) -> dict[str, Any]:
        """Family-specific keys for the drafter config section (overridden by families)."""
        return {}

    def to_config(self, target: TargetInfo, family: str) -> dict[str, Any]:
        """A checkpoint config describing these options for ``target``."""
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads}"
            )
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


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------

_IGNORED = ("lm_head.weight",)
"""Tensors a checkpoint may carry that a GQA drafter never uses: DeepSpec's frozen copy of the
target head (the target's own head is always used)."""

_ALIASES: dict[str, tuple[str, ...]] = {
    "markov_w1.weight": ("markov_head.markov_w1.weight", "markov_w1.weight"),
    "markov_w2.weight": ("markov_head.markov_w2.weight", "markov_w2.weight"),
    "markov_gate_proj.weight": ("markov_head.gate_proj.weight", "markov_gate_proj.weight"),
    "markov_gate_proj.bias": ("markov_head.gate_proj.bias", "markov_gate_proj.bias"),
    "markov_joint_proj.weight": ("markov_head.joint_proj.weight", "markov_joint_proj.weight"),
    "markov_joint_proj.bias": ("markov_head.joint_proj.bias", "markov_joint_proj.bias"),
    "confidence_proj.weight": ("confidence_head.proj.weight", "confidence_proj.weight"),
    "confidence_proj.bias": ("confidence_head.proj.bias", "confidence_proj.bias"),
}
"""Checkpoint spellings of each canonical parameter: DeepSpec native first, then the export."""


def deepspec_tensor_name(name: str) -> str:
    """The DeepSpec (and ``speculators``) spelling of a :class:`GQADrafter` parameter name:
    ``markov_w1.weight`` -> ``markov_head.markov_w1.weight``, ``confidence_proj.bias`` ->
    ``confidence_head.proj.bias``; backbone names are the same in every layout."""
    return _ALIASES.get(name, (name,))[0]


def _expected_shapes(spec: GQADrafterSpec, model: GQADrafter) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in model.state_dict().items()}


def _check_against_target(spec: GQADrafterSpec, target: TargetInfo | None, origin: str) -> None:
    if target is None:
        return
    if spec.vocab_size != target.vocab_size:
        raise CheckpointError(
            f"{origin}: config vocab_size {spec.vocab_size} does not match the target's "
            f"vocabulary {target.vocab_size}; drafter and target must share one vocabulary"
        )
    if spec.hidden_size != target.hidden_size:
        raise CheckpointError(
            f"{origin}: drafter hidden_size {spec.hidden_size} differs from the target's "
            f"{target.hidden_size}; blocks are embedded with the target's table, so they must match"
        )
    if spec.num_target_layers is not None and spec.num_target_layers != target.num_layers:
        raise CheckpointError(
            f"{origin}: checkpoint was trained on a target of {spec.num_target_layers} layers, "
            f"the target has {target.num_layers}"
        )
    validate_target_layer_ids(spec.target_layer_ids, target.num_layers)


def _check_markov_tensors(source: TensorSource, spec: GQADrafterSpec) -> None:
    """Spec 2.2: ``markov_w1`` with rank 0 is an error; shapes must be ``(V, markov_rank)``."""
    for canonical in ("markov_w1.weight", "markov_w2.weight"):
        names = _ALIASES[canonical]
        found = source.find(names)
        if found is None:
            continue
        shape = source.shape_of(*names)
        assert shape is not None
        if spec.markov_rank == 0:
            raise CheckpointError(
                f"{source.origin}: tensor {found!r} has shape {shape_str(shape)} but the config's "
                f"markov_rank is 0 (expected shape {shape_str((spec.vocab_size, 0))}, i.e. no "
                "Markov head); set markov_rank or drop the tensor"
            )


def _checkpoint_view(spec: GQADrafterSpec) -> dict[str, Any]:
    """Option name -> the value the checkpoint's architecture stands for (``init_std`` and
    other random-init-only options have none)."""
    view: dict[str, Any] = {name: getattr(spec, name) for name in (
        "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "block_size",
        "mask_token_id", "target_layer_ids", "rope_theta", "rms_norm_eps", "attention_bias",
        "max_position_embeddings", "input_embedding_scale", "output_multiplier",
        "final_logit_softcapping", "markov_rank", "confidence_head", "confidence_head_with_markov",
    )}
    view["layer_types"] = tuple("full_attention" if v.window is None else "sliding_attention"
                                for v in spec.visibility)
    windows = {v.window for v in spec.visibility if v.window is not None}
    view["sliding_window"] = windows.pop() if len(windows) == 1 else None
    causal = {v.causal for v in spec.visibility}
    view["is_causal"] = causal.pop() if len(causal) == 1 else None
    view["shift_label"] = spec.block_convention is BlockConvention.SHIFT
    if spec.markov_head is not MarkovHeadKind.NONE:
        view["markov_head_type"] = spec.markov_head.value
    return view


def load_gqa_drafter(request: LoadRequest, family: str) -> GQADrafter:
    """Build a drafter of ``family`` from ``request.checkpoint`` or, when it is ``None``, from
    ``request.options`` with random weights drawn from ``request.seed``."""
    target = request.target
    collectives = request.collectives
    tp_rank, tp_size = int(collectives.rank), int(collectives.world_size)
    if request.checkpoint is None:
        options = request.options
        if not isinstance(options, GQAArchitectureOptions):
            raise ConfigError(
                f"{family} random init needs {family} options, got {type(options).__name__}"
            )
        if target is None:
            raise ConfigError(f"{family} random init needs LoadRequest.target (H, V, L_t)")
        spec = spec_from_config(options.to_config(target, family), family, target=target,
                                origin=f"{family} options")
        model = GQADrafter(spec, family, tp_rank, tp_size)
        _random_init(model, options.init_std, request.seed)
        return _finish(model, request.device, request.dtype or target.dtype)

    directory = Path(request.checkpoint)
    origin = str(directory)
    config = read_config(directory)
    tensors = load_tensors(directory)
    source = TensorSource(tensors, origin)
    own_embedding = source.has("embed_tokens.weight")
    spec = spec_from_config(config, family, own_embedding=own_embedding, target=target,
                            origin=str(directory / CONFIG_FILE))
    check_options_agree(request.options, _checkpoint_view(spec), origin)
    _check_markov_tensors(source, spec)
    declared = spec
    if target is not None:
        # Shapes are checked against the target first, so a vocabulary or width mismatch names
        # the first tensor that disagrees.
        spec = replace(spec, vocab_size=target.vocab_size, hidden_size=target.hidden_size)
    model = GQADrafter(spec, family, tp_rank, tp_size)
    state = {}
    for name, shape in _expected_shapes(spec, model).items():
        state[name] = source.take(_ALIASES.get(name, (name,)), shape)
    if source.has(*_IGNORED):
        logger.info("%s: ignoring %s (the target's output head is used)", origin, _IGNORED)
    source.ignore(*_IGNORED)
    _check_leftovers(source, spec, family)
    _check_against_target(declared, target, origin)
    dtype = request.dtype or _checkpoint_dtype(config, state["fc.weight"], origin)
    model.load_state_dict(state)
    return _finish(model, request.device, dtype)


def _check_leftovers(source: TensorSource, spec: GQADrafterSpec, family: str) -> None:
    """Tensors the config leaves unused mean the config describes a different network (fewer
    layers, a head switched off): loading would drop trained weights silently, so it fails."""
    leftover = source.unused()
    if not leftover:
        return
    hints = []
    layers = sorted({int(m.group(1)) for name in leftover
                     if (m := re.match(r"layers\.(\d+)\.", name))})
    if layers and layers[-1] >= spec.num_layers:
        hints.append(f"the checkpoint has tensors of layers up to {layers[-1]} but "
                     f"num_hidden_layers is {spec.num_layers}: set num_hidden_layers (and "
                     f"layer_types) to {layers[-1] + 1}")
    if any(name.startswith(("confidence_head.", "confidence_proj.")) for name in leftover):
        hints.append("confidence head tensors are present but use_confidence_head is false: set "
                     "use_confidence_head (or enable_confidence_head) to true")
    if any(name.startswith(("markov_head.", "markov_")) for name in leftover):
        hints.append("Markov head tensors are left over: check markov_rank and markov_head_type")
    if not hints:
        hints.append("remove them, or fix config.json so that it describes them")
    raise CheckpointError(
        f"{source.origin}: {len(leftover)} tensors are not used by the {family} drafter that "
        f"config.json describes, e.g. {leftover[:4]}; loading would drop trained weights. "
        + "; ".join(hints)
    )


def _checkpoint_dtype(config: Mapping[str, Any], fc_weight: torch.Tensor,
                      origin: str) -> torch.dtype:
    """The dtype to build a checkpoint's drafter in when the request names none: the config's
    ``torch_dtype``, else the dtype ``fc.weight`` is stored in (which must be a weight dtype)."""
    declared = config_dtype(config, f"{origin}/{CONFIG_FILE}")
    if declared is not None:
        return declared
    if fc_weight.dtype not in WEIGHT_DTYPES.values():
        stored = str(fc_weight.dtype).removeprefix("torch.")
        raise CheckpointError(
            f"{origin}: weights are stored as {stored} and config.json has no torch_dtype; set "
            f"torch_dtype to one of {list(WEIGHT_DTYPES)} (or pass LoadRequest.dtype)"
        )
    return fc_weight.dtype


def _finish(model: GQADrafter, device: torch.device, dtype: torch.dtype) -> GQADrafter:
    """Move to ``device``/``dtype``; the confidence head stays fp32 (spec 2.5 computes in fp32,
    and an fp32 checkpoint weight must not be rounded)."""
    model = model.to(device=device, dtype=dtype).eval()
    if model.confidence_proj is not None:
        model.confidence_proj.float()
    return model


def _random_init(model: GQADrafter, std: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32) * std
            if "norm" in name.rsplit(".", 2)[-2] and param.dim() == 1:
                noise = noise + 1.0
            param.copy_(noise)


__all__ = [
    "DEEPSPEC_SUFFIX",
    "DFLASH_ARCH",
    "SPECULATORS_KINDS",
    "Flavour",
    "GQAArchitectureOptions",
    "GQADrafter",
    "GQADrafterSpec",
    "LayerVisibility",
    "architecture_config",
    "deepspec_tensor_name",
    "from_speculators_config",
    "has_dspark_heads",
    "is_speculators_config",
    "load_gqa_drafter",
    "resolve_block_convention",
    "resolve_flavour",
    "resolve_visibility",
    "spec_from_config",
    "spec_to_config",
]
