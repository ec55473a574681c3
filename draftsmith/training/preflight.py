"""What can be checked about a training run before its target loads:
:func:`check_before_training`, which ``draftsmith train`` calls once its flags and data have
been read. The drafter the run would build is declared from its options on the ``meta``
device (no weight drawn), the ``--init-from`` checkpoint is checked on its config and tensor
headers, and the memory one step needs is estimated from the config against the device's.
"""

from __future__ import annotations

import torch

from draftsmith.contract import ConfigError, LoadRequest, TargetInfo
from draftsmith.runtime.bind import target_info_from_config
from draftsmith.runtime.buffers import available_bytes
from draftsmith.runtime.config import TargetConfig, resolve_device
from draftsmith.training.config import TrainConfig
from draftsmith.training.trainer import drafter_options
from draftsmith.training.warm_start import check_init_from


def check_before_training(config: TrainConfig, target: TargetConfig,
                          resuming: bool = False) -> None:
    """Refuse, before the target loads, a run whose drafter cannot be built for ``target``,
    whose ``init_from`` is not a checkpoint of its family for ``target``, or whose steps
    cannot fit the memory of the device ``target`` runs on.

    :param resuming: the run will resume from its saved state (its ``init_from`` is then
        ignored, as :func:`~draftsmith.training.trainer.train` does).
    :raises ConfigError: naming the ``--set`` field or flag to change.
    """
    info = target_info_from_config(target)
    family, options = drafter_options(config)
    assert family.capabilities is not None
    family.capabilities(LoadRequest(options=options, target=info, dtype=torch.float32))
    if config.init_from is not None and not resuming:
        check_init_from(config.init_from, config.family, info)
    _check_step_memory(config, info, resolve_device(target.device))


def step_bytes(config: TrainConfig, target: TargetInfo) -> int:
    """A lower bound on the bytes one training step holds at once: the drafter's and the
    target's logits over every drafted block slot (two ``[batch_size, num_anchors, K, V]``
    fp32 tensors, :func:`~draftsmith.training.objective.block_loss`) and the attention mask
    of the blocks over the context and themselves (``[batch_size, N * W, max_len + N * W]``
    bool, :func:`~draftsmith.training.objective.drafter_hidden`)."""
    k = config.block_size
    w = k + (1 if config.block_convention == "bonus-silent" else 0)
    rows = config.batch_size * config.num_anchors
    logits = 2 * rows * k * target.vocab_size * 4
    mask = rows * w * (config.max_len + config.num_anchors * w)
    return logits + mask


def _check_step_memory(config: TrainConfig, target: TargetInfo, device: torch.device) -> None:
    available = available_bytes(device)
    needed = step_bytes(config, target)
    if available is None or needed <= available:
        return
    where = "free on" if device.type == "cuda" else "of RAM on"
    raise ConfigError(
        f"a training step needs at least {needed / 2**30:.1f} GiB (logits and an attention mask "
        f"over batch_size {config.batch_size} x num_anchors {config.num_anchors} blocks of "
        f"block_size {config.block_size}, vocabulary {target.vocab_size}, max_len "
        f"{config.max_len}), but only {available / 2**30:.1f} GiB are {where} {device}; lower "
        "block_size, num_anchors or batch_size (--set FIELD=VALUE)")


__all__ = ["check_before_training", "step_bytes"]
