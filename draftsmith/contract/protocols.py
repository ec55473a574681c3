"""The only methods the runtime and models may call on each other.

``Drafter`` is what a drafter family hands the runtime; ``TargetModel`` is what a verifier adapter
hands it; ``Collectives`` is what the runtime injects so that drafters and selection never import
``torch.distributed``; ``TokenSelector`` is what a selection strategy builds from its config.

Each of the three may also define a few optional members, named in its docstring. The runtime
reads them only through :func:`selector_extras`, :func:`drafter_extras` and
:func:`target_extras`, which give the declared default for a member an object does not define,
so an implementation without them keeps working and ``isinstance`` checks ask only for the
required members.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch

from draftsmith.contract.capabilities import DrafterCapabilities, SelectorCapabilities
from draftsmith.contract.checks import check_tensor
from draftsmith.contract.tensors import (
    DraftBlockInputs,
    DraftBlockPlacement,
    LogitsShard,
    MarkovHeadWeights,
    OutputHead,
    PagedContextCache,
)


@runtime_checkable
class Collectives(Protocol):
    """A tensor-parallel group as seen by drafters and selection."""

    @property
    def rank(self) -> int:
        """This rank's index ``rho`` in the group."""
        ...

    @property
    def world_size(self) -> int:
        """``TP``: number of ranks in the group."""
        ...

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the group in place and return it."""
        ...

    def all_gather(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Concatenate every rank's ``tensor`` along ``dim`` in rank order."""
        ...


class SingleRank:
    """The trivial group of one rank: every collective is the identity."""

    rank = 0
    world_size = 1

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Return ``tensor`` unchanged (the sum over one rank)."""
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Return ``tensor`` unchanged (the concatenation of one rank)."""
        return tensor


@dataclass(frozen=True, eq=False)
class SamplingKey:
    """Counter-based randomness, as tensors so a CUDA graph replays fresh draws.

    ``seeds: [rows] int64`` per-request seeds; ``offsets: [rows] int64`` the absolute position of
    the token each row samples. Streams (0 target/bonus, 1 draft, 2 acceptance) are chosen by the
    caller of the selector, never stored in the key.
    """

    seeds: torch.Tensor
    offsets: torch.Tensor

    def __post_init__(self) -> None:
        s: dict[str, int] = {}
        check_tensor("SamplingKey.seeds", self.seeds, ("rows",), torch.int64, s)
        check_tensor("SamplingKey.offsets", self.offsets, ("rows",), torch.int64, s)


@runtime_checkable
class TokenSelector(Protocol):
    """A token-selection strategy bound to its validated config.

    Optional members (read through :func:`selector_extras`):

    - ``select_with_probs(logits, key, stream, collectives)``: ``(select(...), probs(...))`` of
      the same logits, ``([rows] int64, [rows, V] fp32)``, for a strategy that filters once for
      both. Default: :meth:`select`, then :meth:`probs`.
    - ``route(tp_size, vocab_size)``: the path :meth:`select` takes at that TP size, as an object
      with ``kind: str`` and ``reason: str`` (the built-ins return a
      ``draftsmith.selection.SelectionRoute``); the plan records it. Default: none, and the plan
      derives the path from :attr:`capabilities`.
    """

    @property
    def capabilities(self) -> SelectorCapabilities:
        """What this strategy declares (fixed for its lifetime)."""
        ...

    def prepare(self, *, max_rows: int, tp_size: int, use_kernels: bool,
                device: torch.device) -> None:
        """Take the plan's choices before any round runs or is captured: at most ``max_rows``
        rows per call, ``tp_size`` ranks sharing the vocabulary, ``use_kernels`` the plan's
        kernel choice; allocate here, on ``device``, what a captured round must not allocate
        (a strategy with nothing to prepare does nothing)."""
        ...

    def select(
        self,
        logits: LogitsShard,
        key: SamplingKey | None,
        stream: int,
        collectives: Collectives,
    ) -> torch.Tensor:
        """Pick one global token id per row: ``[rows] int64``, identical on every rank."""
        ...

    def probs(self, logits: LogitsShard, collectives: Collectives) -> torch.Tensor:
        """The distribution ``select`` samples from, over the full vocabulary: ``[rows, V] fp32``."""
        ...


@dataclass(frozen=True, eq=False)
class SelectorExtras:
    """The optional members of one :class:`TokenSelector`, with their defaults filled in."""

    select_with_probs: Callable[[LogitsShard, SamplingKey | None, int, Collectives],
                                tuple[torch.Tensor, torch.Tensor]]
    """``(logits, key, stream, collectives) -> (tokens [rows] int64, probs [rows, V] fp32)``:
    the strategy's own ``select_with_probs``, or :meth:`TokenSelector.select` followed by
    :meth:`TokenSelector.probs` of the same logits."""
    route: Callable[[int, int], tuple[str, str]] | None = None
    """``(tp_size, vocab_size) -> (kind, reason)`` of the strategy's own ``route``; ``None``
    for a strategy without one."""


def selector_extras(selector: TokenSelector) -> SelectorExtras:
    """What ``selector`` defines of the optional members (a member that is not callable counts
    as undefined), and the defaults for the rest."""
    own = getattr(selector, "select_with_probs", None)
    route = getattr(selector, "route", None)

    def select_then_probs(logits: LogitsShard, key: SamplingKey | None, stream: int,
                          collectives: Collectives) -> tuple[torch.Tensor, torch.Tensor]:
        return (selector.select(logits, key, stream, collectives),
                selector.probs(logits, collectives))

    def kind_and_reason(tp_size: int, vocab_size: int) -> tuple[str, str]:
        found = route(tp_size, vocab_size)
        return str(found.kind), str(found.reason)

    return SelectorExtras(select_with_probs=own if callable(own) else select_then_probs,
                          route=kind_and_reason if callable(route) else None)


@runtime_checkable
class Drafter(Protocol):
    """A drafter network: weights and forward math on the tensors it is given.

    It never runs the Markov chain, never picks tokens and never reads a page table except
    through the :class:`DraftBlockPlacement` handed to it.

    Optional member (read through :func:`drafter_extras`): ``sts_temperatures``, the STS
    calibration table of the confidence head, ``[n] fp32`` with one temperature per draft
    position (``n >= K``); confidence-scheduled verification needs it. Default: ``None`` (no
    table).
    """

    @property
    def capabilities(self) -> DrafterCapabilities:
        """What this drafter declares (fixed for its lifetime)."""
        ...

    def project_context(self, features: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Context entries for newly committed target positions.

        ``features: [T, n_cap * H_t]``, ``positions: [T] int64`` ->
        ``[T, L, planes, heads, width]`` in the pool dtype (GQA K/V or MLA latents).
        """
        ...

    def embed_block(
        self, token_ids: torch.Tensor, target_embedding: torch.Tensor | None
    ) -> torch.Tensor:
        """Embed block tokens ``[G, W] int64`` -> ``[G, W, H]``.

        ``target_embedding: [V, H]`` is the target's input table; families that ship their own
        table (``shares_target_embedding = False``) ignore it.
        """
        ...

    def forward_block(
        self,
        inputs: DraftBlockInputs,
        placement: DraftBlockPlacement,
        cache: PagedContextCache,
    ) -> torch.Tensor:
        """Run the block over the paged context: final-normed hidden ``[G, W, H]``.

        Reads context columns ``0 .. num_ctx - 1`` of each request's pages; never writes the pool.
        """
        ...

    def block_logits(self, hidden: torch.Tensor, head: OutputHead) -> LogitsShard:
        """Draft logits ``[rows, S] fp32`` from hidden ``[rows, H]``, with the output multiplier
        and soft-capping applied."""
        ...

    def markov_head(self) -> MarkovHeadWeights | None:
        """The Markov head as data (this rank's ``w2`` shard), or ``None``."""
        ...

    def confidence(self, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        """Raw survival logits ``[G, K] fp32`` from draft-slot hidden ``[G, K, H]`` and the
        previous token of each slot ``[G, K] int64`` (anchor, then the proposed drafts)."""
        ...

    def save(self, directory: Path) -> None:
        """Write a checkpoint (config.json + model.safetensors) that the family loads back."""
        ...


@dataclass(frozen=True, eq=False)
class DrafterExtras:
    """The optional members of one :class:`Drafter`; a member it does not define has the default
    given here."""

    sts_temperatures: torch.Tensor | None = None
    """The STS calibration table ``[n] fp32``: the raw confidence of draft position ``j`` is
    divided by entry ``j`` before its sigmoid. ``None``: the drafter has none."""


def drafter_extras(drafter: Drafter) -> DrafterExtras:
    """What ``drafter`` defines of the optional members, and the defaults for the rest."""
    return _read_extras(drafter, DrafterExtras)


@dataclass(frozen=True, eq=False)
class TargetOutput:
    """One target forward.

    ``logits: [rows, S]`` as a :class:`LogitsShard` (fp32); ``features: [rows, n_cap * H_t]`` the
    captured hidden states of the requested layers, concatenated in layer-id order.
    """

    logits: LogitsShard
    features: torch.Tensor


@runtime_checkable
class TargetModel(Protocol):
    """A verifier addressed by request slots, over a static key/value cache.

    Two ways in. The host calls (``prefill``, ``verify``, ``commit``, ``release``) keep each
    slot's length on the host: the golden path. The runtime's rounds call :meth:`forward_rows`
    with positions held in a device tensor it owns, after sizing the cache with :meth:`reserve`;
    that call reads nothing back to the host, so a CUDA graph can capture it.

    Optional members (read through :func:`target_extras`, which names each one's default):
    ``layer_path``, ``layer_path_reason``, ``layers_split``, ``max_slots`` and
    ``max_position_embeddings``; :class:`TargetExtras` says what each means.
    """

    @property
    def graph_blocker(self) -> str | None:
        """Why a CUDA graph cannot capture :meth:`forward_rows` (``None``: it can)."""
        ...

    @property
    def gemm(self) -> str:
        """How the linear layers multiply at decoding row counts: ``'row-stable'`` (a row's
        result does not depend on the rows beside it) or ``'torch'``."""
        ...

    @property
    def cache_version(self) -> int:
        """Changes whenever the cache storage is replaced (graphs captured before are stale)."""
        ...

    @property
    def vocab_size(self) -> int:
        """``V``."""
        ...

    @property
    def hidden_size(self) -> int:
        """``H_t``."""
        ...

    @property
    def num_layers(self) -> int:
        """``L_t``."""
        ...

    def input_embedding(self) -> torch.Tensor:
        """The raw input embedding table ``[V, H_t]`` (no internal scaling applied)."""
        ...

    def output_head(self) -> OutputHead:
        """This rank's output head (full vocabulary at TP = 1)."""
        ...

    def set_capture_layers(self, layer_ids: Sequence[int]) -> None:
        """Capture the residual stream after each of ``layer_ids`` from now on."""
        ...

    def prefill(self, slots: Sequence[int], prompts: Sequence[torch.Tensor]) -> TargetOutput:
        """Run each prompt ``[P_b] int64`` from position 0 in its slot (resetting the slot).

        Rows are the prompts' tokens in order, concatenated: ``sum(P_b)`` rows.
        """
        ...

    def verify(self, slots: Sequence[int], tokens: torch.Tensor) -> TargetOutput:
        """Forward ``tokens: [G, K+1] int64`` after each slot's cached length.

        Rows are ``G * (K + 1)`` in request-major order; row ``j`` of request ``b`` predicts the
        token after ``tokens[b, j]``.
        """
        ...

    def commit(self, slots: Sequence[int], lengths: Sequence[int]) -> None:
        """Crop each slot's cache to ``lengths[b]`` tokens (dropping rejected drafts)."""
        ...

    def release(self, slots: Sequence[int]) -> None:
        """Free the slots' caches."""
        ...

    def reserve(self, num_slots: int, length: int) -> None:
        """Hold at least ``num_slots`` slots of ``length`` positions (before any capture)."""
        ...

    def warm_prefill(self, max_prompt: int) -> None:
        """Run once every prefill shape that a one-prompt prefill of up to ``max_prompt``
        tokens uses (slots must be free), so a timed generation meets none for the first time
        (kernel autotuning, attention plans)."""
        ...

    def forward_rows(self, tokens: torch.Tensor, starts: torch.Tensor, context_width: int,
                     slots: torch.Tensor | None = None,
                     logit_rows: torch.Tensor | None = None,
                     compute_rows: torch.Tensor | None = None) -> TargetOutput:
        """Forward ``tokens: [G, Q] int64`` for slots ``0 .. G-1`` (or ``slots: [G] int64`` on the
        device), token ``j`` of row ``b`` at position ``starts[b] + j`` (``starts: [G] int64``, on
        the device), attending to columns ``0 .. context_width - 1``; keys and values are written
        in place.

        Features have ``G * Q`` rows in request-major order; logits the same rows, or only
        ``logit_rows: [R] int64`` (device indices into them; a prefill needs its last token's).

        ``compute_rows: [T] int64`` (device indices ``b * Q + j``, distinct; not with
        ``logit_rows``) asks for those tokens only: features and logits have ``T`` rows in that
        order, and the keys and values of the tokens outside it may be left unwritten. A token's
        result is defined when every earlier token of its row is in ``compute_rows`` too (the
        positions it attends to are then written this call); a target may compute every token
        and select the rows, but the point is a verify whose cost follows ``T``, not ``G * Q``.
        Reads nothing back to the host.
        """
        ...


@dataclass(frozen=True)
class TargetExtras:
    """The optional members of one :class:`TargetModel`; a member it does not define has the
    default given here."""

    layer_path: str = "own"
    """What runs the decoder layers: ``'fused'`` (draftsmith's loop over packed weights) or
    ``'transformers'`` (the model's modules), as a Hugging Face target says; ``'own'`` for a
    target that runs its own forward."""
    layer_path_reason: str = ""
    """Why that path (empty: the plan says the target's own forward runs its layers)."""
    gemm_reason: str = ""
    """Why :attr:`TargetModel.gemm` is what it is, where the name alone does not say (a GEMM
    the configuration preferred could not run); empty: the plan gives the GEMM's own account."""
    layers_split: bool = False
    """The decoder layers are split over the tensor-parallel ranks (each holds its heads and
    intermediate columns), so the plan records ``target_layers = 'split'`` under TP."""
    max_slots: int | None = None
    """Request slots the target holds (slot ids ``0 .. max_slots - 1``); bind refuses a
    ``runtime.max_batch`` above it. ``None``: the target states no limit."""
    max_position_embeddings: int | None = None
    """Positions the target can attend to (its RoPE table); a prompt plus its new tokens beyond
    it is refused before admission. ``None``: the target states no limit."""


def target_extras(target: TargetModel) -> TargetExtras:
    """What ``target`` defines of the optional members, and the defaults for the rest."""
    return _read_extras(target, TargetExtras)


_Extras = TypeVar("_Extras", DrafterExtras, TargetExtras)


def _read_extras(obj: Any, extras: type[_Extras]) -> _Extras:
    """``extras`` with each field read from the member of ``obj`` of that name, where ``obj``
    defines one, and left at its declared default otherwise."""
    defaults = extras()
    return extras(**{f.name: getattr(obj, f.name, getattr(defaults, f.name))
                     for f in fields(extras)})


__all__ = [
    "Collectives",
    "Drafter",
    "DrafterExtras",
    "SamplingKey",
    "SelectorExtras",
    "SingleRank",
    "TargetExtras",
    "TargetModel",
    "TargetOutput",
    "TokenSelector",
    "drafter_extras",
    "selector_extras",
    "target_extras",
]
