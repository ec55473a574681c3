"""Small test doubles for the runtime tests: a tiny GQA-style drafter implementing the Drafter
Protocol (with an optional vanilla Markov head that can carry a bigram table)."""

from __future__ import annotations

from pathlib import Path

import torch
from _threads import run_threaded

from draftsmith.contract import (
    BlockConvention,
    ContextCacheKind,
    ContextEntrySpec,
    DraftBlockInputs,
    DraftBlockPlacement,
    DrafterCapabilities,
    LogitsShard,
    MarkovHeadKind,
    MarkovHeadWeights,
    OutputHead,
    PagedContextCache,
    TargetOutput,
)
from draftsmith.drafters.nn import gather_context, rms_norm


class TinyDrafter:
    """One attention layer over paged context entries ``[L=1, planes=2, heads=1, H]``."""

    def __init__(self, vocab_size: int, target_hidden: int, layer_ids: tuple[int, ...],
                 convention: BlockConvention = BlockConvention.SHIFT, markov_rank: int = 0,
                 bigram: torch.Tensor | None = None, bigram_scale: float = 8.0, seed: int = 0,
                 trained_block_size: int = 16, family: str = "tiny") -> None:
        g = torch.Generator().manual_seed(seed)
        h, f = target_hidden, target_hidden * len(layer_ids)
        self.fc = torch.randn(h, f, generator=g) / f**0.5
        self.wq = torch.randn(h, h, generator=g) / h**0.5
        self.wk = torch.randn(h, h, generator=g) / h**0.5
        self.wv = torch.randn(h, h, generator=g) / h**0.5
        self.markov = None
        if bigram is not None:
            w1 = torch.eye(vocab_size)
            w2 = bigram_scale * torch.nn.functional.one_hot(bigram, vocab_size).float().T
            self.markov = MarkovHeadWeights(MarkovHeadKind.VANILLA, w1.contiguous(),
                                            w2.contiguous())
            markov_rank = vocab_size
        elif markov_rank:
            self.markov = MarkovHeadWeights(
                MarkovHeadKind.VANILLA, torch.randn(vocab_size, markov_rank, generator=g),
                torch.randn(vocab_size, markov_rank, generator=g))
        self._caps = DrafterCapabilities(
            family=family, block_convention=convention, trained_block_size=trained_block_size,
            hidden_size=h, vocab_size=vocab_size, mask_token_id=vocab_size - 1,
            target_layer_ids=layer_ids, target_hidden_size=h,
            markov_head=MarkovHeadKind.VANILLA if self.markov is not None else MarkovHeadKind.NONE,
            markov_rank=markov_rank if self.markov is not None else 0,
            context_entry=ContextEntrySpec(kind=ContextCacheKind.PAGED_GQA_KV, num_layers=1,
                                           planes=2, heads=1, width=h),
        )

    @property
    def capabilities(self) -> DrafterCapabilities:
        return self._caps

    def project_context(self, features: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        ctx = rms_norm(features @ self.fc.T, torch.ones(self.fc.shape[0]), 1e-6)
        k = (ctx @ self.wk.T) * torch.cos(positions.float() * 0.05)[:, None]
        v = ctx @ self.wv.T
        return torch.stack([k, v], dim=1)[:, None, :, None, :]  # [T, 1, 2, 1, H]

    def embed_block(self, token_ids: torch.Tensor, target_embedding: torch.Tensor | None
                    ) -> torch.Tensor:
        assert target_embedding is not None
        return target_embedding[token_ids]

    def forward_block(self, inputs: DraftBlockInputs, placement: DraftBlockPlacement,
                      cache: PagedContextCache) -> torch.Tensor:
        x = inputs.embeddings
        assert x is not None
        entries, valid = gather_context(cache, placement, 0)  # [G, C, 2, 1, H]
        q = x @ self.wq.T  # [G, W, H]
        kb = (x @ self.wk.T) * torch.cos(inputs.positions.float() * 0.05)[..., None]
        vb = x @ self.wv.T
        keys = torch.cat([entries[:, :, 0, 0], kb], dim=1)
        vals = torch.cat([entries[:, :, 1, 0], vb], dim=1)
        mask = torch.cat([valid, torch.ones(kb.shape[:2], dtype=torch.bool)], dim=1)
        scores = torch.einsum("gwh,gch->gwc", q, keys) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(~mask[:, None, :], float("-inf"))
        out = torch.einsum("gwc,gch->gwh", scores.softmax(-1), vals)
        return rms_norm(x + out, torch.ones(x.shape[-1]), 1e-6)

    def block_logits(self, hidden: torch.Tensor, head: OutputHead) -> LogitsShard:
        return LogitsShard(hidden @ head.weight.T, head.vocab_start, head.vocab_size)

    def markov_head(self) -> MarkovHeadWeights | None:
        return self.markov

    def confidence(self, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        return torch.zeros(prev_tokens.shape, dtype=torch.float32)

    def save(self, directory: Path) -> None:
        raise NotImplementedError("test double")


def target_bigram(target, vocab_size: int) -> torch.Tensor:
    """The target's greedy next token after each single token: ``[V] int64``."""
    out = [int(target.next_token_probs([v]).argmax()) for v in range(vocab_size)]
    return torch.tensor(out)
def run_ranks(tp: int, fn):
    """Run ``fn(collectives)`` on ``tp`` threads (one per rank); per-rank results in order."""
    return run_threaded(tp, fn)




class ShardedTarget:
    """A :class:`ToyTarget` seen by one rank of a column-parallel head: logits and head rows of
    this rank's vocabulary shard only."""

    def __init__(self, base, rank: int, tp: int) -> None:
        self.base = base
        self.shard = base.vocab_size // tp
        self.lo = rank * self.shard

    vocab_size = property(lambda self: self.base.vocab_size)
    hidden_size = property(lambda self: self.base.hidden_size)
    num_layers = property(lambda self: self.base.num_layers)
    graph_blocker = property(lambda self: self.base.graph_blocker)
    gemm = property(lambda self: self.base.gemm)
    cache_version = property(lambda self: self.base.cache_version)

    def input_embedding(self) -> torch.Tensor:
        return self.base.input_embedding()

    def output_head(self) -> OutputHead:
        rows = self.base.output_head().weight[self.lo : self.lo + self.shard].contiguous()
        return OutputHead(rows, self.lo, self.vocab_size)

    def set_capture_layers(self, layer_ids) -> None:
        self.base.set_capture_layers(layer_ids)

    def _cut(self, out: TargetOutput) -> TargetOutput:
        logits = out.logits.logits[:, self.lo : self.lo + self.shard].contiguous()
        return TargetOutput(LogitsShard(logits, self.lo, self.vocab_size), out.features)

    def prefill(self, slots, prompts) -> TargetOutput:
        return self._cut(self.base.prefill(slots, prompts))

    def verify(self, slots, tokens) -> TargetOutput:
        return self._cut(self.base.verify(slots, tokens))

    def commit(self, slots, lengths) -> None:
        self.base.commit(slots, lengths)

    def release(self, slots) -> None:
        self.base.release(slots)

    def reserve(self, num_slots, length) -> None:
        self.base.reserve(num_slots, length)

    def warm_prefill(self, max_prompt) -> None:
        self.base.warm_prefill(max_prompt)

    def forward_rows(self, tokens, starts, context_width, slots=None,
                     logit_rows=None, compute_rows=None) -> TargetOutput:
        return self._cut(self.base.forward_rows(tokens, starts, context_width, slots,
                                                logit_rows, compute_rows))
