"""Getting a transformers causal LM the Hugging Face target can serve: the lazy import of
``transformers`` (the optional extra ``hf``), the check that a model's config is one the adapter
computes correctly, and loading a local model directory, optionally with its decoder layers split
over tensor-parallel ranks by transformers' own plan.

Must not import drafters or selection.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from draftsmith.contract import ConfigError

_UNSUPPORTED_CONFIG_KEYS = ("final_logit_softcapping", "attn_logit_softcapping", "logits_scaling",
                            "logit_scale")
"""Config keys that change the logits away from ``lm_head(h)``; a target setting any is refused."""
_SCALE_KEYS = ("logits_scaling", "logit_scale")
"""Of those, the multipliers (neutral at 1)."""


MIN_TRANSFORMERS = (5, 17)
"""The oldest transformers release the Hugging Face target is checked against."""


def require_transformers() -> Any:
    """Import ``transformers`` or raise a :class:`ConfigError` that says how to install it (or
    to upgrade it, below :data:`MIN_TRANSFORMERS`)."""
    try:
        import transformers
    except ImportError:  # pragma: no cover - the test environment has the extra
        raise ConfigError(
            "the Hugging Face target needs transformers: pip install 'draftsmith[hf]'"
        ) from None
    found = tuple(int(part) for part in re.findall(r"\d+", transformers.__version__)[:2])
    if found < MIN_TRANSFORMERS:
        least = ".".join(map(str, MIN_TRANSFORMERS))
        raise ConfigError(
            f"the Hugging Face target needs transformers {least} or later, found "
            f"{transformers.__version__}: pip install -U 'transformers>={least}'"
        )
    return transformers


def quiet_transformers() -> Any:
    """:func:`require_transformers`, with its progress bars off (they would mix with ours)."""
    transformers = require_transformers()
    transformers.utils.logging.disable_progress_bar()
    return transformers


def check_supported(config: Any) -> None:
    """Refuse configs whose logits or attention the adapter would get wrong."""
    name = type(config).__name__
    for key in _UNSUPPORTED_CONFIG_KEYS:
        value = getattr(config, key, None)
        neutral = (None, 1, 1.0) if key in _SCALE_KEYS else (None, 0, 0.0)
        if value not in neutral:
            raise ConfigError(
                f"{name} sets {key}={value!r}; the Hugging Face target adapter supports only "
                "plain lm_head logits (Llama, Qwen2, Qwen3, Mistral)"
            )
    layer_types = getattr(config, "layer_types", None) or ()
    sliding = any(t != "full_attention" for t in layer_types)
    # Mistral-style configs set only sliding_window (no layer_types, no use_sliding_window flag)
    window = getattr(config, "sliding_window", None)
    limit = getattr(config, "max_position_embeddings", None)
    windowed = (window is not None and getattr(config, "use_sliding_window", True) is not False
                and (limit is None or window < limit))
    if sliding or windowed or getattr(config, "use_sliding_window", False):
        raise ConfigError(
            f"{name} uses sliding-window or non-full attention layers; the Hugging Face target "
            "adapter supports full-attention decoders only"
        )
    if getattr(config, "is_encoder_decoder", False):
        raise ConfigError(f"{name} is an encoder-decoder model; a causal LM is needed")


def load_hf_model(directory: str, dtype: torch.dtype, device: torch.device | str,
                  split_layers_over: int) -> tuple[torch.nn.Module, Any]:
    """``(model, tokenizer)`` of a local Hugging Face model directory, the model on ``device``
    (safetensors only, never a pickle); ``split_layers_over = N > 1`` as in
    :func:`draftsmith.runtime.targets.hf.load_hf_target`.

    Raises :class:`ConfigError` when the directory or its ``config.json`` is missing, when it
    holds no causal LM, or when its heads do not split over ``N`` ranks.
    """
    path = Path(directory)
    if not path.is_dir():
        raise ConfigError(
            f"target model directory {str(path)!r} does not exist; pass 'smollm2-135m' or a "
            "local Hugging Face model directory (config.json + *.safetensors + tokenizer)"
        )
    if not (path / "config.json").is_file():
        raise ConfigError(f"{path} has no config.json; it is not a Hugging Face model directory")
    transformers = quiet_transformers()
    extra: dict[str, Any] = {}
    if split_layers_over > 1:
        extra["distributed_config"] = _layer_split_config(transformers, path, split_layers_over)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(  # never a pickle
            str(path), dtype=dtype, low_cpu_mem_usage=True, use_safetensors=True, **extra
        )
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"cannot load a causal LM from {path}: {exc}") from None
    model.to(device)
    return model, load_tokenizer(path)


def load_tokenizer(directory: str | Path) -> Any:
    """The tokenizer of a local Hugging Face model directory (alone: no weight is read, so
    prompts can be measured before the model loads); :class:`ConfigError` when it has none."""
    transformers = quiet_transformers()
    try:
        return transformers.AutoTokenizer.from_pretrained(str(directory))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load the tokenizer of {directory}: {exc}") from None


def _layer_split_config(transformers: Any, path: Path, tp: int) -> Any:
    """transformers' ``DistributedConfig`` that splits the decoder layers over ``tp`` ranks and
    keeps the LM head whole; :class:`ConfigError` when the model's widths do not divide."""
    config = transformers.AutoConfig.from_pretrained(str(path))
    config = getattr(config, "text_config", config)
    if not getattr(config, "base_model_tp_plan", None):
        raise ConfigError(f"{type(config).__name__} has no tensor-parallel plan in transformers; "
                          "set target.split_layers = false")
    widths = {"num_attention_heads": config.num_attention_heads,
              "num_key_value_heads": getattr(config, "num_key_value_heads", None)
              or config.num_attention_heads,
              "intermediate_size": getattr(config, "intermediate_size", 0)}
    uneven = [f"{name} = {value}" for name, value in widths.items() if int(value) % tp]
    if uneven:
        raise ConfigError(
            f"target.split_layers: {', '.join(uneven)} of {path.name} do not split over "
            f"{tp} ranks; use a TP size that divides them, or target.split_layers = false "
            "(only the LM head is split then)"
        )
    from transformers.distributed.configuration_utils import DistributedConfig

    # the model's own plan, passed whole: transformers 5.17 replaces the model's plan with a
    # given one, later releases merge it in. The head is split along the vocabulary by
    # HFTarget.shard_vocab (transformers' own rule gathers the logits); the embedding stays
    # whole, as the drafter reads it by global id
    plan, embed = _plan_and_embedding(transformers, path)
    whole = _whole_style(transformers)
    plan["lm_head"] = whole
    if embed is not None:
        plan[embed] = whole
    return DistributedConfig(tp_size=tp, tp_plan=plan)


def _whole_style(transformers: Any) -> str:
    """The tensor-parallel style that keeps a module whole on every rank, with no collective in
    its forward: ``replicate`` where transformers registers it, else
    ``replicated_with_grad_allreduce`` (5.17 and 5.18 have only that one; it differs by summing
    the gradients, which decoding never computes)."""
    from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES

    for style in ("replicate", "replicated_with_grad_allreduce"):
        if style in ALL_PARALLEL_STYLES:
            return style
    raise ConfigError(
        f"transformers {transformers.__version__} has no tensor-parallel style that keeps the LM "
        "head whole; set target.split_layers = false, or use transformers 5.17 or later"
    )


def _plan_and_embedding(transformers: Any, path: Path) -> tuple[dict[str, str], str | None]:
    """The model's tensor-parallel plan (module patterns to style names) and the module name of
    its input embedding (``model.embed_tokens``), read from a weightless copy of the
    architecture."""
    config = transformers.AutoConfig.from_pretrained(str(path))
    with torch.device("meta"):
        skeleton = transformers.AutoModelForCausalLM.from_config(config)
    embed = skeleton.get_input_embeddings()
    name = next((name for name, module in skeleton.named_modules() if module is embed), None)
    return dict(getattr(skeleton, "tp_plan", None) or {}), name


__all__ = ["check_supported", "load_hf_model", "load_tokenizer", "quiet_transformers",
           "require_transformers"]
