"""The architecture of a GQA drafter resolved from a checkpoint config. It owns
:class:`GQADrafterSpec`, per-layer attention visibility (:class:`LayerVisibility`), the reading
of z-lab, DeepSpec and ``speculators`` configs (the latter rewritten by :mod:`.speculators`
first) into a spec, and the config a spec writes back. May import ``contract`` and ``drafters``
only; never ``runtime`` or ``selection``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch

from draftsmith.contract import (
    BlockConvention,
    CheckpointError,
    MarkovHeadKind,
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
    require,
    truthy,
    validate_target_layer_ids,
)
from draftsmith.drafters.gqa.speculators import (
    DFLASH_ARCH,
    from_speculators_config,
    is_speculators_config,
    swa_fields,
)
from draftsmith.kernels.block_attention import visible

logger = logging.getLogger(__name__)

DFLASH2_ARCH = "DFlash2DraftModel"
"""The z-lab "DFlash 2" variant (dynamic convolutions and a candidate selector), which draftsmith
does not implement."""
DEEPSPEC_SUFFIX = "DSparkModel"
"""DeepSpec native architectures end with this (``Qwen3DSparkModel``)."""



class Flavour(StrEnum):
    """Which reference a checkpoint follows. The references disagree on sliding layers, so the
    flavour fixes their rule: causal for z-lab, a symmetric non-causal window for DSpark."""

    ZLAB = "z-lab"
    """z-lab DFlash: sliding layers causal unless ``is_causal`` says otherwise."""
    DSPARK = "dspark"
    """DeepSpec / DSpark exports: sliding layers non-causal with a symmetric window."""


@dataclass(frozen=True)
class LayerVisibility:
    """Which keys a block query sees in one layer.

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
        """``query_pos: [G, W]``, ``key_pos: [G, N]`` int64 -> visible ``[G, W, N] bool`` (the rule
        the fused block attention applies)."""
        return visible(query_pos, key_pos, self.causal, self.window)


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
    """Sequential Temperature Scaling table: one ``tau > 0`` per block position, dividing that
    position's confidence logit before the sigmoid."""

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
    """Per-layer visibility, by the flavour's rule for sliding layers.

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
                "block. Set causal to false or remove it"
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
    """Which reference a checkpoint follows (z-lab or DSpark), from the checkpoint alone.

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
    """The block convention of a checkpoint. z-lab DFlash uses ``W = K + 1`` with a silent bonus
    slot; DeepSpec and DSpark exports use the shift convention (``W = K``, slot ``j`` predicts
    draft ``j``). ``Qwen3DSparkModel`` and DSpark exports shift; ``DFlashDraftModel`` shifts only
    when ``shift_label`` (or ``projector_type == "dspark"``) says so. The decision is logged."""
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
    """Read ``config`` one group of fields at a time. The groups run in this order, so a config
    with several faults reports the first group's."""
    arch = _architecture(config)
    flavour = resolve_flavour(config, family, arch)
    backbone = _backbone_fields(config)
    num_layers = backbone["num_layers"]
    target_layers = _target_layer_fields(config, num_layers, backbone["hidden_size"], target)
    vocabulary = _vocabulary_fields(config)
    heads = _dspark_head_fields(config, family)
    block = _block_fields(config, heads["confidence_head"])
    rms_norm_eps = config_float(config.get("rms_norm_eps", 1e-6), "rms_norm_eps")
    if rms_norm_eps <= 0:
        raise CheckpointError(f"config rms_norm_eps is {rms_norm_eps}; it must be > 0")
    return GQADrafterSpec(
        **backbone,
        **target_layers,
        **vocabulary,
        **heads,
        **block,
        visibility=resolve_visibility(config, num_layers, flavour,
                                      native=arch.endswith(DEEPSPEC_SUFFIX)),
        block_convention=resolve_block_convention(config, family, arch, flavour),
        flavour=flavour,
        rms_norm_eps=rms_norm_eps,
        **_position_and_scale_fields(config),
        own_embedding=own_embedding,
    )


def _backbone_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """The transformer's sizes (``hidden_act`` must be silu), as :class:`GQADrafterSpec` keyword
    arguments: ``hidden_size``, ``num_layers``, ``num_heads``, ``num_kv_heads``, ``head_dim``
    (even, for rotate-half RoPE) and ``intermediate_size``."""
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
    return dict(
        hidden_size=hidden,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv,
        head_dim=head_dim,
        intermediate_size=intermediate,
    )


def _target_layer_fields(
    config: Mapping[str, Any], num_layers: int, hidden: int, target: TargetInfo | None
) -> dict[str, Any]:
    """Which target layers the drafter reads, as :class:`GQADrafterSpec` keyword arguments:
    ``num_target_layers`` (the config's, which must match ``target``, else the target's),
    ``target_layer_ids`` (the config's, else spread over the target's depth) and
    ``target_hidden_size`` (the target's, else ``hidden``)."""
    num_target_layers = config.get("num_target_layers")
    if num_target_layers is not None:
        num_target_layers = config_int(num_target_layers, "num_target_layers", minimum=1)
        # the one fact about the target that only a checkpoint records: bind's fit check sees
        # the captured layer ids, not the depth of the target they were trained on
        if target is not None and num_target_layers != target.num_layers:
            raise CheckpointError(
                f"checkpoint was trained on a target of {num_target_layers} layers, the target "
                f"has {target.num_layers}; use a drafter trained for this target"
            )
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
    return dict(
        target_hidden_size=int(target.hidden_size) if target is not None else hidden,
        target_layer_ids=tuple(ids),
        num_target_layers=num_target_layers,
    )


def _vocabulary_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """The vocabulary and the logits over it, as :class:`GQADrafterSpec` keyword arguments:
    ``vocab_size``, ``mask_token_id`` (inside the vocabulary) and ``final_logit_softcapping``
    (``None`` when absent or not positive)."""
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
    return dict(
        vocab_size=vocab,
        mask_token_id=mask_token_id,
        final_logit_softcapping=softcap if softcap is not None and softcap > 0 else None,
    )


def _dspark_head_fields(config: Mapping[str, Any], family: str) -> dict[str, Any]:
    """The DSpark heads, as :class:`GQADrafterSpec` keyword arguments: ``markov_rank``,
    ``markov_head`` (its kind; ``NONE`` at rank 0), ``confidence_head`` and
    ``confidence_head_with_markov``. A ``dflash`` family has neither head."""
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
    return dict(
        markov_head=markov,
        markov_rank=markov_rank,
        confidence_head=confidence,
        confidence_head_with_markov=with_markov,
    )


def _block_fields(config: Mapping[str, Any], confidence: bool) -> dict[str, Any]:
    """The trained block, as :class:`GQADrafterSpec` keyword arguments: ``block_size`` and the
    optional ``sts_temperatures`` table (one per block position; needs a confidence head)."""
    block_size = config_int(draft_value(config, "block_size", 16), "block_size", minimum=1)
    return dict(
        block_size=block_size,
        sts_temperatures=_sts_from_config(
            draft_value(config, "sts_temperatures"), block_size, confidence
        ),
    )


def _position_and_scale_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """RoPE, attention bias and the embedding and output multipliers, as
    :class:`GQADrafterSpec` keyword arguments."""
    return dict(
        rope_theta=_rope_theta(config),
        attention_bias=truthy(config.get("attention_bias", False), "attention_bias"),
        max_position_embeddings=config_int(config.get("max_position_embeddings", 32768),
                                           "max_position_embeddings", minimum=1),
        input_embedding_scale=config_float(draft_value(config, "input_embedding_scale", 1.0),
                                           "input_embedding_scale"),
        output_multiplier=config_float(draft_value(config, "output_multiplier", 1.0),
                                       "output_multiplier"),
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
                                 "dspark_config": swa_fields(window)}
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
        draft.update(swa_fields(config.get("sliding_window")))
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
