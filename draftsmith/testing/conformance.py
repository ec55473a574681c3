"""The drafter conformance checks: plain functions that raise :class:`ConformanceFailure`.

Each ``check_*`` function tests one promise a drafter family makes to the runtime:

* :func:`check_capabilities`: the declared :class:`DrafterCapabilities` match what the methods
  return (entry layout, widths, Markov and confidence heads, shared embedding and head);
* :func:`check_shapes_and_dtypes`: every output has the contract's shape and dtype for two batch
  shapes, logits are fp32, nothing is written into the pool or the inputs;
* :func:`check_determinism`: the same load request and inputs give bit-identical outputs, and the
  seed is honoured;
* :func:`check_checkpoint_round_trip`: ``save`` then ``load`` gives bit-identical outputs, and
  broken checkpoint directories raise :class:`CheckpointError`;
* :func:`check_page_placement_invariance`: outputs are bit-identical whichever slots and pages hold
  the context, and whatever the pages not advertised to a request contain;
* :func:`check_request_independence`: a request's outputs do not depend on the other requests of
  the batch (close to those it gets alone);
* :func:`check_tp_agreement`: TP shards loaded from the TP = 1 checkpoint agree with TP = 1 (gloo
  on the CPU, through :class:`draftsmith.parallel.RankPool`).

:func:`run_conformance` runs them all. The helpers :func:`build_paged_batch` and :func:`run_probe`
build a paged context (written through ``drafter.project_context``) and a
:class:`DraftBlockPlacement` for a batch of requests with given context lengths, slots and page
permutation, the way the runtime's paging component lays them out (spec section 4).

This module belongs to the ``testing`` layer (it may import every layer) but does not import
pytest; :mod:`draftsmith.testing.suite` wraps it as a pytest test class.
"""

from __future__ import annotations

import importlib
import math
import pickle
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from draftsmith.contract import (
    CheckpointError,
    ConfigError,
    DraftBlockInputs,
    DraftBlockPlacement,
    Drafter,
    DrafterCapabilities,
    DrafterFamily,
    DraftsmithError,
    LoadRequest,
    LogitsShard,
    MarkovHeadKind,
    MarkovHeadWeights,
    OutputHead,
    PagedContextCache,
    PlanError,
)

if TYPE_CHECKING:
    from draftsmith.parallel import RankPool

_I64 = torch.int64


class ConformanceFailure(AssertionError):
    """A drafter broke a promise of the contract; the message says which and how."""


def _fail(message: str) -> None:
    raise ConformanceFailure(message)


# ---- the probe batch ------------------------------------------------------------------------


@dataclass(frozen=True)
class ConformanceCase:
    """The batch the checks run on: ``G = len(context_lengths)`` generation requests.

    Request ``b`` holds ``context_lengths[b]`` context entries after this step's advance, of which
    the last ``committed[b]`` (``n_b``, bonus included) were committed this step.
    """

    context_lengths: tuple[int, ...] = (7, 1, 13)
    """Advertised context per request (``num_ctx = new_ctx_len``); spans several pages."""
    committed: tuple[int, ...] = (2, 1, 4)
    """``n_b`` per request, ``1 <= n_b <= min(K + 1, context_lengths[b])``."""
    num_draft_tokens: int = 3
    """``K``; the block width ``W`` follows from the family's block convention."""
    page_size: int = 4
    """``P_sz`` of the probe pool."""
    seed: int = 1234
    """Seed of the probe tensors (features, tokens, tables, garbage in unused pages)."""
    rtol: float | None = None
    """Relative tolerance where arithmetic may be reordered (TP vs TP = 1, one request alone vs
    in a batch); default by dtype: 1e-4 fp32 (element by element), 2e-2 bf16/fp16 (of each
    row's norm: rounding differences of low-precision GEMMs grow over the layers element by
    element, while a request that sees another one moves whole rows)."""
    atol: float | None = None
    """Absolute tolerance for the same comparisons: per element for fp32 (default 1e-4), on the
    RMS of each row's difference for bf16/fp16 (default 2e-3)."""

    def __post_init__(self) -> None:
        g = len(self.context_lengths)
        if g == 0 or len(self.committed) != g:
            raise ConfigError(
                "ConformanceCase needs one committed count per context length, got "
                f"{self.context_lengths} and {self.committed}"
            )
        if self.num_draft_tokens < 1 or self.page_size < 1:
            raise ConfigError("ConformanceCase.num_draft_tokens and page_size must be >= 1")
        for n_ctx, n_b in zip(self.context_lengths, self.committed, strict=True):
            if not 1 <= n_b <= min(self.num_draft_tokens + 1, n_ctx):
                raise ConfigError(
                    f"ConformanceCase: committed {n_b} must lie in 1..min(K + 1, {n_ctx})"
                )

    @property
    def num_requests(self) -> int:
        """``G``."""
        return len(self.context_lengths)


@dataclass(frozen=True, eq=False)
class Probe:
    """Random inputs for one drafter, derived from its capabilities and a case.

    ``features``: per request ``[n_ctx_b, n_cap * H_t]``; ``bonus: [G] int64``;
    ``target_embedding, head_weight: [V, H]``; ``prev_tokens: [G, K] int64``.
    """

    features: tuple[torch.Tensor, ...]
    bonus: torch.Tensor
    target_embedding: torch.Tensor
    head_weight: torch.Tensor
    prev_tokens: torch.Tensor


def torch_dtype(caps: DrafterCapabilities) -> torch.dtype:
    """The torch dtype named by ``caps.dtype``; :class:`ConformanceFailure` if it names none."""
    dtype = getattr(torch, caps.dtype, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        _fail(f"capabilities.dtype {caps.dtype!r} is not a torch floating dtype name")
    return dtype


def make_probe(caps: DrafterCapabilities, case: ConformanceCase) -> Probe:
    """Random probe tensors for ``caps`` (the same for the same case seed)."""
    g = torch.Generator().manual_seed(case.seed)
    dtype = torch_dtype(caps)
    v, h = caps.vocab_size, caps.hidden_size
    features = tuple(
        torch.randn(n, caps.feature_width, generator=g).to(dtype) for n in case.context_lengths
    )
    bonus = torch.randint(0, v, (case.num_requests,), generator=g)
    bonus = torch.where(bonus == caps.mask_token_id, (bonus + 1) % v, bonus)
    return Probe(
        features=features,
        bonus=bonus,
        target_embedding=torch.randn(v, h, generator=g).to(dtype),
        head_weight=(torch.randn(v, h, generator=g) / math.sqrt(h)).to(dtype),
        prev_tokens=torch.randint(0, v, (case.num_requests, case.num_draft_tokens), generator=g),
    )


# ---- paged context and placement ------------------------------------------------------------


def page_geometry(
    context_lengths: Sequence[int], num_draft_tokens: int, width: int, page_size: int
) -> tuple[int, int, int]:
    """``(max_ctx, pages_per_slot, total_pages)`` of the pool :func:`build_paged_batch` builds:
    ``max_ctx = max(n_ctx) + K``, ``ceil((max_ctx + W) / P_sz)`` pages per slot, ``G + 1`` slots."""
    max_ctx = max(context_lengths) + num_draft_tokens
    pages_per_slot = -(-(max_ctx + width) // page_size)
    return max_ctx, pages_per_slot, (len(context_lengths) + 1) * pages_per_slot


@dataclass(frozen=True, eq=False)
class PagedBatch:
    """A paged context for a batch of requests and the placement of their next block.

    ``entries``: what ``project_context`` returned, per request ``[n_ctx_b, L, planes, heads,
    width]``; ``inputs`` has token ids and positions, not yet embeddings.
    """

    cache: PagedContextCache
    placement: DraftBlockPlacement
    inputs: DraftBlockInputs
    entries: tuple[torch.Tensor, ...]


def build_paged_batch(
    drafter: Drafter,
    features: Sequence[torch.Tensor],
    bonus: torch.Tensor,
    *,
    committed: Sequence[int],
    num_draft_tokens: int,
    page_size: int,
    slots: Sequence[int] | None = None,
    page_permutation: torch.Tensor | None = None,
    fill_seed: int | None = 0,
) -> PagedBatch:
    """Write each request's context into a private paged pool and place its next block.

    ``features[b]: [n_ctx_b, n_cap * H_t]`` are projected with ``drafter.project_context`` at
    positions ``0 .. n_ctx_b - 1`` (one call for the whole batch) and written column by column into
    the pages of request ``b``'s slot. The pool has ``G + 1`` slots (the last is the dummy) of
    ``ceil((max_ctx + W) / P_sz)`` pages each, ``max_ctx = max(n_ctx) + K``; the page table is
    ``page_permutation`` (default ``arange``) viewed as ``[G + 1, pages_per_slot]`` (spec 4.2).
    ``slots`` (default ``0 .. G-1``) gives each request's slot. Pages and columns that hold no
    context are filled with random values from ``fill_seed`` (zeros when ``None``), so a drafter
    that reads outside ``num_ctx`` or another request's pages changes its output.

    The placement follows spec 4.4 for ``c_b = n_ctx_b - committed[b]``, ``n_b = committed[b]``:
    ``num_ctx = new_ctx_len = n_ctx_b`` and ``query_positions = n_ctx_b + j``. The block is
    ``[bonus, mask, ...]`` of width ``W = capabilities.block_width(K)``.
    """
    caps = drafter.capabilities
    spec = caps.context_entry
    dtype = torch_dtype(caps)
    g, k1 = len(features), num_draft_tokens + 1
    width = caps.block_width(num_draft_tokens)
    lengths = [int(f.shape[0]) for f in features]
    if len(committed) != g or bonus.shape != (g,):
        raise ConfigError(f"build_paged_batch needs {g} committed counts and bonus tokens")
    max_ctx, pages_per_slot, total_pages = page_geometry(
        lengths, num_draft_tokens, width, page_size
    )
    num_slots = g + 1
    perm = torch.arange(total_pages) if page_permutation is None else page_permutation.to(_I64)
    if not torch.equal(perm.sort().values, torch.arange(total_pages)):
        raise ConfigError(f"page_permutation must be a permutation of 0..{total_pages - 1}")
    table = perm.view(num_slots, pages_per_slot)
    slot_ids = list(range(g)) if slots is None else [int(s) for s in slots]
    if len(set(slot_ids)) != g or not all(0 <= s < num_slots - 1 for s in slot_ids):
        raise ConfigError(f"slots must be {g} distinct slots in 0..{num_slots - 2}, got {slot_ids}")
    slots_t = torch.tensor(slot_ids, dtype=_I64)

    positions = torch.cat([torch.arange(n, dtype=_I64) for n in lengths])
    projected = drafter.project_context(torch.cat(list(features)), positions)
    want = (int(positions.shape[0]), spec.num_layers, spec.planes, spec.heads, spec.width)
    if tuple(projected.shape) != want:
        _fail(
            f"project_context returned shape {tuple(projected.shape)}; the capabilities declare "
            f"entries [T, L, planes, heads, width] = {want} ({spec.kind.value})"
        )
    entries = tuple(projected.split(lengths))

    pool_shape = (spec.num_layers, total_pages, spec.planes, spec.heads, page_size, spec.width)
    if fill_seed is None:
        pool = torch.zeros(pool_shape, dtype=dtype)
    else:
        pool = torch.randn(pool_shape, generator=torch.Generator().manual_seed(fill_seed)) * 3
        pool = pool.to(dtype)
    for b, ent in enumerate(entries):
        cols = torch.arange(lengths[b])
        # pages, offsets: [n]; the advanced indices land first: [n, L, planes, heads, width]
        pool[:, table[slot_ids[b], cols // page_size], :, :, cols % page_size, :] = ent.to(dtype)

    n_ctx = torch.tensor(lengths, dtype=_I64)
    n_b = torch.tensor(list(committed), dtype=_I64)
    c_b = n_ctx - n_b
    j = torch.arange(k1, dtype=_I64)
    ctx_positions = (c_b[:, None] + j).contiguous()
    dest_cols = ctx_positions.clamp(max=max_ctx - 1)
    rows = table[slots_t]
    query_positions = (n_ctx[:, None] + torch.arange(width, dtype=_I64)).contiguous()
    placement = DraftBlockPlacement(
        slots=slots_t,
        cache_rows=slots_t.clone(),
        rows_start=None,
        bonus=bonus.to(_I64).clone(),
        query_positions=query_positions,
        ctx_positions=ctx_positions,
        write_mask=(j[None, :] < n_b[:, None]).contiguous(),
        dest_cols=dest_cols,
        dest_pages=torch.gather(rows, 1, dest_cols // page_size),
        dest_offsets=dest_cols % page_size,
        num_ctx=n_ctx.clone(),
        new_ctx_len=n_ctx.clone(),
        block_tables=rows.contiguous(),
        page_size=page_size,
    )
    token_ids = torch.full((g, width), caps.mask_token_id, dtype=_I64)
    token_ids[:, 0] = bonus
    inputs = DraftBlockInputs(token_ids=token_ids, positions=query_positions.clone())
    cache = PagedContextCache(pool=pool, page_size=page_size)
    return PagedBatch(cache=cache, placement=placement, inputs=inputs, entries=entries)


@dataclass(frozen=True, eq=False)
class ProbeOutputs:
    """Everything a drafter returned for one probe.

    ``entries: [T, L, planes, heads, width]``, ``embeddings, hidden: [G, W, H]``, ``logits`` over
    ``G * W`` rows, ``markov`` (or ``None``), ``confidence: [G, K] fp32`` (or ``None``).
    """

    entries: torch.Tensor
    embeddings: torch.Tensor
    hidden: torch.Tensor
    logits: LogitsShard
    markov: MarkovHeadWeights | None
    confidence: torch.Tensor | None
    pool_before: torch.Tensor = field(repr=False)
    pool_after: torch.Tensor = field(repr=False)


def run_probe(
    drafter: Drafter,
    probe: Probe,
    case: ConformanceCase,
    *,
    head: OutputHead | None = None,
    slots: Sequence[int] | None = None,
    page_permutation: torch.Tensor | None = None,
    fill_seed: int | None = 0,
) -> ProbeOutputs:
    """Call every contract method once on ``probe`` (``head`` defaults to the full probe head)."""
    caps = drafter.capabilities
    batch = build_paged_batch(
        drafter,
        probe.features,
        probe.bonus,
        committed=case.committed,
        num_draft_tokens=case.num_draft_tokens,
        page_size=case.page_size,
        slots=slots,
        page_permutation=page_permutation,
        fill_seed=fill_seed,
    )
    embeddings = drafter.embed_block(batch.inputs.token_ids, probe.target_embedding)
    inputs = replace(batch.inputs, embeddings=embeddings)
    pool_before = batch.cache.pool.clone()
    hidden = drafter.forward_block(inputs, batch.placement, batch.cache)
    if head is None:
        head = OutputHead(weight=probe.head_weight, vocab_start=0, vocab_size=caps.vocab_size)
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3:
        _fail(f"forward_block must return hidden [G, W, H], got {_describe(hidden)}")
    logits = drafter.block_logits(hidden.reshape(-1, hidden.shape[-1]), head)
    confidence = None
    if caps.confidence_head:
        first, k = caps.first_draft_slot, case.num_draft_tokens
        confidence = drafter.confidence(hidden[:, first:first + k], probe.prev_tokens)
    return ProbeOutputs(
        entries=torch.cat(batch.entries),
        embeddings=embeddings,
        hidden=hidden,
        logits=logits,
        markov=drafter.markov_head(),
        confidence=confidence,
        pool_before=pool_before,
        pool_after=batch.cache.pool,
    )


def _describe(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)} and dtype {str(x.dtype).removeprefix('torch.')}"
    return f"a {type(x).__name__}"


def _expect_tensor(name: str, x: object, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    if not isinstance(x, torch.Tensor) or tuple(x.shape) != shape or x.dtype != dtype:
        want = f"shape {shape} and dtype {str(dtype).removeprefix('torch.')}"
        _fail(f"{name} must be a tensor of {want}, got {_describe(x)}")


# ---- the checks -----------------------------------------------------------------------------


def load_drafter(family: DrafterFamily, request: LoadRequest) -> Drafter:
    """``family.load(request)``; :class:`ConformanceFailure` for a family without a loader."""
    if family.load is None:
        _fail(
            f"drafter family {family.name!r} has no loader (DrafterFamily.load is None); "
            "the conformance kit needs a real model"
        )
    return family.load(request)


def check_capabilities(
    family: DrafterFamily, drafter: Drafter, case: ConformanceCase, request: LoadRequest | None = None
) -> None:
    """The declared capabilities are well-formed and match what the methods return."""
    missing = [
        name
        for name in (
            "capabilities", "project_context", "embed_block", "forward_block", "block_logits",
            "markov_head", "confidence", "save",
        )
        if not hasattr(drafter, name)
    ]
    if missing or not isinstance(drafter, Drafter):
        _fail(f"{family.name}: the drafter lacks Drafter Protocol members {missing}")
    caps = drafter.capabilities
    if not isinstance(caps, DrafterCapabilities):
        _fail(f"{family.name}: capabilities must be a DrafterCapabilities, got {_describe(caps)}")
    if caps.family != family.name:
        _fail(f"capabilities.family is {caps.family!r} but the family is registered as {family.name!r}")
    if drafter.capabilities != caps or hash(drafter.capabilities) != hash(caps):
        _fail(f"{family.name}: capabilities changed between two reads; declare them once")
    torch_dtype(caps)
    width = caps.block_width(case.num_draft_tokens)
    if width > caps.trained_block_size:
        raise ConfigError(
            f"the conformance case's K = {case.num_draft_tokens} gives W = {width} > "
            f"trained_block_size {caps.trained_block_size}; use a smaller num_draft_tokens"
        )
    if max(case.context_lengths) + case.num_draft_tokens + width > caps.max_position_embeddings:
        raise ConfigError("the conformance case's contexts exceed max_position_embeddings")
    target = request.target if request is not None else None
    if target is not None:
        if caps.vocab_size != target.vocab_size:
            _fail(f"capabilities.vocab_size {caps.vocab_size} != the target's {target.vocab_size}")
        if caps.target_hidden_size != target.hidden_size:
            _fail(
                f"capabilities.target_hidden_size {caps.target_hidden_size} != the target's "
                f"hidden size {target.hidden_size}"
            )
        # -1 is the embedding output (spec 1.2, 1.3); the last layer holds a final-normed state.
        bad = [i for i in caps.target_layer_ids
               if i != -1 and not 0 <= i < target.num_layers - 1]
        if bad:
            _fail(
                f"target_layer_ids {bad} are outside {{-1}} ∪ 0..{target.num_layers - 2} (-1 is "
                "the embedding output; the target's last layer cannot be captured, spec 9.12)"
            )

    probe = make_probe(caps, case)
    out = run_probe(drafter, probe, case)
    spec = caps.context_entry
    got = tuple(out.entries.shape[1:])
    if got != (spec.num_layers, spec.planes, spec.heads, spec.width):
        _fail(f"project_context entries are {got}, capabilities declare {spec}")
    if out.hidden.shape[-1] != caps.hidden_size:
        _fail(f"forward_block hidden width {out.hidden.shape[-1]} != hidden_size {caps.hidden_size}")
    if not isinstance(out.logits, LogitsShard) or out.logits.vocab_size != caps.vocab_size:
        _fail(f"block_logits must return a LogitsShard over vocab_size {caps.vocab_size}")
    if not out.logits.is_full:
        _fail("block_logits with a full-vocabulary head must return full-vocabulary logits")

    markov = out.markov
    if caps.markov_head is MarkovHeadKind.NONE:
        if markov is not None:
            _fail("capabilities declare markov_head 'none' but markov_head() returned weights")
    else:
        if not isinstance(markov, MarkovHeadWeights):
            _fail(
                f"capabilities declare a {caps.markov_head.value} Markov head but markov_head() "
                f"returned {_describe(markov)}"
            )
        if markov.kind is not caps.markov_head or markov.rank != caps.markov_rank:
            _fail(
                f"markov_head() is {markov.kind.value} of rank {markov.rank}; capabilities declare "
                f"{caps.markov_head.value} of rank {caps.markov_rank}"
            )
        if markov.vocab_size != caps.vocab_size or markov.shard_width != caps.vocab_size:
            _fail(
                f"at TP = 1 the Markov head must cover the whole vocabulary {caps.vocab_size}; "
                f"w1 has {markov.vocab_size} rows, w2 {markov.shard_width}"
            )
        if markov.vocab_start != 0:
            _fail(f"at TP = 1 markov_head().vocab_start must be 0, got {markov.vocab_start}")
    if not caps.confidence_head:
        try:
            drafter.confidence(out.hidden[:, : case.num_draft_tokens], probe.prev_tokens)
        except DraftsmithError:
            pass
        else:
            _fail(
                "capabilities declare no confidence head but confidence() returned scores; "
                "raise a DraftsmithError (e.g. PlanError) instead"
            )

    # Shared embedding / head: the declaration must match whether the target's tensors are read.
    ids = torch.full((1, 2), caps.mask_token_id, dtype=_I64)
    ids[0, 0] = probe.bonus[0]
    other_table = probe.target_embedding + 1.0
    same = torch.equal(
        drafter.embed_block(ids, probe.target_embedding), drafter.embed_block(ids, other_table)
    )
    if caps.shares_target_embedding and same:
        _fail("capabilities say shares_target_embedding, but embed_block ignores target_embedding")
    if not caps.shares_target_embedding and not same:
        _fail("capabilities say the drafter has its own embedding, but embed_block reads the target's")
    rows = out.hidden.reshape(-1, caps.hidden_size)[:2]
    heads = [
        OutputHead(weight=w, vocab_start=0, vocab_size=caps.vocab_size)
        for w in (probe.head_weight, probe.head_weight.flip(0).contiguous())
    ]
    same = torch.equal(*(drafter.block_logits(rows, h).logits for h in heads))
    if caps.shares_target_lm_head and same:
        _fail("capabilities say shares_target_lm_head, but block_logits ignores the head it is given")
    if not caps.shares_target_lm_head and not same:
        _fail("capabilities say the drafter has its own LM head, but block_logits reads the target's")
    _check_declared_capabilities(family, caps, request)


def _check_declared_capabilities(family: DrafterFamily, caps: DrafterCapabilities,
                                 request: LoadRequest | None) -> None:
    """The family's ``capabilities(request)`` (what ``draftsmith plan`` plans from) equals what
    the drafter ``load(request)`` built declares."""
    if family.capabilities is None:
        _fail(f"{family.name}: the family has no capabilities(request); give it one that returns "
              "what load(request) declares, found without weights")
    if request is None:
        return
    declared = family.capabilities(request)
    if declared != caps:
        fields = [name for name in DrafterCapabilities.model_fields
                  if getattr(declared, name) != getattr(caps, name)]
        _fail(f"{family.name}: capabilities(request) differs from the loaded drafter's in "
              + "; ".join(f"{name} ({getattr(declared, name)!r} declared, "
                          f"{getattr(caps, name)!r} loaded)" for name in fields))


def check_shapes_and_dtypes(drafter: Drafter, case: ConformanceCase) -> None:
    """Outputs have the contract's shapes and dtypes (for ``case`` and for a one-request batch
    with ``K = 1``), are finite, and neither the pool nor the inputs are written."""
    caps = drafter.capabilities
    one = ConformanceCase(
        context_lengths=case.context_lengths[-1:], committed=(1,), num_draft_tokens=1,
        page_size=case.page_size, seed=case.seed + 1,
    )
    for c in (case, one):
        dtype = torch_dtype(caps)
        probe = make_probe(caps, c)
        snapshot = [t.clone() for t in (*probe.features, probe.bonus, probe.target_embedding,
                                        probe.head_weight, probe.prev_tokens)]
        out = run_probe(drafter, probe, c)
        spec = caps.context_entry
        g, w, h, v = c.num_requests, caps.block_width(c.num_draft_tokens), caps.hidden_size, \
            caps.vocab_size
        t = sum(c.context_lengths)
        _expect_tensor("project_context(...)", out.entries,
                       (t, spec.num_layers, spec.planes, spec.heads, spec.width), dtype)
        _expect_tensor("embed_block(...)", out.embeddings, (g, w, h), dtype)
        _expect_tensor("forward_block(...)", out.hidden, (g, w, h), dtype)
        if not isinstance(out.logits, LogitsShard):
            _fail(f"block_logits must return a LogitsShard, got {_describe(out.logits)}")
        _expect_tensor("block_logits(...).logits", out.logits.logits, (g * w, v), torch.float32)
        if caps.confidence_head:
            _expect_tensor("confidence(...)", out.confidence, (g, c.num_draft_tokens), torch.float32)
        if out.markov is not None:
            for name in ("w1", "w2"):
                if not getattr(out.markov, name).is_floating_point():
                    _fail(f"markov_head().{name} must be floating point")
        for name, x in (("project_context", out.entries), ("embed_block", out.embeddings),
                        ("forward_block", out.hidden), ("block_logits", out.logits.logits),
                        ("confidence", out.confidence)):
            if x is not None and not bool(torch.isfinite(x).all()):
                _fail(f"{name} returned non-finite values on random inputs")
        if not torch.equal(out.pool_before, out.pool_after):
            _fail("forward_block wrote into the context pool; it must only read it")
        after = (*probe.features, probe.bonus, probe.target_embedding, probe.head_weight,
                 probe.prev_tokens)
        if not all(torch.equal(a, b) for a, b in zip(snapshot, after, strict=True)):
            _fail("a drafter method modified its input tensors in place")


@dataclass(frozen=True)
class _Tolerance:
    """How two runs that may reorder arithmetic are compared (see ``ConformanceCase.rtol``)."""

    rtol: float
    atol: float
    row_norm: bool
    """Compare each row's difference with the row's norm instead of element by element."""


def _tolerances(caps: DrafterCapabilities, case: ConformanceCase) -> _Tolerance:
    exact = caps.dtype == "float32"
    rtol, atol = (1e-4, 1e-4) if exact else (2e-2, 2e-3)
    return _Tolerance(case.rtol if case.rtol is not None else rtol,
                      case.atol if case.atol is not None else atol, row_norm=not exact)


def _assert_close(name: str, got: torch.Tensor, want: torch.Tensor, tol: _Tolerance) -> None:
    if got.shape != want.shape:
        _fail(f"{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    if not tol.row_norm:
        try:
            torch.testing.assert_close(got.float(), want.float(), rtol=tol.rtol, atol=tol.atol)
        except AssertionError as exc:
            _fail(f"{name}:\n{exc}")
        return
    # Low precision: ||got_row - want_row|| <= rtol * ||want_row|| + atol * sqrt(row width).
    g, w = got.float(), want.float()
    if g.dim() == 0:
        g, w = g[None], w[None]
    if not bool(torch.isfinite(g).all()) or not bool(torch.isfinite(w).all()):
        if not torch.equal(g.isfinite(), w.isfinite()):
            _fail(f"{name}: non-finite values in one run only")
        g, w = torch.nan_to_num(g), torch.nan_to_num(w)
    diff = (g - w).norm(dim=-1)
    bound = tol.rtol * w.norm(dim=-1) + tol.atol * math.sqrt(w.shape[-1])
    excess = diff - bound
    if bool((excess > 0).any()):
        row = int(excess.flatten().argmax())
        rel = (diff / w.norm(dim=-1).clamp_min(1e-12)).flatten()
        _fail(
            f"{name}: {int((excess > 0).sum())} of {excess.numel()} rows differ by more than "
            f"rtol {tol.rtol} of their norm (+ atol {tol.atol} RMS); worst row {row}: relative "
            f"difference {rel[row].item():.4g}, max abs difference "
            f"{(g - w).abs().max().item():.4g}"
        )


def _compare_outputs(a: ProbeOutputs, b: ProbeOutputs, what: str) -> None:
    """Bit-identity of two probe runs; ``what`` says which runs, for the message."""
    pairs: list[tuple[str, torch.Tensor | None, torch.Tensor | None]] = [
        ("project_context", a.entries, b.entries),
        ("embed_block", a.embeddings, b.embeddings),
        ("forward_block", a.hidden, b.hidden),
        ("block_logits", a.logits.logits, b.logits.logits),
        ("confidence", a.confidence, b.confidence),
    ]
    if (a.markov is None) != (b.markov is None):
        _fail(f"{what}: markov_head() is None in one run only")
    if a.markov is not None and b.markov is not None:
        pairs += [("markov_head().w1", a.markov.w1, b.markov.w1),
                  ("markov_head().w2", a.markov.w2, b.markov.w2)]
    for name, x, y in pairs:
        if (x is None) != (y is None):
            _fail(f"{what}: {name} is None in one run only")
        if x is not None and y is not None and not (x.shape == y.shape and torch.equal(x, y)):
            diff = (x.float() - y.float()).abs().max().item() if x.shape == y.shape else "shape"
            _fail(f"{what}: {name} differs (max abs diff {diff}); it must be bit-identical")


def check_determinism(family: DrafterFamily, request: LoadRequest, case: ConformanceCase) -> None:
    """Two calls, and two loads of one request, give bit-identical outputs; a different seed gives
    different weights when no checkpoint is given."""
    first = load_drafter(family, request)
    probe = make_probe(first.capabilities, case)
    base = run_probe(first, probe, case)
    _compare_outputs(base, run_probe(first, probe, case), "the same drafter called twice")
    second = load_drafter(family, request)
    _compare_outputs(base, run_probe(second, probe, case), "two loads of the same request")
    if request.checkpoint is None:
        reseeded = load_drafter(family, replace(request, seed=request.seed + 1))
        other = run_probe(reseeded, probe, case)
        if torch.equal(base.hidden, other.hidden):
            _fail(
                f"loading with seed {request.seed} and {request.seed + 1} gave identical outputs; "
                "random initialisation must draw from LoadRequest.seed"
            )


def check_checkpoint_round_trip(
    family: DrafterFamily, request: LoadRequest, case: ConformanceCase, directory: Path
) -> None:
    """``save`` writes ``config.json`` and ``*.safetensors`` that load back to a bit-identical
    drafter (whatever the seed of the reload); missing or truncated files raise CheckpointError."""
    directory = Path(directory)
    drafter = load_drafter(family, request)
    probe = make_probe(drafter.capabilities, case)
    base = run_probe(drafter, probe, case)
    saved = directory / "checkpoint"
    drafter.save(saved)
    weights = sorted(saved.glob("*.safetensors"))
    if not (saved / "config.json").is_file() or not weights:
        found = sorted(p.name for p in saved.iterdir()) if saved.is_dir() else "nothing"
        _fail(f"save({saved}) must write config.json and *.safetensors; found {found}")
    reloaded = load_drafter(family, replace(request, checkpoint=saved, seed=request.seed + 7))
    if reloaded.capabilities != drafter.capabilities:
        _fail(
            "capabilities changed across save/load:\n"
            f"  saved:    {drafter.capabilities!r}\n  reloaded: {reloaded.capabilities!r}"
        )
    _compare_outputs(base, run_probe(reloaded, probe, case), "save then load")

    empty = directory / "empty-checkpoint"
    empty.mkdir(exist_ok=True)
    _expect_checkpoint_error(family, replace(request, checkpoint=empty), "an empty directory")
    truncated = directory / "truncated-checkpoint"
    truncated.mkdir(exist_ok=True)
    for path in saved.iterdir():
        if path.is_file():
            data = path.read_bytes()
            cut = len(data) // 2 if path.suffix == ".safetensors" else len(data)
            (truncated / path.name).write_bytes(data[:cut])
    _expect_checkpoint_error(
        family, replace(request, checkpoint=truncated), "a checkpoint with truncated weights"
    )


def _expect_checkpoint_error(family: DrafterFamily, request: LoadRequest, what: str) -> None:
    try:
        load_drafter(family, request)
    except CheckpointError:
        return
    except Exception as exc:  # noqa: BLE001 - reported as the failure
        _fail(f"loading {what} raised {type(exc).__name__}: {exc}; it must raise CheckpointError")
    _fail(f"loading {what} succeeded; it must raise CheckpointError")


def check_page_placement_invariance(drafter: Drafter, case: ConformanceCase) -> None:
    """Outputs are bit-identical whichever slots and pages hold each request's context, and
    whatever the unadvertised columns and other pages contain."""
    caps = drafter.capabilities
    probe = make_probe(caps, case)
    base = run_probe(drafter, probe, case, fill_seed=None)
    g = torch.Generator().manual_seed(case.seed + 17)
    _, _, total = page_geometry(
        case.context_lengths, case.num_draft_tokens, caps.block_width(case.num_draft_tokens),
        case.page_size,
    )
    for trial in range(2):
        perm = torch.randperm(total, generator=g)
        slots = torch.randperm(case.num_requests, generator=g).tolist()
        moved = run_probe(
            drafter, probe, case, slots=slots, page_permutation=perm, fill_seed=case.seed + trial
        )
        if not torch.equal(base.hidden, moved.hidden):
            diff = (base.hidden.float() - moved.hidden.float()).abs().max().item()
            _fail(
                f"forward_block output depends on page placement (slots {slots}, a permuted page "
                f"table, other pages filled with noise): max abs diff {diff}. Read context only "
                "through placement.block_tables and only columns < placement.num_ctx"
            )


def check_request_independence(drafter: Drafter, case: ConformanceCase) -> None:
    """Each request's outputs are those it gets alone in a batch of one (up to the case's
    tolerance: the batch changes GEMM shapes, never what a request attends to)."""
    caps = drafter.capabilities
    probe = make_probe(caps, case)
    batched = run_probe(drafter, probe, case)
    tol = _tolerances(caps, case)
    width = caps.block_width(case.num_draft_tokens)
    starts = [0, *torch.tensor(case.context_lengths).cumsum(0).tolist()]
    for b, (n_ctx, n_b) in enumerate(zip(case.context_lengths, case.committed, strict=True)):
        alone_case = replace(case, context_lengths=(n_ctx,), committed=(n_b,))
        alone_probe = replace(
            probe, features=(probe.features[b],), bonus=probe.bonus[b:b + 1],
            prev_tokens=probe.prev_tokens[b:b + 1],
        )
        alone = run_probe(drafter, alone_probe, alone_case)
        what = f"request {b} alone vs in the batch"
        _assert_close(f"{what}: project_context differs", alone.entries,
                      batched.entries[starts[b]:starts[b + 1]], tol)
        _assert_close(f"{what}: forward_block differs (requests must not see each other)",
                      alone.hidden[0], batched.hidden[b], tol)
        _assert_close(f"{what}: block_logits differs", alone.logits.logits,
                      batched.logits.logits[b * width:(b + 1) * width], tol)
        if batched.confidence is not None and alone.confidence is not None:
            _assert_close(f"{what}: confidence differs", alone.confidence[0],
                          batched.confidence[b], tol)


# ---- tensor parallelism ---------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _RankResult:
    capabilities: DrafterCapabilities | None
    outputs: ProbeOutputs | None
    unsupported: str | None = None


def _tp_rank_worker(payload: bytes, sys_path: list[str]) -> _RankResult:
    """Runs on every rank of a RankPool: load from the TP = 1 checkpoint and run the probe."""
    for entry in reversed(sys_path):  # the pool may predate the caller's sys.path additions
        if entry not in sys.path:
            sys.path.insert(0, entry)
    importlib.invalidate_caches()
    from draftsmith.parallel import world_collectives

    family, request, case, probe = pickle.loads(payload)
    collectives = world_collectives()
    try:
        drafter = load_drafter(family, replace(request, collectives=collectives))
    except (PlanError, ConfigError) as exc:
        return _RankResult(None, None, unsupported=f"{type(exc).__name__}: {exc}")
    caps = drafter.capabilities
    tp, rank = collectives.world_size, collectives.rank
    shard = caps.vocab_size // tp
    head = OutputHead(
        weight=probe.head_weight[rank * shard:(rank + 1) * shard].contiguous(),
        vocab_start=rank * shard,
        vocab_size=caps.vocab_size,
    )
    return _RankResult(caps, run_probe(drafter, probe, case, head=head))




def check_tp_agreement(
    family: DrafterFamily,
    request: LoadRequest,
    case: ConformanceCase,
    rank_pool: RankPool,
    directory: Path,
) -> str | None:
    """TP shards agree with TP = 1; returns a reason instead when the family declares no TP.

    The TP = 1 drafter of ``request`` is saved to ``directory``; every rank of ``rank_pool`` (a
    :class:`draftsmith.parallel.RankPool`) loads that checkpoint with its ``Collectives`` and runs
    the probe with its vocabulary shard of the head. A loader that raises :class:`PlanError` or
    :class:`ConfigError` at ``TP > 1`` declares that the family does not shard; that is reported
    (returned), unless the capabilities list TP fusions, which is a failure. Checks: capabilities
    equal TP = 1 apart from the local head count; context entries replicated or split by heads;
    hidden states and confidence identical on every rank and close to TP = 1; logits shards
    concatenate to the TP = 1 logits; Markov ``w1`` replicated and ``w2`` shards concatenating to
    the full ``w2`` with ``vocab_start = rank * S``.
    """
    tp = int(rank_pool.world_size)
    reference = load_drafter(family, request)
    caps = reference.capabilities
    if tp < 2:
        raise ConfigError("check_tp_agreement needs a rank pool of at least 2 ranks")
    if caps.vocab_size % tp:
        raise ConfigError(
            f"vocab_size {caps.vocab_size} does not split into {tp} shards; choose options with a "
            f"vocabulary divisible by {tp} for the TP check"
        )
    checkpoint = Path(directory) / "tp1-checkpoint"
    reference.save(checkpoint)
    probe = make_probe(caps, case)
    expected = run_probe(reference, probe, case)
    try:
        payload = pickle.dumps((family, replace(request, checkpoint=checkpoint), case, probe))
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        _fail(
            f"the family or its load request cannot be sent to the TP ranks ({exc}); make "
            "DrafterFamily.load a module-level function and the options a module-level model"
        )
    results: list[_RankResult] = rank_pool.run(_tp_rank_worker, payload, list(sys.path))

    unsupported = [r.unsupported for r in results if r.unsupported is not None]
    if unsupported:
        if caps.tp_fusions:
            _fail(
                f"capabilities list TP fusions {sorted(f.value for f in caps.tp_fusions)} but "
                f"loading at TP = {tp} failed: {unsupported[0]}"
            )
        return f"{family.name} declares no TP support (load at TP = {tp}: {unsupported[0]})"

    tol = _tolerances(caps, case)

    def close(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        _assert_close(f"TP = {tp}: {name} disagrees with TP = 1", got, want, tol)

    outs = [r.outputs for r in results]
    for rank, r in enumerate(results):
        assert r.capabilities is not None and r.outputs is not None
        local = r.capabilities.model_copy(update={"context_entry": caps.context_entry})
        if local != caps:
            _fail(f"rank {rank}: capabilities differ from TP = 1 beyond the local head count")
    heads = [r.capabilities.context_entry.heads for r in results]
    if all(h == caps.context_entry.heads for h in heads):
        for rank, o in enumerate(outs):
            close(f"rank {rank} project_context (replicated entries)", o.entries, expected.entries)
    elif sum(heads) == caps.context_entry.heads:
        close("project_context (heads concatenated over ranks)",
              torch.cat([o.entries for o in outs], dim=3), expected.entries)
    else:
        _fail(
            f"ranks hold {heads} context heads; TP = 1 holds {caps.context_entry.heads}. Entries "
            "must be replicated or split by heads across ranks"
        )
    for rank, o in enumerate(outs):
        close(f"rank {rank} embed_block", o.embeddings, expected.embeddings)
        if not torch.equal(o.hidden, outs[0].hidden):
            _fail(f"forward_block differs between rank 0 and rank {rank}; ranks must agree exactly")
        close(f"rank {rank} forward_block", o.hidden, expected.hidden)
        if o.logits.vocab_start != rank * (caps.vocab_size // tp):
            _fail(f"rank {rank}: block_logits vocab_start {o.logits.vocab_start} != "
                  f"{rank * (caps.vocab_size // tp)} of the head shard it was given")
    close("block_logits (shards concatenated)",
          torch.cat([o.logits.logits for o in outs], dim=-1), expected.logits.logits)
    if expected.confidence is not None:
        for rank, o in enumerate(outs):
            if o.confidence is None or not torch.equal(o.confidence, outs[0].confidence):
                _fail(f"confidence differs between rank 0 and rank {rank}")
        close("confidence", outs[0].confidence, expected.confidence)
    if expected.markov is not None:
        starts = 0
        for rank, o in enumerate(outs):
            m = o.markov
            if m is None or m.kind is not expected.markov.kind:
                _fail(f"rank {rank}: markov_head() kind differs from TP = 1")
            if not torch.equal(m.w1, expected.markov.w1):
                _fail(f"rank {rank}: markov_head().w1 must be the replicated full [V, r] table")
            if m.vocab_start != starts:
                _fail(f"rank {rank}: markov_head().vocab_start {m.vocab_start}, expected {starts}")
            starts += m.shard_width
        w2 = torch.cat([o.markov.w2 for o in outs])
        if not torch.equal(w2, expected.markov.w2):
            _fail("markov_head().w2 shards do not concatenate to the TP = 1 w2")
    return None


# ---- everything -----------------------------------------------------------------------------


@dataclass
class ConformanceReport:
    """What :func:`run_conformance` checked, and what it skipped and why."""

    family: str
    passed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def default_request(family: DrafterFamily) -> LoadRequest:
    """Random weights from the family's default options, seed 0, fp32 CPU."""
    try:
        options = family.options_model()
    except Exception as exc:  # noqa: BLE001 - a pydantic ValidationError, reported with advice
        raise ConfigError(
            f"family {family.name!r}: its options model {family.options_model.__name__} has "
            f"required fields ({exc}); give the conformance kit a LoadRequest "
            "(override make_request or the conformance_request fixture)"
        ) from None
    return LoadRequest(options=options)


def run_conformance(
    family: DrafterFamily,
    request: LoadRequest | None = None,
    *,
    directory: Path,
    case: ConformanceCase | None = None,
    rank_pool: RankPool | None = None,
    tp_size: int = 2,
) -> ConformanceReport:
    """Run every check on ``family``; raise :class:`ConformanceFailure` at the first broken one.

    ``directory`` is scratch space for checkpoints. ``rank_pool`` (a
    :class:`draftsmith.parallel.RankPool`) runs the TP check; without one, a pool of ``tp_size``
    gloo ranks is started for it and stopped afterwards (the ranks are spawned processes, so a
    script that calls this needs an ``if __name__ == "__main__":`` guard).
    """
    request = request if request is not None else default_request(family)
    case = case if case is not None else ConformanceCase()
    report = ConformanceReport(family=family.name)
    directory = Path(directory)
    drafter = load_drafter(family, request)
    check_capabilities(family, drafter, case, request)
    report.passed.append("capabilities")
    check_shapes_and_dtypes(drafter, case)
    report.passed.append("shapes_and_dtypes")
    check_determinism(family, request, case)
    report.passed.append("determinism")
    check_checkpoint_round_trip(family, request, case, directory / "round-trip")
    report.passed.append("checkpoint_round_trip")
    check_page_placement_invariance(drafter, case)
    report.passed.append("page_placement_invariance")
    check_request_independence(drafter, case)
    report.passed.append("request_independence")
    if rank_pool is None:
        from draftsmith.parallel import RankPool

        with RankPool(tp_size) as pool:
            reason = check_tp_agreement(family, request, case, pool, directory / "tp")
    else:
        reason = check_tp_agreement(family, request, case, rank_pool, directory / "tp")
    if reason is None:
        report.passed.append("tp_agreement")
    else:
        report.skipped["tp_agreement"] = reason
    return report


__all__ = [
    "ConformanceCase",
    "ConformanceFailure",
    "ConformanceReport",
    "PagedBatch",
    "Probe",
    "ProbeOutputs",
    "build_paged_batch",
    "check_capabilities",
    "check_checkpoint_round_trip",
    "check_determinism",
    "check_page_placement_invariance",
    "check_request_independence",
    "check_shapes_and_dtypes",
    "check_tp_agreement",
    "default_request",
    "load_drafter",
    "make_probe",
    "page_geometry",
    "run_conformance",
    "run_probe",
]
