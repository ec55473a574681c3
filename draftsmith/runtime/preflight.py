"""What can be checked about a :class:`SpecConfig` before the target or the drafter loads:
:func:`check_before_loading`, the one function ``draftsmith generate``, ``eval``, ``plan`` and
``config validate`` call first, so that a bad input costs seconds, not a model load.

It checks what the config names on disk (the target directory, the drafter checkpoint and
every tensor header of it against its config), that the drafter's options build, the plan
``bind`` would make (``K`` against the drafter's block, the mapping against the processes that
will run it), the memory the drafter's weights and the decoder buffers need against the
device's, and the token budget and the prompts against the context. Every refusal is a
:class:`DraftsmithError` whose message says what to change.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from draftsmith.contract import ConfigError, DrafterCapabilities, ParallelMapping
from draftsmith.drafters.checkpoint import check_checkpoint_dir
from draftsmith.runtime.bind import (
    declared_capabilities,
    plan_only,
    target_info_from_config,
    target_position_limit,
)
from draftsmith.runtime.buffers import available_bytes, buffer_bytes, check_buffers_fit
from draftsmith.runtime.config import (
    EMBEDDED_TARGET_NAMES,
    TARGET_DTYPES,
    SpecConfig,
    check_target_dir,
    parse_device,
    resolve_device,
)
from draftsmith.runtime.inputs import check_positions
from draftsmith.runtime.plan import DraftPlan
from draftsmith.runtime.registry import Registry, load_registry

TEMPLATE_ALLOWANCE = 256
"""Tokens a chat template may add around a prompt, at most, as far as the cheap bound on a
prompt's length goes: a prompt of ``n`` UTF-8 bytes encodes to at most ``n`` tokens (every
token stands for one byte or more), so one whose bytes plus this allowance fit the context is
not tokenized before the model loads."""


def check_before_loading(
    config: SpecConfig,
    *,
    ranks: tuple[int, int] | None = None,
    max_new_tokens: int | None = None,
    prompts: Sequence[str] = (),
    chat: bool = True,
    registry: Registry | None = None,
) -> DraftPlan:
    """Check ``config`` as far as it can be without loading the target or the drafter's weights;
    return the plan ``bind`` would make (with the drafter's declared capabilities).

    :param ranks: ``(processes, this rank)`` that will run ``config`` here (``torchrun``'s
        ``WORLD_SIZE`` and ``RANK``), or ``None`` when nothing runs here (``plan``, ``config
        validate``): then ``parallel`` is planned as written, and a device this host lacks is
        not an error.
    :param max_new_tokens: the token budget per prompt, checked against the context.
    :param prompts: the prompts, checked against the context with the target's tokenizer
        (loaded alone) where their length could matter.
    :raises DraftsmithError: naming what to change.
    """
    check_target_dir(config.target.model)
    if config.drafter.checkpoint is not None:
        check_checkpoint_dir(config.drafter.checkpoint)
    if ranks is not None:
        config = _mapped_for(config, *ranks)
        resolve_device(config.target.device)  # CUDA asked for on a host without it
    registry = registry if registry is not None else load_registry()
    info = target_info_from_config(config.target, config.parallel.tp_size)
    caps = declared_capabilities(config, info, registry)
    plan = plan_only(config, info, registry=registry, capabilities=caps)
    _check_memory(config, plan, caps, info.hidden_size)
    limit = target_position_limit(config.target)
    if max_new_tokens is not None:
        check_positions("a prompt of 1 token", 1, max_new_tokens, plan.num_draft_tokens,
                        plan.max_ctx, limit)
    if prompts:
        _check_prompt_lengths(config, plan, limit, prompts, max_new_tokens or 1, chat)
    return plan


def _mapped_for(config: SpecConfig, processes: int, rank: int) -> SpecConfig:
    """``config`` with the mapping ``load_decoder`` will give it under ``processes`` ranks;
    :class:`ConfigError` when ``parallel.tp_size`` asks for another number of processes."""
    tp = config.parallel.tp_size
    if processes <= 1 and tp > 1:
        raise ConfigError(
            f"parallel.tp_size = {tp} runs one process per rank, but this is a single process; "
            f"start the command with torchrun (torchrun --nproc-per-node {tp} -m draftsmith "
            "...), or set parallel.tp_size = 1")
    if processes > 1 and tp not in (1, processes):
        raise ConfigError(
            f"parallel.tp_size = {tp} but torchrun started {processes} processes; start "
            f"{tp} (--nproc-per-node {tp}) or set parallel.tp_size to {processes} or 1")
    if processes <= 1:
        return config
    mapping = ParallelMapping(tp_size=processes, tp_rank=rank,
                              attention_dp=config.parallel.attention_dp)
    return config.model_copy(update={"parallel": mapping})


def _check_memory(config: SpecConfig, plan: DraftPlan, caps: DrafterCapabilities,
                  target_hidden: int) -> None:
    """The drafter's weights and the decoder buffers fit the memory of the configured device
    (not checked for a device this host lacks, whose memory it cannot tell)."""
    device = parse_device(config.target.device) or resolve_device("auto")
    available = available_bytes(device)
    if available is None:
        return
    weights = (caps.num_parameters or 0) * getattr(torch, caps.dtype).itemsize
    if weights > available:
        where = "free on" if device.type == "cuda" else "of RAM on"
        raise ConfigError(
            f"the drafter's weights need about {weights / 2**30:.1f} GiB ({caps.num_parameters} "
            f"numbers in {caps.dtype}), but only {available / 2**30:.1f} GiB are {where} "
            f"{device}; {_drafter_size_hint(config)}")
    needed = buffer_bytes(
        slot_capacity=plan.slot_capacity, num_draft_tokens=plan.num_draft_tokens,
        block_width=plan.block_width, vocab_size=plan.vocab_size, page_size=plan.page_size,
        pages_per_slot=plan.pages_per_slot, entry=caps.context_entry,
        pool_dtype=getattr(torch, caps.dtype),
        with_draft_probs="rejection" in (plan.acceptance, plan.forced_base),
        feature_width=len(plan.capture_layers) * target_hidden if plan.drafting else 0,
        feature_dtype=TARGET_DTYPES[config.target.dtype])
    check_buffers_fit(needed, device, slot_capacity=plan.slot_capacity, max_ctx=plan.max_ctx,
                      page_size=plan.page_size, besides=(weights, "drafter weights"))


def _drafter_size_hint(config: SpecConfig) -> str:
    """What decides the drafter's size: its checkpoint's config, or the integer options set
    (the largest first)."""
    if config.drafter.checkpoint is not None:
        return (f"the config.json of checkpoint {config.drafter.checkpoint} declares that size; "
                "use a smaller drafter")
    options = config.drafter.options
    sizes = sorted(((getattr(options, name), name) for name in options.model_fields_set
                    if isinstance(getattr(options, name), int)
                    and not isinstance(getattr(options, name), bool)), reverse=True)
    if not sizes:
        return "use a smaller drafter family or options"
    named = ", ".join(f"drafter.options.{name} = {value}" for value, name in sizes[:3])
    return f"lower the drafter's size options ({named})"


def _check_prompt_lengths(config: SpecConfig, plan: DraftPlan, limit: int | None,
                          prompts: Sequence[str], max_new_tokens: int, chat: bool) -> None:
    """Each prompt, with the budget and a verify block, fits the context. A prompt whose UTF-8
    length bounds it well inside the context passes as it is; the others are tokenized with
    the target's tokenizer alone, where one is at hand without loading the model (a local
    directory, or the embedded target once converted)."""
    room = min(plan.max_ctx, limit if limit is not None else plan.max_ctx)
    fixed = max_new_tokens + plan.num_draft_tokens + 1 + TEMPLATE_ALLOWANCE
    long = [i for i, text in enumerate(prompts) if len(text.encode("utf-8")) + fixed > room]
    if not long:
        return
    directory = _tokenizer_dir(config.target.model)
    if directory is None:
        return  # the decoder checks the lengths once the target is there
    from draftsmith.runtime.api import encode_text
    from draftsmith.runtime.targets.hf_model import load_tokenizer

    tokenizer = load_tokenizer(directory)
    for i in long:
        ids = encode_text(tokenizer, prompts[i], chat)
        check_positions(f"prompt {i} ({len(ids)} tokens)", len(ids), max_new_tokens,
                        plan.num_draft_tokens, plan.max_ctx, limit)


def _tokenizer_dir(model: str) -> Path | None:
    """Where the target's tokenizer can be read without loading the model, if anywhere."""
    if model in EMBEDDED_TARGET_NAMES:
        from draftsmith.runtime.targets.smollm2 import smollm2_available, smollm2_dir

        return smollm2_dir() if smollm2_available() else None
    directory = Path(model).expanduser()
    return directory if directory.is_dir() else None


__all__ = ["TEMPLATE_ALLOWANCE", "check_before_loading"]
