"""Tensor-parallel helpers for drafters: weight sharding and the two TP fusions.

Drafter projections follow the Megatron layout: column-parallel projections (``q``/``kv`` up
projections by heads, ``gate``/``up`` by intermediate size) keep a contiguous block of output
rows; row-parallel projections (``o_proj``, ``down_proj``) keep a block of input columns and
produce a partial sum that must be all-reduced. Two fusions cut the communication:

* 6.1: the context projection ``fc`` is split along its input features (:func:`fc_split_columns`)
  and its all-reduce is fused with ``hidden_norm`` (:func:`context_projection`);
* 6.2: each row-parallel all-reduce is fused with the residual add and the following RMSNorm
  (:func:`ar_residual_rmsnorm`).

Every fused or split path has its stock twin next to it, behind one function
(:func:`reduce_residual_rmsnorm`, :func:`context_projection`). Communication goes through the
injected :class:`~draftsmith.contract.Collectives`; this module never imports
``torch.distributed``. May import ``contract`` and ``drafters.nn`` only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from draftsmith.contract import Collectives, ConfigError, ShapeError, check_tensor
from draftsmith.drafters.nn import product, residual_rms_norm, rms_norm


def fc_split_columns(feature_width: int, tp_size: int, rank: int) -> tuple[int, int] | None:
    """Input-column range ``[lo, hi)`` of ``fc`` kept by ``rank``, or ``None``.

    The ``tp_size`` blocks tile ``0 .. feature_width - 1`` in rank order. ``None`` ("no split":
    keep ``fc`` replicated) when ``feature_width % tp_size != 0``, ``feature_width <= 0``,
    ``tp_size <= 0`` or ``rank`` is outside ``0 .. tp_size - 1``. Example:
    ``fc_split_columns(5 * 7168, 16, 3) == (6720, 8960)``.
    """
    if tp_size <= 0 or feature_width <= 0 or feature_width % tp_size:
        return None
    if not 0 <= rank < tp_size:
        return None
    width = feature_width // tp_size
    return rank * width, (rank + 1) * width


def shard_range(size: int, tp_size: int, rank: int, what: str) -> tuple[int, int]:
    """Even contiguous shard ``[lo, hi)`` of ``size`` for ``rank``; :class:`ConfigError` if uneven.

    ``what`` names the dimension in the message (``"num_attention_heads"``).
    """
    if tp_size < 1 or not 0 <= rank < tp_size:
        raise ConfigError(f"rank {rank} is not in a tensor-parallel group of {tp_size}")
    if size % tp_size:
        raise ConfigError(
            f"{what} = {size} does not split evenly over {tp_size} tensor-parallel ranks; "
            f"choose a TP size that divides it"
        )
    width = size // tp_size
    return rank * width, (rank + 1) * width


def column_parallel_shard(
    weight: torch.Tensor, tp_size: int, rank: int, what: str = "out_features"
) -> torch.Tensor:
    """This rank's output rows of a column-parallel ``weight: [out, in]`` -> ``[out / TP, in]``."""
    lo, hi = shard_range(int(weight.shape[0]), tp_size, rank, what)
    return weight[lo:hi].contiguous()


def row_parallel_shard(
    weight: torch.Tensor, tp_size: int, rank: int, what: str = "in_features"
) -> torch.Tensor:
    """This rank's input columns of a row-parallel ``weight: [out, in]`` -> ``[out, in / TP]``."""
    lo, hi = shard_range(int(weight.shape[1]), tp_size, rank, what)
    return weight[:, lo:hi].contiguous()


def ar_residual_rmsnorm(
    partial: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    collectives: Collectives,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused all-reduce + residual add + RMSNorm: ``(normed, new_residual)``.

    ``partial, residual: [rows, H]`` (any leading dims) in the activation dtype; ``weight: [H]``.
    As a fused kernel does, the partial sums are reduced in fp32 and the residual is added in
    fp32; the sum is rounded once to the activation dtype, which is ``new_residual``, and
    ``normed = rms_norm(new_residual, weight, eps)``. With one rank this equals the stock
    ``residual + partial`` followed by the RMSNorm exactly (a single rounding of the same sum).
    ``partial`` is not modified.
    """
    if partial.shape != residual.shape:
        raise ShapeError(
            f"ar_residual_rmsnorm: partial {tuple(partial.shape)} and residual "
            f"{tuple(residual.shape)} must have the same shape"
        )
    check_tensor("ar_residual_rmsnorm.weight", weight, (int(partial.shape[-1]),))
    total = partial.to(torch.float32, copy=True)
    if collectives.world_size > 1:
        total = collectives.all_reduce(total)
    new_residual = (total + residual.float()).to(residual.dtype)
    return rms_norm(new_residual, weight, eps), new_residual


def all_reduce_residual_rmsnorm_stock(
    partial: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    collectives: Collectives,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The unfused twin of :func:`ar_residual_rmsnorm`: the projection's own all-reduce in the
    activation dtype, then ``residual + out`` and the RMSNorm (one fused launch on a GPU).
    Reduces ``partial`` in place."""
    out = collectives.all_reduce(partial) if collectives.world_size > 1 else partial
    new_residual, normed = residual_rms_norm(out, residual, weight, eps)
    return normed, new_residual


def reduce_residual_rmsnorm(
    partial: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    collectives: Collectives,
    fused: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-parallel output -> ``(normed, new_residual)``, fused or stock."""
    if fused:
        return ar_residual_rmsnorm(partial, residual, weight, eps, collectives)
    return all_reduce_residual_rmsnorm_stock(partial, residual, weight, eps, collectives)


def context_projection(
    features: torch.Tensor,
    fc_weight: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    columns: tuple[int, int] | None,
    collectives: Collectives,
) -> torch.Tensor:
    """``ctx = RMSNorm_hidden_norm(fc(features))`` with ``fc`` split or replicated.

    ``features: [T, F]`` (replicated on every rank), cast to the ``fc`` dtype first;
    ``norm_weight: [H]``; returns ``ctx: [T, H]``, identical on every rank.

    * Split (``columns = (lo, hi)`` from :func:`fc_split_columns`): ``fc_weight: [H, hi - lo]``
      is this rank's contiguous column block. The partial product of those input columns goes
      through one fused all-reduce + RMSNorm (:func:`ar_residual_rmsnorm` with a zero residual;
      only the normed output is used).
    * Replicated (``columns is None``): ``fc_weight: [H, F]``, the full GEMM on every rank and
      no communication; numerically the stock computation.
    """
    x = features.to(fc_weight.dtype)
    if columns is None:
        check_tensor("features", features, (None, int(fc_weight.shape[1])))
        return rms_norm(product(x, fc_weight), norm_weight, eps)
    lo, hi = columns
    if hi - lo != fc_weight.shape[1] or features.dim() != 2 or features.shape[1] < hi:
        raise ShapeError(
            f"context_projection: features {tuple(features.shape)} must cover columns "
            f"{lo}..{hi} and fc_weight {tuple(fc_weight.shape)} must hold {hi - lo} columns"
        )
    partial = F.linear(x[:, lo:hi], fc_weight)
    normed, _ = ar_residual_rmsnorm(partial, torch.zeros_like(partial), norm_weight, eps, collectives)
    return normed


__all__ = [
        "all_reduce_residual_rmsnorm_stock",
    "ar_residual_rmsnorm",
    "column_parallel_shard",
    "context_projection",
    "fc_split_columns",
    "reduce_residual_rmsnorm",
    "row_parallel_shard",
    "shard_range",
]
