"""Vocab-parallel token selection without gathering the logits.

Owns the exchange workspace, the pair exchange (one zero-padded fp32 SUM all-reduce, or an
all-gather of ``[rows, 2]`` pairs), the decode, and the sharded argmax / Gumbel-max / top-k
candidate selections built on them. Collectives arrive as a
:class:`~draftsmith.contract.Collectives`; this module never imports torch.distributed.
Imports ``draftsmith.contract`` and ``draftsmith.kernels``.
"""

from __future__ import annotations

from typing import Literal

import torch

from draftsmith.contract import (
    Collectives,
    LogitsShard,
    PlanError,
    SamplingKey,
    ShapeError,
    SingleRank,
)
from draftsmith.kernels.argmax_pair import EXCHANGE_COLUMNS, argmax_pair, argmax_pair_reference
from draftsmith.kernels.gumbel_pair import gumbel_pair, gumbel_pair_reference
from draftsmith.selection.eligibility import gumbel_pairs_split_invariant

ExchangeMethod = Literal["auto", "sum", "gather"]


class ExchangeWorkspace:
    """The exchange's own staging buffer ``[max_rows, 128] float32``, allocated once (before any
    CUDA-graph capture) so the exchange never pays to clear a large buffer.

    The pair kernels overwrite every column of the rows they use, so no memset is needed.
    """

    def __init__(self, max_rows: int, device: torch.device | str = "cpu") -> None:
        if not isinstance(max_rows, int) or max_rows < 1:
            raise ShapeError(f"ExchangeWorkspace.max_rows must be an int >= 1, got {max_rows!r}")
        self.max_rows = max_rows
        self.staging = torch.zeros(max_rows, EXCHANGE_COLUMNS, dtype=torch.float32,
                                   device=device)

    def rows(self, rows: int) -> torch.Tensor | None:
        """A view of the first ``rows`` staging rows, or ``None`` beyond capacity."""
        return self.staging[:rows] if rows <= self.max_rows else None


def check_shard_layout(shard: LogitsShard, collectives: Collectives) -> int:
    """Return ``S`` after checking that rank ``rho`` holds ids ``[rho*S, (rho+1)*S)`` of ``V``."""
    tp, rank, s = collectives.world_size, collectives.rank, shard.shard_width
    if s * tp != shard.vocab_size or shard.vocab_start != rank * s:
        raise PlanError(
            f"rank {rank} of {tp} holds ids {shard.vocab_start}..{shard.vocab_start + s - 1} of "
            f"V = {shard.vocab_size}; vocab-parallel selection needs even contiguous shards "
            f"[rank * S, (rank + 1) * S) with S = V / TP"
        )
    return s


def exchange_pairs(
    staging: torch.Tensor, collectives: Collectives, method: ExchangeMethod = "auto"
) -> torch.Tensor:
    """Exchange per-rank pairs; returns ``[rows, >= 2*TP] float32`` with rank ``r``'s
    ``(index, value)`` at columns ``2r, 2r+1``.

    ``staging: [rows, C] float32`` holds this rank's pair at ``2*rho, 2*rho+1`` and ``+0.0``
    elsewhere (as written by ``argmax_pair`` / ``gumbel_pair``). ``sum``: one SUM all-reduce of
    ``staging`` in place (equal to the all-gather: one non-zero per column, ``x + 0 == x``);
    ``gather``: all-gather of the ``[rows, 2]`` pairs. ``auto`` sums when ``2*TP <= C``.
    """
    tp, rank = collectives.world_size, collectives.rank
    if method == "auto":
        method = "sum" if 2 * tp <= staging.shape[1] else "gather"
    if method == "sum":
        if 2 * tp > staging.shape[1]:
            raise PlanError(f"the SUM exchange needs 2 * TP = {2 * tp} <= {staging.shape[1]} "
                            "staging columns; use method='gather'")
        return collectives.all_reduce(staging)
    if method != "gather":
        raise PlanError(f"unknown exchange method {method!r}; valid: auto, sum, gather")
    pair = staging[:, 2 * rank:2 * rank + 2].contiguous()
    return collectives.all_gather(pair, dim=1)


def decode_pairs(gathered: torch.Tensor, tp_size: int) -> torch.Tensor:
    """Global token per row from exchanged pairs ``[rows, >= 2*TP]`` -> ``[rows] int64``.

    ``w = argmax_T(values over ranks)`` (lowest rank wins ties, a NaN wins), token =
    ``int(gathered[row, 2*w])``.
    """
    if tp_size == 1:  # one pair a row: its index, one cast instead of four launches
        return gathered[:, 0].to(torch.int64)
    vals = gathered[:, 1:2 * tp_size:2]
    winner = torch.argmax(vals, dim=1)
    return gathered.gather(1, (2 * winner)[:, None])[:, 0].to(torch.int64)


def _staging(rows: int, tp_size: int, device: torch.device,
             workspace: ExchangeWorkspace | None) -> torch.Tensor:
    if workspace is not None and 2 * tp_size <= EXCHANGE_COLUMNS:
        view = workspace.rows(rows)
        if view is not None:
            return view
    # beyond the workspace (or without one): a fresh buffer; only the own pair columns matter
    # for the gather fallback, but the kernels always write whole zero-padded rows
    return torch.empty(rows, max(EXCHANGE_COLUMNS, 2 * tp_size), dtype=torch.float32,
                       device=device)


def _method_for(rows: int, tp_size: int, workspace: ExchangeWorkspace | None,
                method: ExchangeMethod) -> ExchangeMethod:
    if method != "auto":
        return method
    if 2 * tp_size > EXCHANGE_COLUMNS:
        return "gather"
    if workspace is not None and rows > workspace.max_rows:
        return "gather"  # rows beyond the one-shot capacity
    return "sum"


def _use_kernel(logits: torch.Tensor, use_kernel: bool | None) -> bool:
    return logits.is_cuda if use_kernel is None else use_kernel


def sharded_argmax(
    shard: LogitsShard,
    collectives: Collectives,
    workspace: ExchangeWorkspace | None = None,
    use_kernel: bool | None = None,
    method: ExchangeMethod = "auto",
) -> torch.Tensor:
    """``torch.argmax`` of the full rows, computed from this rank's shard: ``[rows] int64``.

    ``use_kernel``: the Triton pair kernel (``None``: on CUDA tensors) or its eager reference;
    both give identical bits. Identical on every rank.
    """
    check_shard_layout(shard, collectives)
    tp, rank = collectives.world_size, collectives.rank
    rows = shard.logits.shape[0]
    staging = _staging(rows, tp, shard.logits.device, workspace)
    pack = argmax_pair if _use_kernel(shard.logits, use_kernel) else argmax_pair_reference
    pack(shard.logits, shard.vocab_start, staging, rank)
    gathered = exchange_pairs(staging, collectives, _method_for(rows, tp, workspace, method))
    return decode_pairs(gathered, tp)


def sharded_gumbel_sample(
    shard: LogitsShard,
    temperatures: torch.Tensor,
    key: SamplingKey,
    stream: int,
    collectives: Collectives,
    workspace: ExchangeWorkspace | None = None,
    use_kernel: bool | None = None,
    method: ExchangeMethod = "auto",
) -> torch.Tensor:
    """Temperature sampling by Gumbel-max over shards: ``[rows] int64``.

    ``temperatures: [rows] float32`` (``<= 0``: greedy row); ``key`` seeds and offsets per row;
    ``stream`` 0/1/2. The token depends only on the full row, the key and the stream, never on
    the TP split: where the shard width is not a multiple of the Gumbel group size, a border
    would cut a group's draw in two (:mod:`draftsmith.kernels.gumbel_pair`), so the rows are
    gathered and every rank draws from them whole, as one rank does.
    """
    check_shard_layout(shard, collectives)
    if not gumbel_pairs_split_invariant(shard.shard_width):
        shard, collectives = whole_rows(shard, collectives), SingleRank()
    tp, rank = collectives.world_size, collectives.rank
    rows = shard.logits.shape[0]
    staging = _staging(rows, tp, shard.logits.device, workspace)
    pack = gumbel_pair if _use_kernel(shard.logits, use_kernel) else gumbel_pair_reference
    pack(shard.logits, temperatures.to(torch.float32).contiguous(), key.seeds.contiguous(),
         key.offsets.contiguous(), stream, shard.vocab_start, staging, rank)
    gathered = exchange_pairs(staging, collectives, _method_for(rows, tp, workspace, method))
    return decode_pairs(gathered, tp)


def whole_rows(shard: LogitsShard, collectives: Collectives) -> LogitsShard:
    """The full rows of ``shard`` (gathered, fp32) as the shard of one rank."""
    return LogitsShard(gather_logits(shard, collectives), 0, shard.vocab_size)


def gather_logits(shard: LogitsShard, collectives: Collectives) -> torch.Tensor:
    """All-gather the shards along the vocabulary: ``[rows, V] float32`` (widened exactly)."""
    if collectives.world_size == 1:
        if not shard.is_full:
            raise PlanError("a single rank must hold the full vocabulary")
        return shard.logits.to(torch.float32)
    check_shard_layout(shard, collectives)
    return collectives.all_gather(shard.logits.to(torch.float32).contiguous(), dim=1)


def order_t_sort(scores: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort candidates ``[rows, n]`` by order T: NaN first, then larger score, then lower id.

    ``ids: [rows, n] int64`` global ids. Returns ``(scores, ids)`` sorted along dim 1.
    """
    by_id = torch.argsort(ids, dim=1, stable=True)
    scores, ids = scores.gather(1, by_id), ids.gather(1, by_id)
    # torch.sort (descending) places NaN first; stable keeps lower ids first among equals
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices
    return scores.gather(1, order), ids.gather(1, order)


def order_t_sort_columns(scores: torch.Tensor,
                         vocab_start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`order_t_sort` of ``scores: [rows, n]`` whose ids are ``vocab_start + column``.

    The columns already run in id order, so one stable sort gives order T (the id pre-sort of
    :func:`order_t_sort` would be the identity). Returns ``(scores, ids [rows, n] int64)``.
    """
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices
    return scores.gather(1, order), order + vocab_start


def local_top_k(scores: torch.Tensor, vocab_start: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` best of ``scores: [rows, n]`` in order T, with global ids ``vocab_start + col``.

    Returns ``(scores [rows, min(k, n)], ids [rows, min(k, n)] int64)``, sorted in order T.
    """
    s, ids = order_t_sort_columns(scores, vocab_start)
    return s[:, :k], ids[:, :k]


def sharded_top_k_candidates(
    scores: torch.Tensor, vocab_start: int, k: int, collectives: Collectives
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact global top-``k`` (order T) of sharded ``scores: [rows, S]`` float32.

    Each rank contributes its own ``k`` best (the global ``k`` best lie among them); one
    all-gather of ``[rows, k]`` values and ids, then a merge. Returns ``(scores [rows, k],
    ids [rows, k] int64)`` sorted in order T, identical on every rank.
    """
    if k > scores.shape[1]:
        raise PlanError(f"top-k = {k} exceeds the shard width {scores.shape[1]}; gather instead")
    s, ids = local_top_k(scores, vocab_start, k)
    all_s = collectives.all_gather(s.contiguous(), dim=1)
    all_ids = collectives.all_gather(ids.contiguous(), dim=1)
    s, ids = order_t_sort(all_s, all_ids)
    return s[:, :k], ids[:, :k]


__all__ = [
    "ExchangeMethod",
    "ExchangeWorkspace",
    "check_shard_layout",
    "decode_pairs",
    "exchange_pairs",
    "gather_logits",
    "local_top_k",
    "order_t_sort",
    "order_t_sort_columns",
    "sharded_argmax",
    "sharded_gumbel_sample",
    "sharded_top_k_candidates",
    "whole_rows",
]
