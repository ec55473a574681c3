"""The capabilities of the GQA families (``dflash``, ``dspark-gqa``) without their weights.

:func:`gqa_capabilities` resolves the same architecture ``load_gqa_drafter`` does, from the
options or from the checkpoint's ``config.json`` and tensor headers, and reads the capabilities
off a model built on the meta device: no weight is drawn, read or allocated.
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.contract import DrafterCapabilities, LoadRequest
from draftsmith.drafters.checkpoint import CONFIG_FILE, read_config, tensor_dtypes
from draftsmith.drafters.gqa.config import spec_from_config
from draftsmith.drafters.gqa.load import check_gqa_family, checkpoint_dtype, random_spec
from draftsmith.drafters.gqa.model import GQADrafter


def gqa_capabilities(request: LoadRequest, family: str) -> DrafterCapabilities:
    """What ``load_gqa_drafter(request, family)`` declares, found without weights."""
    check_gqa_family(family)
    collectives = request.collectives
    target = request.target
    if request.checkpoint is None:
        spec, _, target = random_spec(request, family)
        dtype = request.dtype or target.dtype
    else:
        directory = Path(request.checkpoint)
        config = read_config(directory)
        stored = tensor_dtypes(directory)
        spec = spec_from_config(config, family, own_embedding="embed_tokens.weight" in stored,
                                target=target, origin=str(directory / CONFIG_FILE))
        fc = torch.empty(0, dtype=stored.get("fc.weight", torch.float32), device="meta")
        dtype = request.dtype or checkpoint_dtype(config, fc, str(directory))
    with torch.device("meta"):
        model = GQADrafter(spec, family, int(collectives.rank), int(collectives.world_size))
    return model.to(dtype).capabilities


__all__ = ["gqa_capabilities"]
