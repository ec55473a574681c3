"""A tiny deterministic causal transformer that implements :class:`TargetModel` (pure torch, CPU).

The runtime tests' verifier: per-slot KV caches, capture of the residual stream after chosen
layers, prefill / verify / commit / release. It is small on purpose (default ``V = 64``,
``H_t = 32``, 4 layers) so that a CPU test decodes thousands of tokens in seconds. It computes in
float64 and hands out fp32 logits, features, embedding and head, so a token's outputs do not
depend on how many tokens or requests were batched with it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from draftsmith.contract import LogitsShard, OutputHead, ShapeError, TargetOutput
from draftsmith.drafters.nn import apply_rope_neox, rms_norm, rope_cos_sin, rope_inv_freq
from draftsmith.selection.sampling import filtered_probs


class ToyTarget:
    """A random-weight Llama-style decoder with RoPE, SwiGLU and per-slot KV caches.

    ``max_slots`` slots of ``max_len`` tokens each; slot ``s`` holds ``lengths[s]`` cached tokens.
    ``logit_scale`` multiplies the logits (a larger scale gives a peakier next-token distribution);
    ``mixing`` scales what attention and MLP add to the residual stream (a small value makes the
    next token depend mostly on the current one, which a bigram drafter then predicts well).
    """

    def __init__(
        self,
        vocab_size: int = 64,
        hidden_size: int = 32,
        num_layers: int = 4,
        num_heads: int = 4,
        intermediate_size: int = 64,
        max_slots: int = 16,
        max_len: int = 256,
        seed: int = 0,
        logit_scale: float = 1.0,
        mixing: float = 1.0,
        device: torch.device | str = "cpu",
    ) -> None:
        if hidden_size % num_heads or (hidden_size // num_heads) % 2:
            raise ShapeError("hidden_size must split into num_heads heads of even width")
        g = torch.Generator().manual_seed(seed)
        dev = torch.device(device)

        def rnd(*shape: int, scale: float) -> torch.Tensor:
            # drawn in fp32 (stable across releases), held in float64 (see _forward)
            return (torch.randn(*shape, generator=g) * scale).to(dev, torch.float64)

        h, i = hidden_size, intermediate_size
        self._vocab, self._hidden, self._layers = vocab_size, hidden_size, num_layers
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.max_slots, self.max_len, self.device = max_slots, max_len, dev
        self.embed = rnd(vocab_size, h, scale=1.0)
        self.lm_head = rnd(vocab_size, h, scale=logit_scale / h**0.5)
        self.norm_w = torch.ones(h, device=dev, dtype=torch.float64)
        self.layers = [
            {
                "ln1": 1.0 + rnd(h, scale=0.1),
                "ln2": 1.0 + rnd(h, scale=0.1),
                "wq": rnd(h, h, scale=h**-0.5),
                "wk": rnd(h, h, scale=h**-0.5),
                "wv": rnd(h, h, scale=h**-0.5),
                "wo": rnd(h, h, scale=h**-0.5 * 0.5 * mixing),
                "gate": rnd(i, h, scale=h**-0.5),
                "up": rnd(i, h, scale=h**-0.5),
                "down": rnd(h, i, scale=i**-0.5 * 0.5 * mixing),
            }
            for _ in range(num_layers)
        ]
        self._embed32 = self.embed.float()
        self._head32 = self.lm_head.float()
        self.inv_freq = rope_inv_freq(self.head_dim, 10000.0).to(dev)
        shape = (max_slots, num_layers, max_len, num_heads, self.head_dim)
        self.k_cache = torch.zeros(shape, device=dev, dtype=torch.float64)
        self.v_cache = torch.zeros(shape, device=dev, dtype=torch.float64)
        self.lengths = [0] * max_slots
        self.capture_layers: tuple[int, ...] = ()

    # ---- TargetModel properties ---------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """``V``."""
        return self._vocab

    @property
    def hidden_size(self) -> int:
        """``H_t``."""
        return self._hidden

    @property
    def num_layers(self) -> int:
        """``L_t``."""
        return self._layers

    def input_embedding(self) -> torch.Tensor:
        """The raw embedding table ``[V, H_t]`` fp32."""
        return self._embed32

    def output_head(self) -> OutputHead:
        """The full-vocabulary output head (fp32)."""
        return OutputHead(weight=self._head32, vocab_start=0, vocab_size=self._vocab)

    def set_capture_layers(self, layer_ids: Sequence[int]) -> None:
        """Capture the residual stream after each layer of ``layer_ids`` (``-1``: embeddings)."""
        for lid in layer_ids:
            if not -1 <= lid < self._layers - 1:
                raise ShapeError(
                    f"capture layer {lid} is outside -1..{self._layers - 2} (the last layer's "
                    "output is final-normed in Hugging Face and may not be captured)"
                )
        self.capture_layers = tuple(int(x) for x in layer_ids)

    # ---- forward ------------------------------------------------------------------------

    # ---- the static cache -----------------------------------------------------------------

    graph_blocker = None
    gemm = "torch"
    """Nothing in the forward reads the device back: CUDA graphs may capture it."""
    cache_version = 0
    """The cache is allocated once, in the constructor."""

    @property
    def cache_length(self) -> int:
        """``T``: positions held per slot."""
        return self.max_len

    @property
    def cache_slots(self) -> int:
        """Slots held."""
        return self.max_slots

    def reserve(self, num_slots: int, length: int) -> None:
        """Check that ``num_slots`` slots of ``length`` positions fit (the cache is fixed)."""
        if num_slots > self.max_slots or length > self.max_len:
            raise ShapeError(
                f"{num_slots} slots of {length} positions do not fit ToyTarget(max_slots="
                f"{self.max_slots}, max_len={self.max_len}); raise them"
            )

    def warm_prefill(self, max_prompt: int) -> None:
        """Nothing to warm: the toy's forward has no shape-specific first-call cost."""

    def forward_rows(self, tokens: torch.Tensor, starts: torch.Tensor, context_width: int,
                     slots: torch.Tensor | None = None,
                     logit_rows: torch.Tensor | None = None,
                     compute_rows: torch.Tensor | None = None) -> TargetOutput:
        """Forward ``tokens: [G, Q]`` for slots ``0 .. G-1`` (or ``slots``) at positions
        ``starts[b] + j``, attending to columns ``0 .. context_width - 1``; logits of every row
        or of ``logit_rows``; with ``compute_rows`` the whole block runs and those rows are
        returned; no host read (graph-capturable)."""
        g, q = tokens.shape
        if g > self.max_slots or not q <= context_width <= self.max_len:
            raise ShapeError(f"forward_rows of {g} rows over {context_width} columns does not "
                             f"fit ToyTarget(max_slots={self.max_slots}, max_len={self.max_len})")
        rows = torch.arange(g, device=self.device) if slots is None else slots.to(self.device)
        logits, feats = self._forward(rows, starts.to(self.device), tokens.to(self.device),
                                      context_width)
        if logit_rows is not None:
            logits = logits[logit_rows.to(self.device)]
        if compute_rows is not None:
            logits, feats = logits[compute_rows], feats[compute_rows]
        return TargetOutput(LogitsShard.full(logits), feats)

    # ---- forward ------------------------------------------------------------------------

    def _forward(self, slot_idx: torch.Tensor, starts: torch.Tensor, tokens: torch.Tensor,
                 width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``tokens: [G, T] int64`` at ``starts[b] + j`` of slot ``slot_idx[b]`` and attend
        to columns ``0 .. width - 1``; return fp32 logits ``[G*T, V]`` and features
        ``[G*T, n_cap * H_t]``.

        Computes in float64 and rounds the outputs to fp32, so a token's outputs do not depend
        (beyond float64 noise far below fp32 resolution) on how many tokens or requests a call
        carries: prefill, one-token decode and a batched K+1 verify agree exactly in fp32.
        """
        g, t = tokens.shape
        pos = starts[:, None] + torch.arange(t, device=self.device)  # [G, T]
        cos, sin = rope_cos_sin(pos, self.inv_freq, torch.float64)
        x = self.embed[tokens]  # [G, T, H_t]
        captured = {-1: x} if -1 in self.capture_layers else {}
        n_h, hd = self.num_heads, self.head_dim
        visible = torch.arange(width, device=self.device)[None, None, :] <= pos[:, :, None]
        rows = slot_idx[:, None].expand(g, t)
        for lid, w in enumerate(self.layers):
            a = rms_norm(x, w["ln1"], 1e-6)
            q = apply_rope_neox((a @ w["wq"].T).view(g, t, n_h, hd), cos, sin)
            k = apply_rope_neox((a @ w["wk"].T).view(g, t, n_h, hd), cos, sin)
            v = (a @ w["wv"].T).view(g, t, n_h, hd)
            self.k_cache[rows, lid, pos] = k
            self.v_cache[rows, lid, pos] = v
            keys = self.k_cache[slot_idx, lid, :width]  # [G, C, n_h, hd]
            vals = self.v_cache[slot_idx, lid, :width]
            scores = torch.einsum("gthd,gchd->ghtc", q, keys) * hd**-0.5
            scores = scores.masked_fill(~visible[:, None], float("-inf"))
            o = torch.einsum("ghtc,gchd->gthd", scores.softmax(-1), vals).reshape(g, t, -1)
            x = x + o @ w["wo"].T
            y = rms_norm(x, w["ln2"], 1e-6)
            x = x + (torch.nn.functional.silu(y @ w["gate"].T) * (y @ w["up"].T)) @ w["down"].T
            if lid in self.capture_layers:
                captured[lid] = x
        logits = rms_norm(x, self.norm_w, 1e-6) @ self.lm_head.T
        if self.capture_layers:
            feats = torch.cat([captured[lid] for lid in self.capture_layers], dim=-1)
        else:
            feats = x.new_zeros(g, t, 0)
        return logits.reshape(g * t, -1).float(), feats.reshape(g * t, -1).float()

    def _host_forward(self, slots: Sequence[int], tokens: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``tokens: [G, T]`` after each slot's host length (the host calls)."""
        t = int(tokens.shape[1])
        starts = [self.lengths[s] for s in slots]
        if max(starts) + t > self.max_len:
            raise ShapeError(
                f"a slot would hold {max(starts) + t} tokens; ToyTarget(max_len="
                f"{self.max_len}) is too small, raise max_len"
            )
        out = self._forward(torch.tensor(list(slots), device=self.device),
                            torch.tensor(starts, device=self.device), tokens, max(starts) + t)
        for slot, start in zip(slots, starts, strict=True):
            self.lengths[slot] = start + t
        return out

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.max_slots:
            raise ShapeError(f"slot {slot} is outside 0..{self.max_slots - 1}")

    def prefill(self, slots: Sequence[int], prompts: Sequence[torch.Tensor]) -> TargetOutput:
        """Run each prompt from position 0 in its slot; rows are the prompts concatenated.

        Prompts are right-padded into one batch; pad positions write cache columns past the
        prompt, which are masked until a real token overwrites them.
        """
        lengths = [int(p.shape[0]) for p in prompts]
        if len(lengths) != len(slots) or min(lengths, default=1) < 1:
            raise ShapeError("prefill needs one non-empty prompt per slot")
        longest = max(lengths)
        batch = torch.zeros(len(slots), longest, dtype=torch.int64, device=self.device)
        for b, (slot, prompt) in enumerate(zip(slots, prompts, strict=True)):
            self._check_slot(slot)
            self.lengths[slot] = 0
            batch[b, : lengths[b]] = prompt.to(self.device, torch.int64)
        logits, feats = self._host_forward(slots, batch)
        keep = (torch.arange(longest, device=self.device)[None, :]
                < torch.tensor(lengths, device=self.device)[:, None]).reshape(-1)
        for slot, n in zip(slots, lengths, strict=True):
            self.lengths[slot] = n
        return TargetOutput(LogitsShard.full(logits[keep]), feats[keep])

    def verify(self, slots: Sequence[int], tokens: torch.Tensor) -> TargetOutput:
        """Forward ``tokens: [G, K+1]`` after each slot's cache; rows request-major."""
        if tokens.dim() != 2 or tokens.shape[0] != len(slots):
            raise ShapeError(f"verify tokens must be [G={len(slots)}, K+1], got {tuple(tokens.shape)}")
        for slot in slots:
            self._check_slot(slot)
        if len(set(slots)) != len(slots):
            raise ShapeError(f"verify slots must be distinct, got {list(slots)}")
        lg, ft = self._host_forward(slots, tokens.to(self.device, torch.int64))
        return TargetOutput(LogitsShard.full(lg), ft)

    def commit(self, slots: Sequence[int], lengths: Sequence[int]) -> None:
        """Crop each slot's cache to ``lengths[b]`` tokens."""
        for slot, length in zip(slots, lengths, strict=True):
            if not 0 <= int(length) <= self.lengths[slot]:
                raise ShapeError(
                    f"cannot crop slot {slot} holding {self.lengths[slot]} tokens to {length}"
                )
            self.lengths[slot] = int(length)

    def release(self, slots: Sequence[int]) -> None:
        """Free the slots."""
        for slot in slots:
            self.lengths[slot] = 0

    # ---- helpers for tests --------------------------------------------------------------

    def greedy_generate(self, prompt: Sequence[int], max_new_tokens: int, slot: int = 0) -> list[int]:
        """The target's own greedy decoding, one token per forward: the oracle that greedy
        speculative decoding must equal token for token."""
        out = self.prefill([slot], [torch.tensor(list(prompt))])
        tok = int(out.logits.logits[-1].argmax())
        tokens = [tok]
        while len(tokens) < max_new_tokens:
            out = self.verify([slot], torch.tensor([[tok]]))
            tok = int(out.logits.logits[-1].argmax())
            tokens.append(tok)
        self.release([slot])
        return tokens

    def next_token_probs(self, prefix: Sequence[int], temperature: float = 1.0,
                         slot: int = 0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
        """The distribution of the token after ``prefix``, ``softmax(logits / T)`` filtered by
        ``top_k`` / ``top_p`` as the selectors filter: ``[V] fp32``."""
        out = self.prefill([slot], [torch.tensor(list(prefix))])
        self.release([slot])
        return filtered_probs(out.logits.logits[-1:].float(), temperature, top_k, top_p)[0]


def chi_square_world(**runtime) -> tuple[ToyTarget, dict]:
    """The V = 8 toy target and the config (a dict for ``SpecConfig.from_dict``: a one-layer
    ``dspark-gqa`` drafter, ``K = 3``, sampling at ``T = 1``, 64 rows) of the chi-square
    decoding tests; ``runtime`` adds runtime options."""
    small = ToyTarget(vocab_size=8, hidden_size=16, num_layers=3, num_heads=2,
                      intermediate_size=32, max_slots=80, max_len=32, seed=3)
    return small, {
        "drafter": {"family": "dspark-gqa", "options": {"target_layer_ids": [0, 1],
                                                        "num_layers": 1, "markov_rank": 4}},
        "num_draft_tokens": 3, "selection": {"kind": "sample", "temperature": 1.0},
        "runtime": {"max_batch": 64, "max_context": 32, "page_size": 8, **runtime},
    }


def assert_sampled_like_the_target(target, prompt: list[int], results, **sampling) -> None:
    """Chi-square checks that tokens 2 and 3 of ``results`` (sampled continuations of
    ``prompt`` over an 8-token vocabulary) follow the target's own marginals there, computed
    exactly from ``target.next_token_probs`` (``sampling``: its ``temperature``, ``top_k``,
    ``top_p``); a negative control compares token 3 with token 2's marginal and must fail."""
    from scipy.stats import chisquare

    def probs(prefix: list[int]) -> torch.Tensor:
        return target.next_token_probs(prefix, **sampling)

    p1 = probs(prompt)
    p2 = torch.stack([probs(prompt + [a]) for a in range(8)])  # [x1, x2]
    p3 = torch.stack([torch.stack([probs(prompt + [a, b]) for b in range(8)])
                      for a in range(8)])  # [x1, x2, x3]
    marg2 = (p1[:, None] * p2).sum(0)
    marg3 = (p1[:, None, None] * p2[:, :, None] * p3).sum((0, 1))

    def pvalue(pos: int, marg: torch.Tensor) -> float:
        counts = torch.bincount(torch.tensor([r.tokens[pos] for r in results]), minlength=8)
        expected = marg.double() / marg.double().sum() * counts.sum()
        seen = expected > 0  # a filtered-out token must never appear
        if counts[~seen].sum() > 0:
            return 0.0
        return float(chisquare(counts[seen].double().numpy(), expected[seen].numpy()).pvalue)

    assert pvalue(1, marg2) > 1e-3
    assert pvalue(2, marg3) > 1e-3
    assert pvalue(2, marg2) < 1e-6  # negative control


__all__ = ["ToyTarget", "assert_sampled_like_the_target"]


SYNC_MESSAGE = "called a synchronizing CUDA operation"
"""What torch's sync debug mode warns for each synchronizing call (other warnings that mention
synchronization, issued once per process, are not counted)."""


def host_syncs(call: Callable[..., Any], *args: Any) -> tuple[Any, int]:
    """``(call(*args), synchronizing calls it made)``, counted by torch's sync debug mode."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = call(*args)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return result, sum(SYNC_MESSAGE in str(w.message) for w in caught)


def syncs_per_step(dec: Any, prompts: Sequence[Sequence[int]], budgets: Any,
                   extra: bool = False) -> list[int]:
    """``dec.generate(prompts, budgets)`` with each step's synchronizing calls counted (``extra``:
    one more device read per step, the negative control)."""
    real = dec.step
    counts: list[int] = []

    def step(active):
        def run():
            real(active)
            if extra:
                dec.buffers.target_len[0].item()
        counts.append(host_syncs(run)[1])

    dec.step = step
    try:
        dec.generate(prompts, budgets)
    finally:
        del dec.step
    return counts
