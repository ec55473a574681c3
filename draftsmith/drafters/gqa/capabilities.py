"""The capabilities of the GQA families (``dflash``, ``dspark-gqa``) without their weights.

:func:`gqa_capabilities` resolves the same architecture ``load_gqa_drafter`` does, from the
options or from the checkpoint's ``config.json`` and tensor headers, and reads the capabilities
off a model built on the meta device: no weight is drawn, read or allocated. A checkpoint's
tensors are checked on their headers as loading checks them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.contract import DrafterCapabilities, LoadRequest
from draftsmith.drafters.checkpoint import TensorSource, read_config, tensor_headers
from draftsmith.drafters.gqa.load import (
    checked_state,
    checkpoint_dtype,
    checkpoint_spec,
    random_spec,
)
from draftsmith.drafters.gqa.model import GQADrafter


def gqa_capabilities(request: LoadRequest, family: str) -> DrafterCapabilities:
    """What ``load_gqa_drafter(request, family)`` declares, found without weights. A checkpoint
    is checked as loading it would check it, on its tensor headers: a tensor missing, left over,
    of another shape or of a dtype that is not a float is a :class:`CheckpointError` here."""
    collectives = request.collectives
    rank, size = int(collectives.rank), int(collectives.world_size)
    if request.checkpoint is None:
        spec, _, target = random_spec(request, family)
        with torch.device("meta"):
            model = GQADrafter(spec, family, rank, size)
        return model.to(request.dtype or target.dtype).capabilities
    directory = Path(request.checkpoint)
    config = read_config(directory)
    source = TensorSource(tensor_headers(directory), str(directory))
    spec = checkpoint_spec(request, family, config, source)
    with torch.device("meta"):
        model = GQADrafter(spec, family, rank, size)
    state = checked_state(source, spec, model, family)
    dtype = request.dtype or checkpoint_dtype(config, state["fc.weight"], source.origin)
    return model.to(dtype).capabilities


__all__ = ["gqa_capabilities"]
