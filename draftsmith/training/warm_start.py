"""Starting a training run from an existing checkpoint (``--init-from``): the same drafter, or
one grown by more decoder layers or a larger Markov rank that computes exactly what the
checkpoint computed."""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.contract import (
    ConfigError,
    DrafterFamily,
    DraftsmithError,
    LoadRequest,
    TargetInfo,
)
from draftsmith.drafters.checkpoint import check_checkpoint_dir
from draftsmith.drafters.gqa import GQADrafter
from draftsmith.runtime.registry import load_registry

_RANK_GROWN = frozenset({"markov_w1.weight", "markov_w2.weight", "confidence_proj.weight"})
"""Tensors whose last dimension follows ``markov_rank`` (the confidence head's when its feature
carries ``w1[prev]``)."""


def _leading_slice(ours: torch.Tensor, theirs: torch.Tensor, extra: int) -> bool:
    """``theirs`` fits as the leading columns of ``ours``, which is ``extra`` columns wider."""
    return (extra > 0 and ours.dim() == theirs.dim() == 2 and ours.shape[0] == theirs.shape[0]
            and ours.shape[1] == theirs.shape[1] + extra)


def _request(family: DrafterFamily, checkpoint: Path, target: TargetInfo) -> LoadRequest:
    """How a warm start asks ``family`` for ``checkpoint``'s drafter (fp32, on the CPU)."""
    return LoadRequest(options=family.options_model(), checkpoint=Path(checkpoint),
                       target=target, device=torch.device("cpu"), dtype=torch.float32)


def check_init_from(checkpoint: Path, family: str, target: TargetInfo) -> None:
    """What :func:`warm_start` would find wrong with ``checkpoint`` without reading a weight: it
    is a checkpoint directory, and ``family`` declares a drafter for ``target`` from its config
    and tensor headers. Run before the target loads.

    :raises ConfigError: naming ``--init-from`` and what is wrong.
    """
    origin = f"--init-from {checkpoint}"
    if not Path(checkpoint).is_dir():
        raise ConfigError(f"{origin} is not a directory; give a {family} checkpoint directory "
                          "(config.json and *.safetensors), e.g. a run's best/")
    registered = load_registry().family(family)
    assert registered.capabilities is not None
    request = _request(registered, checkpoint, target)
    try:
        check_checkpoint_dir(checkpoint)
        registered.capabilities(request)
        if registered.check_checkpoint is not None:
            registered.check_checkpoint(request)
    except DraftsmithError as exc:
        raise ConfigError(f"{origin}: not a {family} checkpoint for this target: {exc}") from None


def warm_start(drafter: GQADrafter, checkpoint: Path, family: str, target: TargetInfo) -> None:
    """Copy the weights of ``checkpoint`` (a ``family`` checkpoint, any float dtype) into the fp32
    ``drafter``. Every tensor must exist on both sides with one shape, and the checkpoint must
    read the same target layers; otherwise a :class:`ConfigError` names what differs.

    One difference is allowed: ``drafter`` may have more decoder layers than the checkpoint (the
    run grows the drafter). The checkpoint's layers fill the first ones; each further layer keeps
    its fresh initialisation except its two residual-branch outputs (``o_proj`` and
    ``down_proj``), which start at zero, so the grown drafter computes exactly what the
    checkpoint computed and the new layers learn from there.

    A second growth is allowed for the vanilla Markov head: a larger ``markov_rank``. The
    checkpoint's rank fills the leading columns of ``markov_w1`` and ``markov_w2`` (and the
    confidence head's Markov inputs); the new ``w1`` columns keep their fresh initialisation and
    the new ``w2`` columns (and confidence inputs) start at zero, so again the grown drafter
    computes exactly what the checkpoint did."""
    registered = load_registry().family(family)
    assert registered.load is not None
    origin = f"--init-from {checkpoint}"
    try:
        source = registered.load(_request(registered, checkpoint, target))
    except DraftsmithError as exc:
        raise ConfigError(f"{origin}: not a {family} checkpoint for this target: {exc}") from None
    if not isinstance(source, GQADrafter):
        raise ConfigError(f"{origin}: {family} loaded a {type(source).__name__}, not a GQA drafter")
    if source.spec.vocab_size != drafter.spec.vocab_size:
        raise ConfigError(f"{origin}: the checkpoint predicts a vocabulary of "
                          f"{source.spec.vocab_size} tokens, the target has "
                          f"{drafter.spec.vocab_size}; start from a checkpoint trained for it")
    for name in ("target_layer_ids", "block_convention", "flavour", "markov_head",
                 "confidence_head", "mask_token_id"):
        have, want = getattr(source.spec, name), getattr(drafter.spec, name)
        if have != want:
            raise ConfigError(f"{origin}: the checkpoint's {name} is {have}, this run's is "
                              f"{want}; match the checkpoint's config with --set")
    if source.spec.num_layers > drafter.spec.num_layers:
        raise ConfigError(f"{origin}: the checkpoint has {source.spec.num_layers} layers, this run "
                          f"{drafter.spec.num_layers}; a run may grow a drafter, never shrink it "
                          f"(--set num_layers={source.spec.num_layers} or more)")
    r_have, r_want = source.spec.markov_rank, drafter.spec.markov_rank
    if r_have > r_want:
        raise ConfigError(f"{origin}: the checkpoint's markov_rank is {r_have}, this run's "
                          f"{r_want}; a run may grow the Markov rank, never shrink it "
                          f"(--set markov_rank={r_have} or more)")
    kept = source.spec.num_layers
    grown = range(kept, drafter.spec.num_layers)
    if source.spec.visibility != drafter.spec.visibility[:kept]:
        raise ConfigError(f"{origin}: the checkpoint's per-layer visibility "
                          f"{source.spec.visibility} differs from this run's first {kept} layers")
    new_prefixes = tuple(f"layers.{i}." for i in grown)
    theirs, ours = source.state_dict(), drafter.state_dict()
    ours_kept = {k: v for k, v in ours.items() if not k.startswith(new_prefixes)}
    for name in sorted(theirs.keys() | ours_kept.keys()):
        if name not in ours:
            raise ConfigError(f"{origin}: tensor {name!r} of the checkpoint has no place in this "
                              f"run's {family} drafter; match the checkpoint's config with --set")
        if name not in theirs:
            raise ConfigError(f"{origin}: the checkpoint lacks tensor {name!r} that this run's "
                              f"{family} drafter has; match the checkpoint's config with --set")
        if theirs[name].shape != ours[name].shape and not (
                name in _RANK_GROWN and _leading_slice(ours[name], theirs[name], r_want - r_have)):
            raise ConfigError(
                f"{origin}: tensor {name!r} has shape {tuple(theirs[name].shape)} in the "
                f"checkpoint and {tuple(ours[name].shape)} in this run; match the checkpoint's "
                "config with --set (num_layers, num_heads, head_dim, ...)")
    with torch.no_grad():
        for name, tensor in ours_kept.items():
            value = theirs[name].to(device=tensor.device, dtype=tensor.dtype)
            if value.shape == tensor.shape:
                tensor.copy_(value)
                continue
            # a grown Markov rank: the checkpoint's columns lead, the new ones add nothing yet
            have = value.shape[1]
            tensor[:, :have].copy_(value)
            if name != "markov_w1.weight":
                tensor[:, have:].zero_()
        for name, tensor in ours.items():
            if name.startswith(new_prefixes) and name.rsplit(".", 2)[-2] in ("o_proj", "down_proj"):
                tensor.zero_()


__all__ = ["check_init_from", "warm_start"]
