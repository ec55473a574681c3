"""Strict (greedy) acceptance of a verified block (spec 3.2, 3.4 ragged lengths, 0.3 order T).

Owns ``strict_accept`` (argmax of the target logits fused with the leading-match count, one
launch) and ``strict_accept_tokens`` (the same count when the target tokens already came from a
vocab-parallel exchange). Imports ``draftsmith.contract`` only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.kernels._order_t import merge_argmax_t, tile_argmax_t

_LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def strict_accept_tokens_reference(
    target_tokens: torch.Tensor, drafts: torch.Tensor, verify_len: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Count the accepted prefix given the target's tokens.

    ``target_tokens: [G, K+1] int64`` (``t``, row ``j`` predicts the token after draft ``j-1``),
    ``drafts: [G, K] int64`` (``e``), ``verify_len: [G] int64`` drafted positions verified
    (``0..K``; ``None`` means ``K``). Returns ``accepted: [G, K+1] int64 = t`` (a copy) and
    ``num_accepted: [G] int64``::

        n_b = 1 + #leading j < K with e_j == t_j and j < verify_len_b

    so ``1 <= n_b <= verify_len_b + 1`` and the bonus token is ``accepted[b, n_b - 1]``.
    """
    k = drafts.shape[1]
    match = drafts == target_tokens[:, :k]
    if verify_len is not None:
        match &= torch.arange(k, device=drafts.device) < verify_len[:, None]
    num_accepted = 1 + match.to(torch.int64).cumprod(dim=1).sum(dim=1)
    return target_tokens.to(torch.int64, copy=True), num_accepted


def strict_accept_reference(
    logits: torch.Tensor, drafts: torch.Tensor, verify_len: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy acceptance from the target logits.

    ``logits: [G, K+1, V]`` float (fp32, bf16 or fp16), ``drafts: [G, K] int64``,
    ``verify_len: [G] int64 | None``. ``t = argmax_T(logits, -1)`` (order T: first NaN, else the
    first maximum, ``-0.0 == +0.0``), then :func:`strict_accept_tokens_reference`. Returns
    ``(accepted [G, K+1] int64, num_accepted [G] int64)``.
    """
    return strict_accept_tokens_reference(torch.argmax(logits, dim=-1), drafts, verify_len)


@triton.jit
def _strict_accept_kernel(
    logits_ptr, tokens_ptr, drafts_ptr, verify_ptr, accepted_ptr, num_ptr,
    K, V,
    FROM_LOGITS: tl.constexpr, HAS_VERIFY: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """One program per request: argmax of its ``K+1`` rows (or a token load), then the count."""
    b = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, BLOCK_R)
    row_ok = rows < K + 1
    if FROM_LOGITS:
        base = logits_ptr + b * (K + 1) * V + rows.to(tl.int64)[:, None] * V
        best_val = tl.full((BLOCK_R,), float("-inf"), tl.float32)
        best_idx = tl.full((BLOCK_R,), 2**62, tl.int64)
        for start in range(0, V, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            valid = row_ok[:, None] & (cols < V)[None, :]
            x = tl.load(base + cols[None, :], mask=valid, other=float("-inf")).to(tl.float32)
            val, idx = tile_argmax_t(x, cols[None, :], valid)
            best_val, best_idx = merge_argmax_t(best_val, best_idx, val, idx)
        target = best_idx
    else:
        target = tl.load(tokens_ptr + b * (K + 1) + rows, mask=row_ok, other=0)
    tl.store(accepted_ptr + b * (K + 1) + rows, target, mask=row_ok)

    is_draft = rows < K
    draft = tl.load(drafts_ptr + b * K + rows, mask=is_draft, other=-1)
    match = is_draft & (draft == target)
    if HAS_VERIFY:
        match = match & (rows < tl.load(verify_ptr + b))
    first_miss = tl.min(tl.where(is_draft & ~match, rows, K), axis=0)
    tl.store(num_ptr + b, (first_miss + 1).to(tl.int64))


def _strict_accept_launch_sizes(rows: int, vocab: int) -> tuple[int, int, int]:
    """``(BLOCK_R, BLOCK_V, num_warps)``: all ``K+1`` rows of a request in one tile of at most
    8192 elements per loop step (wide steps keep many loads in flight when ``G`` is small and a
    few programs must stream the whole vocabulary)."""
    block_r = triton.next_power_of_2(max(rows, 1))
    block_v = max(16, min(triton.next_power_of_2(max(vocab, 1)), max(8192 // block_r, 16)))
    num_warps = 8 if block_r * block_v >= 4096 else 4
    return block_r, block_v, num_warps


def _check_acceptance_inputs(
    name: str, table: torch.Tensor, table_shape: tuple, table_dtypes, drafts: torch.Tensor,
    verify_len: torch.Tensor | None,
) -> dict[str, int]:
    sizes: dict[str, int] = {}
    check_tensor(name, table, table_shape, table_dtypes, sizes, contiguous=True)
    check_tensor("drafts", drafts, ("G", "K"), torch.int64, sizes, table.device, contiguous=True)
    if table.shape[1] != drafts.shape[1] + 1:
        raise ShapeError(
            f"{name} dim 1 must be K+1 = {drafts.shape[1] + 1} for drafts of shape "
            f"{tuple(drafts.shape)}, got shape {tuple(table.shape)}"
        )
    if verify_len is not None:
        check_tensor("verify_len", verify_len, ("G",), torch.int64, sizes, table.device,
                     contiguous=True)
    return sizes


def _launch(logits, tokens, drafts, verify_len, from_logits: bool):
    g, k = drafts.shape
    vocab = int(logits.shape[-1]) if from_logits else 1
    accepted = torch.empty((g, k + 1), dtype=torch.int64, device=drafts.device)
    num_accepted = torch.empty((g,), dtype=torch.int64, device=drafts.device)
    if g == 0:
        return accepted, num_accepted
    block_r, block_v, num_warps = _strict_accept_launch_sizes(k + 1, vocab)
    table = logits if from_logits else tokens
    _strict_accept_kernel[(g,)](
        table, table, drafts, verify_len if verify_len is not None else drafts,
        accepted, num_accepted, k, vocab,
        FROM_LOGITS=from_logits, HAS_VERIFY=verify_len is not None,
        BLOCK_R=block_r, BLOCK_V=block_v, num_warps=num_warps,
    )
    return accepted, num_accepted


def strict_accept(
    logits: torch.Tensor, drafts: torch.Tensor, verify_len: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused :func:`strict_accept_reference` (one launch); bit-identical outputs.

    ``logits: [G, K+1, V]`` contiguous fp32/bf16/fp16, ``drafts: [G, K] int64``,
    ``verify_len: [G] int64 | None``.
    """
    _check_acceptance_inputs("logits", logits, ("G", "K1", "V"), _LOGIT_DTYPES, drafts, verify_len)
    return _launch(logits, None, drafts, verify_len, from_logits=True)


def strict_accept_tokens(
    target_tokens: torch.Tensor, drafts: torch.Tensor, verify_len: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel form of :func:`strict_accept_tokens_reference`; bit-identical outputs.

    ``target_tokens: [G, K+1] int64``, ``drafts: [G, K] int64``, ``verify_len: [G] int64 | None``.
    """
    _check_acceptance_inputs(
        "target_tokens", target_tokens, ("G", "K1"), torch.int64, drafts, verify_len
    )
    return _launch(None, target_tokens, drafts, verify_len, from_logits=False)


__all__ = [
    "strict_accept",
    "strict_accept_reference",
    "strict_accept_tokens",
    "strict_accept_tokens_reference",
]
