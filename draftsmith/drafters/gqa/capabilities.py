"""The capabilities of the GQA families (``dflash``, ``dspark-gqa``) without their weights, and
the check of a checkpoint's files on their tensor headers.

:func:`gqa_capabilities` resolves the same architecture ``load_gqa_drafter`` does, from the
options or from the checkpoint's ``config.json`` and tensor headers, and reads the capabilities
off a model built on the meta device: no weight is drawn, read or allocated.
:func:`check_gqa_checkpoint` checks every tensor header against that architecture as loading
checks the tensors themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from draftsmith.contract import DrafterCapabilities, LoadRequest
from draftsmith.drafters.checkpoint import TensorSource, read_config, tensor_headers
from draftsmith.drafters.gqa.config import GQADrafterSpec
from draftsmith.drafters.gqa.load import (
    check_gqa_family,
    checked_state,
    checkpoint_dtype,
    checkpoint_spec,
    meta_drafter,
    random_spec,
)
from draftsmith.drafters.gqa.model import GQADrafter


def _meta_model(request: LoadRequest, spec: GQADrafterSpec, family: str) -> GQADrafter:
    return meta_drafter(spec, family, int(request.collectives.rank),
                        int(request.collectives.world_size), str(request.checkpoint or "options"))


def _checkpoint(request: LoadRequest,
                family: str) -> tuple[dict[str, Any], dict[str, torch.Tensor], GQADrafterSpec]:
    """``(config, its tensor headers as meta tensors, the architecture they declare)``."""
    directory = Path(request.checkpoint)  # type: ignore[arg-type]
    config = read_config(directory)
    headers = tensor_headers(directory)
    spec = checkpoint_spec(request, family, config, TensorSource(headers, str(directory)))
    return config, headers, spec


def gqa_capabilities(request: LoadRequest, family: str) -> DrafterCapabilities:
    """What ``load_gqa_drafter(request, family)`` declares, found without weights."""
    check_gqa_family(family)
    if request.checkpoint is None:
        spec, _, target = random_spec(request, family)
        return _meta_model(request, spec, family).to(request.dtype or target.dtype).capabilities
    config, headers, spec = _checkpoint(request, family)
    fc = headers.get("fc.weight", torch.empty(0, device="meta"))
    dtype = request.dtype or checkpoint_dtype(config, fc, str(request.checkpoint))
    return _meta_model(request, spec, family).to(dtype).capabilities


def check_gqa_checkpoint(request: LoadRequest, family: str) -> None:
    """Check ``request.checkpoint``'s tensor headers as ``load_gqa_drafter`` checks its tensors:
    every tensor the config describes is present with its shape and a float dtype, none is left
    over; :class:`~draftsmith.contract.CheckpointError` naming the tensor otherwise."""
    _, headers, spec = _checkpoint(request, family)
    checked_state(TensorSource(headers, str(request.checkpoint)), spec,
                  _meta_model(request, spec, family), family)


__all__ = ["check_gqa_checkpoint", "gqa_capabilities"]
