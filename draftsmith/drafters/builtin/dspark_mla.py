"""Built-in drafter family ``dspark-mla``: DSpark with MLA attention: single-latent paged context,
TP fusions.

The model lives in :mod:`draftsmith.drafters.mla`; this module registers the family, its
options model and its loader. With ``LoadRequest.checkpoint`` set the loader reads the checkpoint
(format: ``docs/checkpoint-mla.md``); with ``None`` it builds random weights of the shape given by
the options, taking the hidden size and vocabulary from ``LoadRequest.target``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import ConfigDict

from draftsmith import hookimpl
from draftsmith.contract import (
    ConfigError,
    DrafterCapabilities,
    DrafterFamily,
    LoadRequest,
    Registrar,
    TPFusion,
)
from draftsmith.drafters.checkpoint import (
    CONFIG_FILE,
    check_options_agree,
    config_dtype,
    read_config,
)
from draftsmith.drafters.mla import (
    FAMILY_NAME,
    DSparkMLADrafter,
    MLAArchitecture,
    MLAConfig,
    default_tp_fusions,
    mla_config_from_json,
    random_mla_tensors,
    read_mla_checkpoint,
)


class DSparkMLAOptions(MLAArchitecture):
    """Options of ``dspark-mla``.

    ``tp_fusions`` always applies. Every other field describes the architecture of randomly
    initialised weights; with a checkpoint its own ``config.json`` describes it, and a field set
    explicitly must agree with it (:class:`ConfigError` otherwise).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    tp_fusions: frozenset[TPFusion] | None = None
    """TP fusions to take when the group has more than one rank: ``fc-split-hidden-norm``
    and/or ``ar-residual-rmsnorm``. ``None`` follows the runtime plan's rule (both for bf16
    weights, none otherwise); a set forces exactly those (any dtype). An ``fc`` whose input width
    does not divide by TP stays replicated whatever is asked."""


def _options(request: LoadRequest) -> DSparkMLAOptions:
    options = request.options
    if not isinstance(options, DSparkMLAOptions):
        raise ConfigError(
            f"dspark-mla needs DSparkMLAOptions, got {type(options).__name__}; validate the "
            "options with the family's options_model"
        )
    return options


def _random_config(request: LoadRequest, options: DSparkMLAOptions) -> MLAConfig:
    """The architecture of random weights: the options, sized by the target."""
    if request.target is None:
        raise ConfigError(
            "dspark-mla random initialisation takes its hidden size and vocabulary from the "
            "target: pass LoadRequest.target (or a checkpoint)"
        )
    arch = MLAArchitecture(**options.model_dump(exclude={"tp_fusions"}))
    try:
        return MLAConfig.from_architecture(arch, request.target)
    except ValueError as exc:
        raise ConfigError(f"dspark-mla options do not fit the target: {exc}") from None


def load_dspark_mla(request: LoadRequest) -> DSparkMLADrafter:
    """Build a ``dspark-mla`` drafter from a checkpoint or, without one, from random weights."""
    options = _options(request)
    if request.checkpoint is not None:
        drafter = DSparkMLADrafter.load(
            request.checkpoint,
            target=request.target,
            collectives=request.collectives,
            tp_fusions=options.tp_fusions,
            dtype=request.dtype,
            device=request.device,
        )
        actual = {name: getattr(drafter.cfg, name) for name in MLAArchitecture.model_fields}
        check_options_agree(options, actual, str(request.checkpoint), skip={"tp_fusions"})
        return drafter
    cfg = _random_config(request, options)
    return DSparkMLADrafter.from_tensors(
        cfg,
        random_mla_tensors(cfg, request.seed),
        collectives=request.collectives,
        tp_fusions=options.tp_fusions,
        dtype=request.dtype or request.target.dtype,
        device=request.device,
    )


def dspark_mla_capabilities(request: LoadRequest) -> DrafterCapabilities:
    """The capabilities :func:`load_dspark_mla` declares for ``request``, from the options or
    the checkpoint's ``config.json`` (options set beside it must agree with it): the drafter is
    built with its weights left as meta placeholders, which it is until weights are assigned."""
    options = _options(request)
    if request.checkpoint is not None:
        directory = Path(request.checkpoint)
        raw = read_config(directory)
        origin = str(directory / CONFIG_FILE)
        cfg = mla_config_from_json(raw, request.target, origin)
        actual = {name: getattr(cfg, name) for name in MLAArchitecture.model_fields}
        check_options_agree(options, actual, str(directory), skip={"tp_fusions"})
        dtype = request.dtype or config_dtype(raw, origin) or torch.float32
    else:
        cfg = _random_config(request, options)
        dtype = request.dtype or request.target.dtype
    fusions = default_tp_fusions(dtype) if options.tp_fusions is None else options.tp_fusions
    caps = DSparkMLADrafter(cfg, request.collectives, fusions).capabilities
    return caps.model_copy(update={"dtype": str(dtype).removeprefix("torch.")})


def check_dspark_mla_checkpoint(request: LoadRequest) -> None:
    """Check ``request.checkpoint``'s tensor headers as loading checks its tensors."""
    read_mla_checkpoint(Path(request.checkpoint), request.target,  # type: ignore[arg-type]
                        headers_only=True)


FAMILY = DrafterFamily(
    name=FAMILY_NAME,
    summary="DSpark with MLA attention: single-latent paged context, TP fusions",
    load=load_dspark_mla,
    options_model=DSparkMLAOptions,
    capabilities=dspark_mla_capabilities,
    check_checkpoint=check_dspark_mla_checkpoint,
)


@hookimpl
def draftsmith_register_drafters(registrar: Registrar) -> None:
    """Register ``dspark-mla``."""
    registrar.add_family(FAMILY)
