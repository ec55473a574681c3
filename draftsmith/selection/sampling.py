"""Keyed sampling: temperature, top-k, top-p, and draws from explicit distributions.

Every draw is a Gumbel-max over keyed Philox noise, so a token depends only on the
distribution, the :class:`~draftsmith.contract.SamplingKey` and the stream, never on the TP split
or on a global RNG. Filter semantics follow z-lab DFlash 0.1.0 ``_sampling_probs``: scale by
``1 / T``, keep the ``k`` best (exactly ``k``; ties go to the lower id, order T), then keep the
smallest sorted prefix whose mass *before* each element is below ``top_p``, renormalise.
Imports ``draftsmith.contract`` and ``draftsmith.kernels``.
"""

from __future__ import annotations

import torch

from draftsmith.contract import SamplingKey, check_tensor
from draftsmith.kernels.argmax_pair import EXCHANGE_COLUMNS
from draftsmith.kernels.gumbel_pair import gumbel_from_uniform, gumbel_pair, gumbel_pair_reference
from draftsmith.kernels.philox import philox_uniform, philox_uniform_reference
from draftsmith.selection.vocab_parallel import local_top_k, order_t_sort_columns


def keyed_gumbel(key: SamplingKey, ids: torch.Tensor, stream: int,
                 offsets: torch.Tensor | None = None) -> torch.Tensor:
    """Gumbel noise ``[rows, n] float32`` for global ``ids: [rows, n]`` (or ``[n]``).

    ``offsets: [rows] int64`` overrides ``key.offsets`` (for example ``offset + a``). On a GPU
    the uniforms come from the one-launch kernel (the reference's bits, without its ~200 small
    kernels over ``[rows, n]``: top-p sampling draws over the whole vocabulary).
    """
    off = key.offsets if offsets is None else offsets
    draw = philox_uniform if ids.is_cuda else philox_uniform_reference
    return gumbel_from_uniform(draw(key.seeds, off, ids, stream))


def top_p_keep(sorted_scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep mask of scores sorted in order T: ``cumsum(p) - p < top_p`` with ``p = softmax``."""
    probs = torch.softmax(sorted_scores, dim=-1)
    return probs.cumsum(dim=-1) - probs < top_p


def filtered_candidates(
    scores: torch.Tensor, top_k: int, top_p: float, vocab_start: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept candidates of full rows ``scores: [rows, V] float32`` (already ``z / T``).

    Returns ``(scores [rows, n], ids [rows, n] int64)`` sorted in order T, with ``-inf`` for
    candidates that top-p removes; ``n = top_k`` when ``0 < top_k < V``, else ``V``.
    """
    if 0 < top_k < scores.shape[1]:
        cand, ids = local_top_k(scores, vocab_start, top_k)
    else:
        cand, ids = order_t_sort_columns(scores, vocab_start)
    return apply_top_p(cand, top_p), ids


def apply_top_p(sorted_scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """``sorted_scores`` with the candidates outside the top-p prefix set to ``-inf``."""
    if top_p >= 1.0:
        return sorted_scores
    return torch.where(top_p_keep(sorted_scores, top_p), sorted_scores, float("-inf"))


def sample_candidates(
    cand_scores: torch.Tensor, cand_ids: torch.Tensor, key: SamplingKey, stream: int
) -> torch.Tensor:
    """Gumbel-max over candidates: ``argmax_T(score_i + g(id_i))`` -> ``[rows] int64`` ids.

    ``cand_scores: [rows, n] float32`` (``-inf`` = excluded), ``cand_ids: [rows, n] int64``.
    Samples ``softmax(cand_scores)`` exactly up to the 23-bit uniform grid.
    """
    noisy = cand_scores + keyed_gumbel(key, cand_ids, stream)
    return cand_ids.gather(1, torch.argmax(noisy, dim=1, keepdim=True))[:, 0]


def sample_from_probs(probs: torch.Tensor, key: SamplingKey, stream: int,
                      offsets: torch.Tensor | None = None) -> torch.Tensor:
    """One keyed draw per row from ``probs: [rows, V] float32`` -> ``[rows] int64``.

    The two-level keyed Gumbel-max of :func:`~draftsmith.kernels.gumbel_pair.gumbel_pair` over
    ``ln(probs)`` at temperature 1 (one launch on a GPU): exact in distribution, a function of
    the key, ``offsets`` (default ``key.offsets``) and ``stream`` only. Zero-mass ids never win
    unless the whole row is zero.
    """
    rows: dict[str, int] = {}
    check_tensor("probs", probs, ("rows", "V"), torch.float32, rows)
    check_tensor("key.seeds", key.seeds, ("rows",), torch.int64, rows)
    if offsets is not None:
        check_tensor("offsets", offsets, ("rows",), torch.int64, rows)
    n = probs.shape[0]
    pairs = torch.empty(n, EXCHANGE_COLUMNS, dtype=torch.float32, device=probs.device)
    draw = gumbel_pair if probs.is_cuda else gumbel_pair_reference
    draw(torch.log(probs).contiguous(),
         torch.ones(n, dtype=torch.float32, device=probs.device), key.seeds.contiguous(),
         (key.offsets if offsets is None else offsets).contiguous(), stream, 0, pairs, 0)
    return pairs[:, 0].to(torch.int64)


def filtered_probs(
    logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """The distribution sampled from: ``[rows, V] float32`` (one-hot of argmax when ``T == 0``).

    ``logits: [rows, V]`` full rows. Softmax of the kept scores ``z / T``, zero elsewhere.
    """
    if temperature <= 0:
        return one_hot_argmax(logits)
    scores = logits.to(torch.float32) / temperature
    if (top_k <= 0 or top_k >= scores.shape[1]) and top_p >= 1.0:
        return torch.softmax(scores, dim=-1)
    cand, ids = filtered_candidates(scores, top_k, top_p)
    return candidate_probs(cand, ids, scores.shape)


def candidate_probs(cand_scores: torch.Tensor, cand_ids: torch.Tensor,
                    shape: torch.Size) -> torch.Tensor:
    """``softmax(cand_scores)`` scattered to ``cand_ids``: ``[rows, V] float32`` of ``shape``,
    zero for ids that are not candidates (or that a filter set to ``-inf``)."""
    out = torch.zeros(shape, dtype=torch.float32, device=cand_scores.device)
    return out.scatter_(1, cand_ids, torch.softmax(cand_scores, dim=-1))


def one_hot_argmax(logits: torch.Tensor) -> torch.Tensor:
    """``[rows, V] float32`` one-hot of ``torch.argmax`` (order T) of each row."""
    out = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
    return out.scatter_(1, torch.argmax(logits, dim=1, keepdim=True), 1.0)


__all__ = [
    "apply_top_p",
    "candidate_probs",
    "filtered_candidates",
    "filtered_probs",
    "keyed_gumbel",
    "one_hot_argmax",
    "sample_candidates",
    "sample_from_probs",
    "top_p_keep",
]
