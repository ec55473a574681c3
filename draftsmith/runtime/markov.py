"""The draft-selection chain: block logits -> drafts (+ the distributions they came from).

Owns :class:`DraftChain`. With a DSpark Markov head it runs the Markov chain over
:class:`MarkovHeadWeights` (fp32 base, bias rounded to the weight dtype, fp32 sum), feeding the
**selected** token forward (greedy argmax, or the sampled token) through the
configured selector, on the full vocabulary or this rank's shard (the selector exchanges pairs).
Without a head every slot is selected independently. ``q_j`` (``selector.probs`` of the corrected
logits) is written for rejection sampling when asked. Hot path: must not import pluggy.
"""

from __future__ import annotations

from typing import Literal

import torch

from draftsmith.contract import (
    Collectives,
    LogitsShard,
    MarkovHeadKind,
    MarkovHeadWeights,
    SamplingKey,
    ShapeError,
    TokenSelector,
    check_tensor,
    selector_extras,
)
from draftsmith.kernels.markov_chain import markov_bias_reference, markov_chain
from draftsmith.kernels.philox import STREAM_DRAFT

DRAFT_STREAM = STREAM_DRAFT
"""Counter stream of draft samples (the Philox stream draws for drafts come from)."""

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _prev_rows(w1: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """``w1[prev]`` with zero rows for out-of-vocabulary ids: ``[G, r]``."""
    ok = (prev >= 0) & (prev < w1.shape[0])
    rows = w1[prev.clamp(0, w1.shape[0] - 1)]
    return rows * ok[:, None].to(rows.dtype)


def markov_bias(
    weights: MarkovHeadWeights, prev: torch.Tensor, hidden: torch.Tensor | None,
    state: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Bias of one slot ``[G, S]`` in the weight dtype, and the next RNN state.

    ``prev: [G] int64``; ``hidden: [G, H]`` (gated / RNN heads); ``state: [G, r]`` (RNN).
    """
    if weights.kind is MarkovHeadKind.VANILLA:
        return markov_bias_reference(weights.w1, weights.w2, prev), None
    if hidden is None:
        raise ShapeError(f"a {weights.kind.value} Markov head needs the slot hidden states")
    e = _prev_rows(weights.w1, prev)
    h = hidden.to(e.dtype)
    if weights.kind is MarkovHeadKind.GATED:
        assert weights.gate_weight is not None and weights.gate_bias is not None
        g = torch.sigmoid(torch.cat([h, e], -1) @ weights.gate_weight.T + weights.gate_bias)
        return (g * e) @ weights.w2.T, None
    assert weights.joint_weight is not None and weights.joint_bias is not None
    s = state if state is not None else e.new_zeros(e.shape)
    gr, cr, orr = (torch.cat([s, e, h], -1) @ weights.joint_weight.T + weights.joint_bias).chunk(3, -1)
    gate = torch.sigmoid(gr)
    new_state = gate * s + (1 - gate) * torch.tanh(cr)
    return torch.tanh(orr) @ weights.w2.T, new_state


class DraftChain:
    """Selects ``K`` drafts per request from the block logits ``U: [G, K, S]``.

    ``mode`` is the plan's ``markov`` decision: ``none`` (no head: independent slots),
    ``eager`` (torch bias + selector) or ``fused`` (greedy vanilla chain through
    ``markov_chain``: every position in one launch where it can, on one rank). ``pdl``: the
    fused chain's launches are programmatically dependent (the plan's ``round_pdl``).
    """

    def __init__(
        self,
        weights: MarkovHeadWeights | None,
        selector: TokenSelector,
        collectives: Collectives,
        *,
        mode: Literal["none", "eager", "fused"],
        vocab_size: int,
        pdl: bool = False,
    ) -> None:
        if (weights is None) != (mode == "none"):
            raise ShapeError(f"markov mode {mode!r} does not match weights {weights is not None}")
        if weights is not None and weights.vocab_size != vocab_size:
            raise ShapeError(
                f"Markov w1 covers {weights.vocab_size} ids, the vocabulary has {vocab_size}"
            )
        self.weights = weights
        self.selector = selector
        self._draw_with_probs = selector_extras(selector).select_with_probs
        self.collectives = collectives
        self.mode = mode
        self.vocab_size = vocab_size
        self.pdl = pdl

    def _key(self, key: SamplingKey | None, j: int) -> SamplingKey | None:
        if key is None:
            return None
        return SamplingKey(seeds=key.seeds, offsets=key.offsets + j)

    def _select_with_probs(self, shard: LogitsShard,
                           key: SamplingKey | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft tokens ``[rows] int64`` and ``q`` ``[rows, V] fp32`` they were drawn from;
        one filtering pass when the strategy offers ``select_with_probs`` (the built-in ones
        do), else its ``select`` and ``probs``."""
        return self._draw_with_probs(shard, key, DRAFT_STREAM, self.collectives)

    def _check_inputs(
        self, base: torch.Tensor, vocab_start: int, anchor: torch.Tensor,
        hidden: torch.Tensor | None, probs_out: torch.Tensor | None,
    ) -> None:
        """Shapes and dtypes only (no device sync): :class:`ShapeError` naming the tensor."""
        sizes: dict[str, int] = {}
        if self.weights is not None:
            sizes["S"] = self.weights.shard_width
            if vocab_start != self.weights.vocab_start:
                raise ShapeError(
                    f"base logits start at vocab id {vocab_start}, the Markov w2 rows at "
                    f"{self.weights.vocab_start}; pass this rank's shard of both"
                )
        check_tensor("base", base, ("G", "K", "S"), _FLOATS, sizes)
        check_tensor("anchor", anchor, ("G",), torch.int64, sizes)
        if hidden is not None:
            check_tensor("hidden", hidden, ("G", "K", None), _FLOATS, sizes)
        if probs_out is not None:
            check_tensor("probs_out", probs_out, ("G", "K", self.vocab_size), torch.float32, sizes)

    def run(
        self,
        base: torch.Tensor,
        vocab_start: int,
        anchor: torch.Tensor,
        key: SamplingKey | None,
        *,
        hidden: torch.Tensor | None = None,
        probs_out: torch.Tensor | None = None,
        want_corrected: bool = True,
        tokens_out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Drafts ``[G, K] int64`` and the logits they were selected from ``[G, K, S]``.

        ``base: [G, K, S]`` block logits of this rank's shard starting at ``vocab_start``;
        ``anchor: [G] int64`` (the bonus, Markov ``prev`` of slot 0); ``key``: seeds and the
        position of draft 0 (draft ``j`` samples at offset ``+ j``, stream 1); ``hidden: [G, K, H]``
        for gated / RNN heads; ``probs_out: [G, K, V] fp32`` receives ``q_j`` when given.
        ``K == 0`` returns ``base`` itself and an empty ``[G, 0]`` draft tensor. With
        ``want_corrected`` false a fused chain skips storing the corrected logits and returns
        ``None`` for them (the other paths compute them anyway and return them).
        ``tokens_out: [G, K + 1] int64`` receives the anchor then the drafts (a verification's
        tokens; the fused chain writes them there itself) and the drafts returned are its view
        ``tokens_out[:, 1:]``.
        """
        self._check_inputs(base, vocab_start, anchor, hidden, probs_out)
        g, k, s = base.shape
        if tokens_out is not None:
            check_tensor("tokens_out", tokens_out, (g, k + 1), torch.int64, None, base.device,
                         distinct_rows=True)
        if self.mode == "fused" and self.collectives.world_size == 1 and k:
            store = want_corrected or probs_out is not None
            drafts, corrected = markov_chain(base, anchor, self.weights.w1, self.weights.w2,
                                             store_corrected=store, pdl=self.pdl,
                                             tokens_out=tokens_out)
            if probs_out is not None:  # greedy: the one-hot of each corrected row's argmax
                shard = LogitsShard(corrected.view(g * k, s), vocab_start, self.vocab_size)
                probs_out.copy_(self.selector.probs(shard, self.collectives).view(g, k, -1))
            return drafts, corrected
        drafts, corrected = self._run(base, vocab_start, anchor, key, hidden, probs_out)
        if tokens_out is None:
            return drafts, corrected
        torch.cat((anchor[:, None], drafts), dim=1, out=tokens_out)  # one launch, as before
        return tokens_out[:, 1:], corrected

    def _run(self, base: torch.Tensor, vocab_start: int, anchor: torch.Tensor,
             key: SamplingKey | None, hidden: torch.Tensor | None,
             probs_out: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The chains other than the fused one (see :meth:`run`)."""
        g, k, s = base.shape
        if k == 0:
            return torch.empty(g, 0, dtype=torch.int64, device=base.device), base
        if self.weights is None:
            flat = LogitsShard(base.reshape(g * k, s), vocab_start, self.vocab_size)
            rows_key = None
            if key is not None:
                j = torch.arange(k, device=base.device)
                rows_key = SamplingKey(
                    seeds=key.seeds.repeat_interleave(k),
                    offsets=(key.offsets[:, None] + j).reshape(-1),
                )
            if probs_out is None:
                drafts = self.selector.select(flat, rows_key, DRAFT_STREAM, self.collectives)
            else:
                drafts, probs = self._select_with_probs(flat, rows_key)
                probs_out.copy_(probs.view(g, k, -1))
            return drafts.view(g, k), base
        corrected = torch.empty(g, k, s, dtype=torch.float32, device=base.device)
        prev, state, tokens = anchor, None, []
        for j in range(k):
            z = corrected[:, j]
            shard = LogitsShard(z, vocab_start, self.vocab_size)
            h = hidden[:, j] if hidden is not None else None
            bias, state = markov_bias(self.weights, prev, h, state)
            torch.add(base[:, j].float(), bias.float(), out=z)
            if probs_out is None:
                token = self.selector.select(shard, self._key(key, j), DRAFT_STREAM,
                                             self.collectives)
            else:
                token, probs_out[:, j] = self._select_with_probs(shard, self._key(key, j))
            tokens.append(token)
            prev = token
        return torch.stack(tokens, dim=1), corrected


__all__ = ["DRAFT_STREAM", "DraftChain", "markov_bias"]
