"""Verification of drafts against the target: strict, rejection sampling, forced.

Owns :class:`Acceptance`. Strict acceptance matches drafts against one target token per row (the
argmax, or a keyed sample on stream 0); rejection sampling is delegated to the selection layer's
``rejection_sample``; forced counts (benchmarks) override ``n`` afterwards and the ragged cap
``n <= verify_len + 1`` is always applied last. Hot path: must not import pluggy.
"""

from __future__ import annotations

from typing import Literal

import torch

from draftsmith.contract import Collectives, LogitsShard, SamplingKey, ShapeError, TokenSelector
from draftsmith.kernels.forced_accept import (
    forced_accept,
    forced_accept_pool,
    forced_accept_reference,
)
from draftsmith.kernels.strict_accept import (
    strict_accept,
    strict_accept_reference,
    strict_accept_tokens,
    strict_accept_tokens_reference,
)
from draftsmith.selection.rejection import rejection_sample

TARGET_STREAM = 0
"""Counter stream of target samples and the bonus (drafts use another, so the two
never draw the same noise)."""


def row_key(key: SamplingKey, rows_per_request: int) -> SamplingKey:
    """Per-row key for ``rows_per_request`` consecutive positions after each request's anchor.

    ``key.offsets`` hold the anchor positions; row ``j`` of request ``b`` samples position
    ``offsets[b] + 1 + j``.
    """
    j = torch.arange(1, rows_per_request + 1, device=key.offsets.device)
    return SamplingKey(
        seeds=key.seeds.repeat_interleave(rows_per_request),
        offsets=(key.offsets[:, None] + j).reshape(-1),
    )


class Acceptance:
    """Turns target logits and drafts into ``(accepted [G, K+1], n [G])`` per the plan."""

    def __init__(
        self,
        *,
        rule: Literal["strict", "rejection"],
        force_accepted: float,
        num_draft_tokens: int,
        selector: TokenSelector,
        collectives: Collectives,
        fused: bool,
        device: torch.device | str = "cpu",
    ) -> None:
        self.rule = rule
        self.force_accepted = force_accepted
        self.k = num_draft_tokens
        self.selector = selector
        self.greedy = selector.capabilities.greedy
        self.collectives = collectives
        self.fused = fused
        # the forced-acceptance pool and counter are persistent device state (graph-safe)
        self.forced_pool = forced_accept_pool(device) if force_accepted > 0 else None
        self.forced_counter = torch.zeros(1, dtype=torch.int64, device=device)

    def target_tokens(self, logits: LogitsShard, key: SamplingKey | None, rows: int) -> torch.Tensor:
        """One target token per row (``[G*rows] int64``): argmax, or a keyed stream-0 sample."""
        rkey = row_key(key, rows) if key is not None and not self.greedy else None
        return self.selector.select(logits, rkey, TARGET_STREAM, self.collectives)

    def accept(
        self,
        logits: LogitsShard,
        drafts: torch.Tensor,
        key: SamplingKey | None,
        *,
        draft_probs: torch.Tensor | None = None,
        verify_len: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
        warmup: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Accepted tokens ``[G, K+1] int64`` and counts ``n: [G] int64`` (bonus included).

        ``logits``: the target's ``[G*(K+1), S]`` verify rows, or with ``rows: [T] int64`` only
        those rows (indices ``b * (K+1) + j``; a packed verify, which must hold every row's
        bonus and verified drafts); ``drafts: [G, K] int64``;
        ``key``: seeds and anchor positions ``[G]`` (``None`` for greedy);
        ``draft_probs: [G, K, V] fp32`` (rejection); ``verify_len: [G] int64`` drafted positions
        verified (``None``: all ``K``). Tokens past ``n`` carry no meaning.
        """
        g, k = drafts.shape
        want = g * (k + 1) if rows is None else rows.shape[0]
        if logits.logits.shape[0] != want:
            raise ShapeError(f"target logits have {logits.logits.shape[0]} rows, expected "
                             + (f"G*(K+1) = {want}" if rows is None else f"{want} (rows)"))
        if k == 0:
            tokens = self.target_tokens(logits, key, 1).view(g, 1)
            return tokens, torch.ones(g, dtype=torch.int64, device=tokens.device)
        if rows is not None:
            accepted, n = self._accept_rows(logits, rows, drafts, key, draft_probs, verify_len)
        elif self.rule == "rejection":
            accepted, n = self._rejection(logits, drafts, key, draft_probs, verify_len)
        elif self.greedy and logits.is_full:
            fn = strict_accept if self.fused else strict_accept_reference
            accepted, n = fn(logits.logits.view(g, k + 1, -1).contiguous(), drafts, verify_len)
        else:
            tokens = self.target_tokens(logits, key, k + 1).view(g, k + 1)
            fn = strict_accept_tokens if self.fused else strict_accept_tokens_reference
            accepted, n = fn(tokens.contiguous(), drafts, verify_len)
        if self.force_accepted > 0 and not warmup:
            assert self.forced_pool is not None
            if self.rule == "rejection":
                accepted[:, 1:] = drafts  # an inflated n then commits real tokens
            fn = forced_accept if self.fused else forced_accept_reference
            n = fn(n.contiguous(), verify_len, self.forced_pool, self.forced_counter,
                   self.force_accepted, k)
        return accepted, n

    def _accept_rows(self, logits: LogitsShard, rows: torch.Tensor, drafts: torch.Tensor,
                     key: SamplingKey | None, draft_probs: torch.Tensor | None,
                     verify_len: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`accept` from a packed verify's ``[T, S]`` logits: the target tokens (or, for
        rejection, the target probabilities) of the ``T`` rows are scattered into the
        ``[G, K+1]`` block, the rest zero (token 0, probability 0), which acceptance never reads
        past ``verify_len``."""
        g, k = drafts.shape
        k1 = k + 1
        if self.rule == "rejection":
            probs = self.selector.probs(logits, self.collectives)
            full = probs.new_zeros(g * k1, probs.shape[-1]).index_copy_(0, rows, probs)
            return self._rejection(None, drafts, key, draft_probs, verify_len,
                                   target_probs=full.view(g, k1, -1))
        rkey = None
        if key is not None and not self.greedy:
            block = row_key(key, k1)
            rkey = SamplingKey(seeds=block.seeds[rows], offsets=block.offsets[rows])
        picked = self.selector.select(logits, rkey, TARGET_STREAM, self.collectives)
        tokens = picked.new_zeros(g * k1).index_copy_(0, rows, picked).view(g, k1)
        fn = strict_accept_tokens if self.fused else strict_accept_tokens_reference
        return fn(tokens, drafts, verify_len)

    def _rejection(self, logits, drafts, key, draft_probs, verify_len, target_probs=None):
        if draft_probs is None or key is None:
            raise ShapeError("rejection sampling needs draft_probs [G, K, V] and a sampling key")
        g, k = drafts.shape
        if target_probs is None:
            target_probs = self.selector.probs(logits, self.collectives).view(g, k + 1, -1)
        # row 0 samples the position after the anchor: offsets are that position
        row0 = SamplingKey(seeds=key.seeds, offsets=key.offsets + 1)
        # the drafts come from this runtime's selector (ids in range): no value read-back
        return rejection_sample(drafts, draft_probs, target_probs, row0, verify_len,
                                check_values=False)


__all__ = ["TARGET_STREAM", "Acceptance", "row_key"]
