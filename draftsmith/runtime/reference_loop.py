"""The golden-path decoding loop: one request, plain functions, no tricks.

``reference_generate`` runs prefill, then rounds of :func:`draft` / :func:`verify` /
:func:`accept` / :func:`emit`, keeping the drafter context in a one-page pool written with plain
indexing. It uses the same selector (hence the same keyed draws) as the batched decoder, so the
composed runtime must emit exactly its tokens (a test says so). It shares no code with the paging,
chain or acceptance components beyond the drafter, the target and the selector.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from draftsmith.contract import (
    Collectives,
    DraftBlockInputs,
    DraftBlockPlacement,
    Drafter,
    LogitsShard,
    MarkovHeadKind,
    PagedContextCache,
    SamplingKey,
    ShapeError,
    SingleRank,
    TargetModel,
    TokenSelector,
)
from draftsmith.selection.rejection import rejection_sample

_I64 = torch.int64


@dataclass
class ReferenceResult:
    """Generated ids and per-round accepted lengths (bonus included, stop rule applied)."""

    tokens: list[int]
    accepted_lengths: list[int]


def _key(selector: TokenSelector, seed: int, position: int) -> SamplingKey | None:
    if selector.capabilities.greedy:
        return None
    return SamplingKey(seeds=torch.tensor([seed], dtype=_I64),
                       offsets=torch.tensor([position], dtype=_I64))


def _pick(selector: TokenSelector, row: torch.Tensor, seed: int, position: int, stream: int,
          collectives: Collectives) -> int:
    """Select one token from a full-vocabulary row ``[V]``."""
    shard = LogitsShard.full(row[None].float())
    return int(selector.select(shard, _key(selector, seed, position), stream, collectives)[0])


@dataclass
class DrafterContext:
    """One request's drafter context: a single page holding every column."""

    cache: PagedContextCache
    length: int = 0

    @staticmethod
    def empty(drafter: Drafter, max_len: int, dtype: torch.dtype, device: torch.device
              ) -> DrafterContext:
        spec = drafter.capabilities.context_entry
        pool = torch.zeros(spec.num_layers, 1, spec.planes, spec.heads, max_len, spec.width,
                           dtype=dtype, device=device)
        return DrafterContext(PagedContextCache(pool=pool, page_size=max_len))

    def append(self, drafter: Drafter, features: torch.Tensor) -> None:
        """Project ``features: [T, n_cap * H_t]`` at the next ``T`` positions and store them."""
        t = int(features.shape[0])
        positions = torch.arange(self.length, self.length + t, dtype=_I64, device=features.device)
        entries = drafter.project_context(features, positions)  # [T, L, planes, heads, width]
        for i in range(t):
            self.cache.pool[:, 0, :, :, self.length + i] = entries[i]
        self.length += t


def draft(
    drafter: Drafter, ctx: DrafterContext, anchor: int, num_drafts: int, selector: TokenSelector,
    target_embedding: torch.Tensor, head, seed: int, collectives: Collectives,
) -> tuple[list[int], list[torch.Tensor]]:
    """Run the block at positions ``start .. start + W - 1`` and select ``K`` drafts.

    Returns the drafts and, per draft, the distribution it was selected from (``q_j``, ``[V]``).
    """
    caps = drafter.capabilities
    k, start = num_drafts, ctx.length
    w, first = caps.block_width(k), caps.first_draft_slot
    dev = ctx.cache.pool.device
    ids = torch.full((1, w), caps.mask_token_id, dtype=_I64, device=dev)
    ids[0, 0] = anchor
    positions = torch.arange(start, start + w, dtype=_I64, device=dev)[None]
    cols = torch.arange(start, start + k + 1, dtype=_I64, device=dev)[None]
    placement = DraftBlockPlacement(
        slots=torch.zeros(1, dtype=_I64, device=dev), cache_rows=torch.zeros(1, dtype=_I64, device=dev),
        rows_start=None, bonus=torch.tensor([anchor], device=dev), query_positions=positions,
        ctx_positions=cols, write_mask=torch.zeros_like(cols, dtype=torch.bool), dest_cols=cols,
        dest_pages=torch.zeros_like(cols), dest_offsets=cols.clone(),
        num_ctx=torch.tensor([start], device=dev), new_ctx_len=torch.tensor([start], device=dev),
        block_tables=torch.zeros(1, 1, dtype=_I64, device=dev), page_size=ctx.cache.page_size,
    )
    emb = drafter.embed_block(ids, target_embedding)
    hidden = drafter.forward_block(DraftBlockInputs(ids, positions, emb), placement, ctx.cache)
    logits = drafter.block_logits(hidden[0, first : first + k], head).logits  # [K, V]
    markov = drafter.markov_head()
    if markov is not None and markov.kind is not MarkovHeadKind.VANILLA:
        raise ShapeError("the reference loop runs vanilla Markov heads only")
    drafts: list[int] = []
    probs: list[torch.Tensor] = []
    prev = anchor
    for j in range(k):
        z = logits[j].float()
        if markov is not None:
            e = markov.w1[prev] if 0 <= prev < markov.vocab_size else torch.zeros_like(markov.w1[0])
            z = z + (e[None] @ markov.w2.T)[0].float()  # bias rounded to the weight dtype
        token = _pick(selector, z, seed, start + 1 + j, 1, collectives)
        probs.append(selector.probs(LogitsShard.full(z[None]), collectives)[0])
        drafts.append(token)
        prev = token
    return drafts, probs


def verify(target: TargetModel, slot: int, anchor: int, drafts: list[int]
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Target rows for ``[anchor, e_0 .. e_{K-1}]``: logits ``[K+1, V]`` and features."""
    out = target.verify([slot], torch.tensor([[anchor, *drafts]], dtype=_I64))
    return out.logits.logits, out.features


def accept(
    selector: TokenSelector, logits: torch.Tensor, drafts: list[int], q: list[torch.Tensor],
    start: int, seed: int, rejection: bool, collectives: Collectives,
) -> list[int]:
    """Committed tokens of the round: accepted drafts then the bonus."""
    k = len(drafts)
    if rejection and k:
        p = selector.probs(LogitsShard.full(logits.float()), collectives)[None]  # [1, K+1, V]
        key = SamplingKey(seeds=torch.tensor([seed], dtype=_I64),
                          offsets=torch.tensor([start + 1], dtype=_I64))
        accepted, n = rejection_sample(torch.tensor([drafts], dtype=_I64),
                                       torch.stack(q)[None], p, key, None)
        return accepted[0, : int(n[0])].tolist()
    committed = []
    for j in range(k + 1):
        t = _pick(selector, logits[j], seed, start + 1 + j, 0, collectives)
        committed.append(t)
        if j == k or drafts[j] != t:
            break
    return committed


def emit(tokens: list[int], committed: list[int], max_new: int, stops: frozenset[int]
         ) -> tuple[int, bool]:
    """Append under the budget and stop rules; return (kept, finished)."""
    kept = committed[: max_new - len(tokens)]
    for i, tok in enumerate(kept):
        if tok in stops:
            tokens.extend(kept[: i + 1])
            return i + 1, True
    tokens.extend(kept)
    return len(kept), len(tokens) >= max_new


def reference_generate(
    target: TargetModel,
    drafter: Drafter | None,
    selector: TokenSelector,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    num_draft_tokens: int,
    rejection: bool = False,
    stop_token_ids: Sequence[int] = (),
    seed: int = 0,
    slot: int = 0,
    collectives: Collectives | None = None,
) -> ReferenceResult:
    """Decode one request speculatively, the plain way."""
    coll = collectives if collectives is not None else SingleRank()
    stops = frozenset(stop_token_ids)
    k = num_draft_tokens if drafter is not None else 0
    if drafter is not None:
        target.set_capture_layers(drafter.capabilities.target_layer_ids)
    out = target.prefill([slot], [torch.tensor(list(prompt), dtype=_I64)])
    p = len(prompt)
    tokens: list[int] = []
    anchor = _pick(selector, out.logits.logits[-1], seed, p, 0, coll)
    _, done = emit(tokens, [anchor], max_new_tokens, stops)
    lengths: list[int] = []
    ctx = None
    if k:
        assert drafter is not None
        emb = target.input_embedding()
        ctx = DrafterContext.empty(drafter, p + max_new_tokens + 2 * (k + 2),
                                   getattr(torch, drafter.capabilities.dtype), emb.device)
        ctx.append(drafter, out.features)
    start = p
    while not done:
        if k:
            assert drafter is not None and ctx is not None
            drafts, q = draft(drafter, ctx, anchor, k, selector, target.input_embedding(),
                              target.output_head(), seed, coll)
        else:
            drafts, q = [], []
        logits, feats = verify(target, slot, anchor, drafts)
        committed = accept(selector, logits, drafts, q, start, seed, rejection, coll)
        n = len(committed)
        target.commit([slot], [start + n])
        if ctx is not None:
            ctx.append(drafter, feats[:n])  # type: ignore[arg-type]
        kept, done = emit(tokens, committed, max_new_tokens, stops)
        lengths.append(kept)
        start += n
        anchor = committed[-1]
    target.release([slot])
    return ReferenceResult(tokens, lengths)


__all__ = ["DrafterContext", "ReferenceResult", "accept", "draft", "emit", "reference_generate",
           "verify"]
