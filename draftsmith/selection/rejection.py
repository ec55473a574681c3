"""Lossless rejection sampling of a drafted block.

Owns :func:`rejection_sample` and :func:`residual_distribution`. All randomness comes from the
keyed Philox generator (acceptance uniforms on stream 2, bonus / residual draws on stream 0), so
results are reproducible and graph-replayable; the torch global RNG is never touched.
Imports ``draftsmith.contract`` and ``draftsmith.kernels``.
"""

from __future__ import annotations

import torch

from draftsmith.contract import SamplingKey, ShapeError, check_tensor
from draftsmith.kernels.philox import (
    STREAM_ACCEPT,
    STREAM_TARGET,
    philox_uniform,
    philox_uniform_reference,
)
from draftsmith.selection.sampling import sample_from_probs

RESIDUAL_MIN_MASS = 1e-8
"""A residual with mass ``<= 1e-8`` falls back to the target distribution ``p`` (DeepSpec)."""


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``normalise(max(p - q, 0))`` over the last dim, or ``p`` where that mass is ``<= 1e-8``.

    ``p, q: [..., V] float32`` target and draft distributions. Returns ``[..., V] float32``.
    """
    if check_tensor("p", p).dim() == 0:
        raise ShapeError("p must have a last (vocabulary) dim [..., V], got a scalar")
    check_tensor("q", q, tuple(p.shape))
    r = (p.to(torch.float32) - q.to(torch.float32)).clamp_min(0.0)
    mass = r.sum(dim=-1, keepdim=True)
    return torch.where(mass > RESIDUAL_MIN_MASS, r / mass.clamp_min(RESIDUAL_MIN_MASS),
                       p.to(torch.float32))


def acceptance_uniforms(key: SamplingKey, k: int) -> torch.Tensor:
    """``u[b, j]`` for draft ``j`` of request ``b``: stream 2, token id 0, offset ``offsets[b] + j``.

    Returns ``[G, K] float32`` in ``[2**-24, 1 - 2**-24]``; one kernel on a GPU (the same bits
    as the torch reference it runs elsewhere).
    """
    off = key.offsets[:, None] + torch.arange(k, device=key.offsets.device)
    ids = torch.zeros(k, dtype=torch.int64, device=off.device)
    draw = philox_uniform if off.is_cuda else philox_uniform_reference
    return draw(key.seeds, off, ids, STREAM_ACCEPT)


def rejection_sample(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    key: SamplingKey,
    verify_len: torch.Tensor | None = None,
    *,
    check_values: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept a prefix of the drafts and draw the bonus token, losslessly.

    ``draft_tokens: [G, K] int64`` (``e_j``), ``draft_probs: [G, K, V] float32`` (``q_j``, the
    distribution ``e_j`` was sampled from), ``target_probs: [G, K+1, V] float32`` (``p_j``),
    ``key``: per-request seeds and ``offsets`` = position of row 0, ``verify_len: [G] int64``
    drafted positions verified (``None``: all ``K``). Returns ``accepted: [G, K+1] int64``
    (``-1`` after the bonus) and ``num_accepted: [G] int64`` (``n = a + 1``)::

        accept e_j  iff  u_j * q_j(e_j) < p_j(e_j)       fp32, u_j on stream 2 at offset + j
        a      = leading accepted count (positions j >= verify_len_b count as rejections)
        bonus  = sample(p_a)                              if a == verify_len_b (nothing rejected)
               = sample(residual(p_a, q_a))               otherwise
        bonus drawn on stream 0 at offset + a

    ``check_values`` reads the ids and ``verify_len`` back to range-check them (one host sync,
    skipped during CUDA-graph capture); the runtime passes ``False`` for drafts its own selector
    produced, keeping its one read per step.
    """
    sizes: dict[str, int] = {}
    check_tensor("draft_tokens", draft_tokens, ("G", "K"), torch.int64, sizes)
    check_tensor("draft_probs", draft_probs, ("G", "K", "V"), torch.float32, sizes)
    g, k = draft_tokens.shape
    check_tensor("target_probs", target_probs, ("G", k + 1, "V"), torch.float32, sizes)
    check_tensor("key.seeds", key.seeds, ("G",), torch.int64, sizes)
    device = draft_tokens.device
    v = sizes["V"]
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if verify_len is not None:
        check_tensor("verify_len", verify_len, ("G",), torch.int64, sizes)
    if check_values and not capturing:  # one host sync; graph capture cannot read back
        bad_ids = ((draft_tokens < 0) | (draft_tokens >= v)).any()
        bad_len = (bad_ids.new_zeros(()) if verify_len is None
                   else ((verify_len < 0) | (verify_len > k)).any())
        ids_wrong, len_wrong = torch.stack((bad_ids, bad_len)).tolist()
        if ids_wrong:
            raise ShapeError(f"draft_tokens must be token ids in 0..V-1 = 0..{v - 1} "
                             f"(V = draft_probs.shape[-1])")
        if len_wrong:
            raise ShapeError(f"verify_len must lie in 0..K = 0..{k}")
    limit = (torch.full((g,), k, dtype=torch.int64, device=device) if verify_len is None
             else verify_len.to(torch.int64))
    j = torch.arange(k, device=device)
    if k > 0:
        idx = draft_tokens[..., None]
        q = draft_probs.gather(-1, idx)[..., 0]
        p = target_probs[:, :k].gather(-1, idx)[..., 0]
        ok = (acceptance_uniforms(key, k) * q < p) & (j < limit[:, None])
        a = ok.to(torch.int64).cumprod(dim=1).sum(dim=1)
    else:
        a = torch.zeros(g, dtype=torch.int64, device=device)
    rows = torch.arange(g, device=device)
    p_a = target_probs[rows, a]
    if k > 0:
        q_a = draft_probs[rows, a.clamp_max(k - 1)]
        dist = torch.where((a < limit)[:, None], residual_distribution(p_a, q_a), p_a)
    else:
        dist = p_a
    bonus = sample_from_probs(dist, key, STREAM_TARGET, offsets=key.offsets + a)
    accepted = torch.full((g, k + 1), -1, dtype=torch.int64, device=device)
    accepted[:, :k] = torch.where(j < a[:, None], draft_tokens, -1)
    accepted[rows, a] = bonus
    return accepted, a + 1


__all__ = [
    "RESIDUAL_MIN_MASS",
    "acceptance_uniforms",
    "rejection_sample",
    "residual_distribution",
]
