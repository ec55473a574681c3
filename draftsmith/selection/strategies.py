"""The built-in :class:`~draftsmith.contract.TokenSelector` strategies: greedy and sampling.

Each strategy is bound to its validated config; its route (local, pair exchange, top-k
candidates or gather) is a pure function of that config and the TP size, so every rank takes the
same path (see :mod:`draftsmith.selection.eligibility`). Imports ``draftsmith.contract`` and
``draftsmith.kernels`` (through the selection modules); never torch.distributed.
"""

from __future__ import annotations

from typing import Literal

import torch

from draftsmith.contract import (
    Collectives,
    LogitsShard,
    SamplingKey,
    SelectorCapabilities,
    ShapeError,
    SingleRank,
)
from draftsmith.selection.configs import GreedyConfig, SampleConfig, capabilities_of
from draftsmith.selection.eligibility import SelectionRoute, selection_route
from draftsmith.selection.sampling import (
    apply_top_p,
    candidate_probs,
    filtered_candidates,
    filtered_probs,
    one_hot_argmax,
    sample_candidates,
)
from draftsmith.selection.vocab_parallel import (
    ExchangeWorkspace,
    gather_logits,
    sharded_argmax,
    sharded_gumbel_sample,
    sharded_top_k_candidates,
    whole_rows,
)


def local_group(logits: LogitsShard, collectives: Collectives) -> Collectives:
    """``collectives``, or a single rank when every rank already holds the full vocabulary (then
    each rank computes the same answer alone, with no exchange)."""
    return SingleRank() if logits.is_full else collectives


class _Selector:
    """Shared plumbing: kernel choice, the exchange workspace and route lookup."""

    config: GreedyConfig | SampleConfig
    _capabilities: SelectorCapabilities

    def __init__(self, use_kernels: bool | None = None,
                 workspace: ExchangeWorkspace | None = None) -> None:
        self.use_kernels = use_kernels
        """Use the Triton pair kernels (``None``: when the logits are on a CUDA device)."""
        self.workspace = workspace
        """Exchange staging buffer, allocated once by the runtime before capture (optional)."""

    @property
    def capabilities(self) -> SelectorCapabilities:
        """Declared by the config (:func:`~draftsmith.selection.configs.capabilities_of`)."""
        return self._capabilities

    def prepare(self, *, max_rows: int, tp_size: int, use_kernels: bool,
                device: torch.device) -> None:
        """Take the plan's kernel choice and, with the vocabulary split over ranks, allocate the
        exchange workspace now, before any capture."""
        self.use_kernels = use_kernels
        if tp_size > 1:
            self.bind_workspace(ExchangeWorkspace(max_rows, device))

    def bind_workspace(self, workspace: ExchangeWorkspace) -> None:
        """Use ``workspace`` for every later exchange (call before CUDA-graph capture)."""
        self.workspace = workspace

    def route(self, tp_size: int, vocab_size: int) -> SelectionRoute:
        """The path :meth:`select` takes at this TP size, and why."""
        return selection_route(self.config, tp_size, vocab_size)

    def _argmax(self, logits: LogitsShard, collectives: Collectives) -> torch.Tensor:
        collectives = local_group(logits, collectives)
        route = self.route(collectives.world_size, logits.vocab_size)
        if route.kind == "gather":
            return torch.argmax(gather_logits(logits, collectives), dim=1)
        if route.kind == "local" and not self._kernel(logits.logits):
            full = gather_logits(logits, collectives)  # checks the shard is the full vocabulary
            return torch.argmax(full, dim=1)
        return sharded_argmax(logits, collectives, self.workspace, self.use_kernels)

    def _kernel(self, logits: torch.Tensor) -> bool:
        return logits.is_cuda if self.use_kernels is None else self.use_kernels

    def select_with_probs(self, logits: LogitsShard, key: SamplingKey | None, stream: int,
                          collectives: Collectives) -> tuple[torch.Tensor, torch.Tensor]:
        """``(select(...) [rows] int64, probs(...) [rows, V] fp32)`` of the same logits: what a
        drafter chain needs for rejection sampling. Strategies that can share work between the
        two (one vocabulary sort under top-k / top-p) do; the results are those of the two
        calls."""
        return self.select(logits, key, stream, collectives), self.probs(logits, collectives)


class GreedySelector(_Selector):
    """Order-T argmax (``torch.argmax``); vocab-parallel through one pair exchange."""

    def __init__(self, config: GreedyConfig | None = None, use_kernels: bool | None = None,
                 workspace: ExchangeWorkspace | None = None) -> None:
        super().__init__(use_kernels, workspace)
        self.config = config or GreedyConfig()
        self._capabilities = capabilities_of(self.config)

    def select(self, logits: LogitsShard, key: SamplingKey | None, stream: int,
               collectives: Collectives) -> torch.Tensor:
        """``[rows] int64`` global argmax ids, identical on every rank (``key`` is ignored)."""
        return self._argmax(logits, collectives)

    def probs(self, logits: LogitsShard, collectives: Collectives) -> torch.Tensor:
        """One-hot of the argmax: ``[rows, V] float32``."""
        token = self._argmax(logits, collectives)
        out = torch.zeros(logits.logits.shape[0], logits.vocab_size, dtype=torch.float32,
                          device=logits.logits.device)
        return out.scatter_(1, token[:, None], 1.0)


class SampleSelector(_Selector):
    """Temperature / top-k / top-p sampling from keyed Gumbel noise.

    ``T == 0`` is greedy. Temperature-only sampling runs on shards through Gumbel-max pairs;
    top-k through ``k`` candidates per rank; top-p alone gathers the logits.
    """

    def __init__(self, config: SampleConfig, use_kernels: bool | None = None,
                 workspace: ExchangeWorkspace | None = None) -> None:
        super().__init__(use_kernels, workspace)
        self.config = config
        self._capabilities = capabilities_of(config)

    def select(self, logits: LogitsShard, key: SamplingKey | None, stream: int,
               collectives: Collectives) -> torch.Tensor:
        """``[rows] int64`` sampled global ids, identical on every rank and for every TP split.

        ``key`` (seeds and offsets per row) is required unless ``T == 0``; ``stream`` 0 target,
        1 draft.
        """
        cfg = self.config
        if self._capabilities.greedy:
            return self._argmax(logits, collectives)
        rows = logits.logits.shape[0]
        key = _check_key(key, rows)
        collectives = local_group(logits, collectives)
        route = self.route(collectives.world_size, logits.vocab_size)
        draw = self._draw(route, logits)
        if draw == "pairs":
            if route.kind == "gather":  # the same two-level draw, from the gathered rows
                logits, collectives = whole_rows(logits, collectives), SingleRank()
            temps = torch.full((rows,), cfg.temperature, dtype=torch.float32,
                               device=logits.logits.device)
            return sharded_gumbel_sample(logits, temps, key, stream, collectives,
                                         self.workspace, self.use_kernels)
        if draw == "topk_merge":
            scores = logits.logits.to(torch.float32) / cfg.temperature
            cand, ids = sharded_top_k_candidates(scores, logits.vocab_start, cfg.top_k,
                                                 collectives)
            return sample_candidates(apply_top_p(cand, cfg.top_p), ids, key, stream)
        cand, ids = self._sorted_candidates(logits, collectives)
        return sample_candidates(cand, ids, key, stream)

    def _sorted_candidates(self, logits: LogitsShard,
                           collectives: Collectives) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``"sort"`` draw's candidates: whole rows gathered, scaled by ``1 / T`` and
        filtered (:func:`~draftsmith.selection.sampling.filtered_candidates`)."""
        cfg = self.config
        scores = gather_logits(logits, collectives) / cfg.temperature
        return filtered_candidates(scores, cfg.top_k, cfg.top_p)

    def _draw(self, route: SelectionRoute,
              logits: LogitsShard) -> Literal["pairs", "topk_merge", "sort"]:
        """How :meth:`select` draws on ``route``: ``"pairs"`` (keyed Gumbel pairs, no filter
        or a TP split that needs none; from the gathered rows on the ``gather`` route, so the
        token is the one a single rank draws), ``"topk_merge"`` (each rank's top-k, merged) or
        ``"sort"`` (whole rows gathered and sorted for top-k / top-p, the filtering that
        :meth:`probs` repeats and :meth:`select_with_probs` shares)."""
        cfg = self.config
        filtered = (0 < cfg.top_k < logits.vocab_size) or cfg.top_p < 1.0
        if route.kind == "gumbel_pairs" or not filtered:
            return "pairs"
        return "topk_merge" if route.kind == "topk_candidates" else "sort"

    def select_with_probs(self, logits: LogitsShard, key: SamplingKey | None, stream: int,
                          collectives: Collectives) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`select` and :meth:`probs` with one filtering sort where ``select`` gathers
        and sorts the vocabulary anyway."""
        local = local_group(logits, collectives)
        route = self.route(local.world_size, logits.vocab_size)
        if self._capabilities.greedy or self._draw(route, logits) != "sort":
            return super().select_with_probs(logits, key, stream, collectives)
        rows = logits.logits.shape[0]
        key = _check_key(key, rows)
        cand, ids = self._sorted_candidates(logits, local)
        return (sample_candidates(cand, ids, key, stream),
                candidate_probs(cand, ids, (rows, logits.vocab_size)))

    def probs(self, logits: LogitsShard, collectives: Collectives) -> torch.Tensor:
        """The filtered, temperature-scaled distribution ``[rows, V] float32`` (gathers)."""
        cfg = self.config
        full = gather_logits(logits, local_group(logits, collectives))
        if self._capabilities.greedy:
            return one_hot_argmax(full)
        return filtered_probs(full, cfg.temperature, cfg.top_k, cfg.top_p)


def _check_key(key: SamplingKey | None, rows: int) -> SamplingKey:
    """``key``, which sampling at ``T > 0`` needs, with one seed and offset per row."""
    if key is None:
        raise ShapeError(
            "SampleSelector.select needs a SamplingKey (seeds and offsets per row) when "
            "temperature > 0; build one from the request seeds and positions"
        )
    if key.seeds.shape[0] != rows:
        raise ShapeError(f"SamplingKey has {key.seeds.shape[0]} rows, logits {rows}")
    return key


__all__ = ["GreedySelector", "SampleSelector", "local_group"]
