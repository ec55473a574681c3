"""``speculators`` block-drafter configs (DFlash, DSpark) rewritten as the DFlash-style config
:mod:`.config` reads, and the names both layouts share. May import ``contract`` and
``drafters`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from draftsmith.contract import CheckpointError
from draftsmith.drafters.checkpoint import config_layer_ids, config_mapping, truthy

DFLASH_ARCH = "DFlashDraftModel"
"""``architectures[0]`` of z-lab DFlash checkpoints and of DFlash-style DSpark exports."""


def swa_fields(window: int | None) -> dict[str, Any]:
    """The DFlash-style export's window keys."""
    return {"use_swa": window is not None, "swa_window_size": window or 0}


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
            **swa_fields(layer.get("sliding_window") if sliding else None),
        )
        out["dspark_config"] = section
    else:
        if sliding and non_causal:
            out["is_causal"] = False
        out["dflash_config"] = section
    return out


__all__ = ["DFLASH_ARCH", "SPECULATORS_KINDS", "from_speculators_config", "is_speculators_config",
           "swa_fields"]
