"""Reading and checking a ``dspark-mla`` checkpoint (:func:`read_mla_checkpoint`, format:
``docs/checkpoint-mla.md``) and drawing random full weights (:func:`random_mla_tensors`).
May import ``contract`` and ``drafters`` only.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch

from draftsmith.contract import (
    CheckpointError,
    TargetInfo,
)
from draftsmith.drafters.checkpoint import (
    CONFIG_FILE,
    TensorSource,
    config_dtype,
    load_tensors,
    read_config,
    tensor_headers,
)
from draftsmith.drafters.mla.config import MLAConfig, mla_config_from_json, mla_tensor_shapes

logger = logging.getLogger(__name__)

_ALIASES: dict[str, tuple[str, ...]] = {
    "fc.weight": ("context_proj.weight",),
    "hidden_norm.weight": ("context_norm.weight",),
    "norm.weight": ("final_norm.weight",),
    "markov_head.markov_w1.weight": ("markov_w1.weight",),
    "markov_head.markov_w2.weight": ("markov_w2.weight",),
    "confidence_head.proj.weight": ("confidence_proj.weight",),
    "confidence_head.proj.bias": ("confidence_proj.bias",),
}
"""Other spellings accepted on load (TorchSpec exports, DFlash-style head names)."""

_IGNORED = ("lm_head.weight",)
"""Tensors a checkpoint may carry that this drafter never uses (it shares the target's head)."""


def random_mla_tensors(cfg: MLAConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """A full fp32 CPU state of random weights, identical for a given ``(cfg, seed)`` whatever
    the TP size (every rank then takes its shard of the same model).

    Linear weights are ``N(0, 1/fan_in)``, norm weights ``1 + N(0, 0.1^2)`` (so a misplaced norm
    shows), the embedding ``N(0, 1)``, Markov tables ``N(0, 0.1^2)``.
    """
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in mla_tensor_shapes(cfg).items():
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        if name.endswith("norm.weight"):
            out[name] = 1.0 + 0.1 * noise
        elif name == "embed_tokens.weight":
            out[name] = noise
        elif name.startswith("markov_head.") or name.endswith(".bias"):
            out[name] = 0.1 * noise
        else:
            out[name] = noise / math.sqrt(shape[-1])
    return out


def read_mla_checkpoint(
    directory: Path, target: TargetInfo | None = None, *, headers_only: bool = False,
) -> tuple[MLAConfig, dict[str, torch.Tensor], torch.dtype]:
    """Read and check a checkpoint: ``(config, full tensors under canonical names, dtype)``.

    Accepts the aliases of ``_ALIASES`` (TorchSpec's ``context_proj``/``context_norm``/
    ``final_norm``, bare ``markov_w1``/``confidence_proj`` names) and a ``model.`` prefix.
    Raises :class:`CheckpointError` naming the tensor and both shapes on a missing tensor or a
    wrong shape; also when Markov or confidence tensors are present but the config disables
    those heads, or when tensors are left unused. ``target`` fills in what the config leaves out
    (``num_target_layers``, ``target_hidden_size``); whether the checkpoint fits it is bind's
    check (``check_fit``). ``headers_only``: the same checks on the files' tensor headers, no
    weight read (the tensors returned are on the ``meta`` device).
    """
    directory = Path(directory)
    raw = read_config(directory)
    origin = str(directory / CONFIG_FILE)
    cfg = mla_config_from_json(raw, target, origin)
    dtype = config_dtype(raw, origin) or torch.float32
    stored = tensor_headers(directory) if headers_only else load_tensors(directory)
    tensors = {k.removeprefix("model."): t for k, t in stored.items()}
    source = TensorSource(tensors, str(directory))
    if source.has(*_IGNORED):
        logger.info("%s: ignoring %s (the target's output head is used)", directory, _IGNORED)
    source.ignore(*_IGNORED)
    if not cfg.markov_rank and source.has("markov_head.markov_w1.weight", "markov_w1.weight"):
        shape = source.shape_of("markov_head.markov_w1.weight", "markov_w1.weight")
        raise CheckpointError(
            f"{directory}: tensor 'markov_head.markov_w1.weight' is present with shape {shape} "
            "but markov_rank resolves to 0; set markov_rank in dspark_config (loading would drop "
            "the Markov head silently)"
        )
    if not cfg.confidence_head and source.has("confidence_head.proj.weight",
                                              "confidence_proj.weight"):
        raise CheckpointError(
            f"{directory}: confidence head tensors are present but use_confidence_head is "
            "false; set use_confidence_head (or enable_confidence_head) in dspark_config"
        )
    full: dict[str, torch.Tensor] = {}
    for name, shape in mla_tensor_shapes(cfg).items():
        why = ""
        if name in ("embed_tokens.weight", "markov_head.markov_w1.weight",
                    "markov_head.markov_w2.weight"):
            why = f"vocabulary {cfg.vocab_size}"
        elif name == "fc.weight":
            why = f"{len(cfg.target_layer_ids)} captured layers of width {cfg.target_hidden_size}"
        full[name] = source.take((name, *_ALIASES.get(name, ())), shape, why)
    unused = source.unused()
    if unused:
        raise CheckpointError(
            f"{directory}: tensors not used by a dspark-mla drafter: {unused[:8]}"
            f"{' ...' if len(unused) > 8 else ''}; remove them or fix the config"
        )
    return cfg, full, dtype
