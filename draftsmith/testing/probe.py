"""The probe the conformance checks run: a batch of requests, random inputs derived from a drafter's
capabilities, a paged context and a :class:`DraftBlockPlacement` laid out the way the runtime's
paging component lays them out, one call of every contract method, and the comparison of two
runs (bit for bit, or within a dtype's tolerance where arithmetic may be reordered).

Part of the conformance kit (:mod:`draftsmith.testing.conformance` re-exports the public names);
it does not import pytest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from draftsmith.contract import (
    ConfigError,
    DraftBlockInputs,
    DraftBlockPlacement,
    Drafter,
    DrafterCapabilities,
    DrafterFamily,
    LoadRequest,
    LogitsShard,
    MarkovHeadWeights,
    OutputHead,
    PagedContextCache,
)

_I64 = torch.int64


class ConformanceFailure(AssertionError):
    """A drafter broke a promise of the contract; the message says which and how."""


def fail(message: str) -> None:
    """Raise :class:`ConformanceFailure` with ``message`` (the checks' one way to fail)."""
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
        fail(f"capabilities.dtype {caps.dtype!r} is not a torch floating dtype name")
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
    ``page_permutation`` (default ``arange``) viewed as ``[G + 1, pages_per_slot]``.
    ``slots`` (default ``0 .. G-1``) gives each request's slot. Pages and columns that hold no
    context are filled with random values from ``fill_seed`` (zeros when ``None``), so a drafter
    that reads outside ``num_ctx`` or another request's pages changes its output.

    The placement is the runtime's for ``c_b = n_ctx_b - committed[b]``, ``n_b = committed[b]``:
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
        fail(
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
    block_before = (batch.inputs.token_ids.clone(), batch.inputs.positions.clone())
    embeddings = drafter.embed_block(batch.inputs.token_ids, probe.target_embedding)
    inputs = replace(batch.inputs, embeddings=embeddings)
    pool_before = batch.cache.pool.clone()
    hidden = drafter.forward_block(inputs, batch.placement, batch.cache)
    if not (torch.equal(block_before[0], inputs.token_ids)
            and torch.equal(block_before[1], inputs.positions)):
        fail("embed_block or forward_block wrote into the block's token ids or positions; they "
             "are the runtime's buffers, reused across rounds, and must only be read")
    if head is None:
        head = OutputHead(weight=probe.head_weight, vocab_start=0, vocab_size=caps.vocab_size)
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3:
        fail(f"forward_block must return hidden [G, W, H], got {describe(hidden)}")
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


def describe(x: object) -> str:
    """What ``x`` is, for a failure message: a tensor's shape and dtype, else its type."""
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)} and dtype {str(x.dtype).removeprefix('torch.')}"
    return f"a {type(x).__name__}"


def expect_tensor(name: str, x: object, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """Fail unless ``x`` is a tensor of exactly ``shape`` and ``dtype``."""
    if not isinstance(x, torch.Tensor) or tuple(x.shape) != shape or x.dtype != dtype:
        want = f"shape {shape} and dtype {str(dtype).removeprefix('torch.')}"
        fail(f"{name} must be a tensor of {want}, got {describe(x)}")


def load_drafter(family: DrafterFamily, request: LoadRequest) -> Drafter:
    """``family.load(request)``; :class:`ConformanceFailure` for a family without a loader."""
    if family.load is None:
        fail(
            f"drafter family {family.name!r} has no loader (DrafterFamily.load is None); "
            "the conformance kit needs a real model"
        )
    return family.load(request)


# ---- comparing two runs --------------------------------------------------------------------


@dataclass(frozen=True)
class Tolerance:
    """How two runs that may reorder arithmetic are compared (see ``ConformanceCase.rtol``)."""

    rtol: float
    atol: float
    row_norm: bool
    """Compare each row's difference with the row's norm instead of element by element."""


def tolerances(caps: DrafterCapabilities, case: ConformanceCase) -> Tolerance:
    """The case's tolerances, or the defaults of the drafter's dtype."""
    exact = caps.dtype == "float32"
    rtol, atol = (1e-4, 1e-4) if exact else (2e-2, 2e-3)
    return Tolerance(case.rtol if case.rtol is not None else rtol,
                     case.atol if case.atol is not None else atol, row_norm=not exact)


def assert_close(name: str, got: torch.Tensor, want: torch.Tensor, tol: Tolerance) -> None:
    """Fail unless ``got`` is within ``tol`` of ``want``: element by element, or row by row."""
    if got.shape != want.shape:
        fail(f"{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    if not tol.row_norm:
        try:
            torch.testing.assert_close(got.float(), want.float(), rtol=tol.rtol, atol=tol.atol)
        except AssertionError as exc:
            fail(f"{name}:\n{exc}")
        return
    # Low precision: ||got_row - want_row|| <= rtol * ||want_row|| + atol * sqrt(row width).
    g, w = got.float(), want.float()
    if g.dim() == 0:
        g, w = g[None], w[None]
    if not bool(torch.isfinite(g).all()) or not bool(torch.isfinite(w).all()):
        if not torch.equal(g.isfinite(), w.isfinite()):
            fail(f"{name}: non-finite values in one run only")
        g, w = torch.nan_to_num(g), torch.nan_to_num(w)
    diff = (g - w).norm(dim=-1)
    bound = tol.rtol * w.norm(dim=-1) + tol.atol * math.sqrt(w.shape[-1])
    excess = diff - bound
    if bool((excess > 0).any()):
        row = int(excess.flatten().argmax())
        rel = (diff / w.norm(dim=-1).clamp_min(1e-12)).flatten()
        fail(
            f"{name}: {int((excess > 0).sum())} of {excess.numel()} rows differ by more than "
            f"rtol {tol.rtol} of their norm (+ atol {tol.atol} RMS); worst row {row}: relative "
            f"difference {rel[row].item():.4g}, max abs difference "
            f"{(g - w).abs().max().item():.4g}"
        )


def compare_outputs(a: ProbeOutputs, b: ProbeOutputs, what: str) -> None:
    """Bit-identity of two probe runs; ``what`` says which runs, for the message."""
    pairs: list[tuple[str, torch.Tensor | None, torch.Tensor | None]] = [
        ("project_context", a.entries, b.entries),
        ("embed_block", a.embeddings, b.embeddings),
        ("forward_block", a.hidden, b.hidden),
        ("block_logits", a.logits.logits, b.logits.logits),
        ("confidence", a.confidence, b.confidence),
    ]
    if (a.markov is None) != (b.markov is None):
        fail(f"{what}: markov_head() is None in one run only")
    if a.markov is not None and b.markov is not None:
        pairs += [("markov_head().w1", a.markov.w1, b.markov.w1),
                  ("markov_head().w2", a.markov.w2, b.markov.w2)]
    for name, x, y in pairs:
        if (x is None) != (y is None):
            fail(f"{what}: {name} is None in one run only")
        if x is not None and y is not None and not (x.shape == y.shape and torch.equal(x, y)):
            diff = (x.float() - y.float()).abs().max().item() if x.shape == y.shape else "shape"
            fail(f"{what}: {name} differs (max abs diff {diff}); it must be bit-identical")


__all__ = ["ConformanceCase", "ConformanceFailure", "PagedBatch", "Probe", "ProbeOutputs",
           "build_paged_batch", "load_drafter", "make_probe", "page_geometry", "run_probe"]
