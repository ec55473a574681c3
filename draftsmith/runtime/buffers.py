"""Every persistent buffer of the decoding step, allocated once at bind, so a
captured CUDA graph always reads the same addresses.

Sizes come from the slot capacity and ``K``, never from a graph bucket. Indices such as
``dummy_slot_row = slot_capacity`` are recorded when the buffer is allocated. A bucket of ``g``
generation rows gets :class:`BucketView` slices that share storage with these buffers (a test
asserts ``data_ptr`` identity); nothing is allocated inside a capture. Imports ``contract`` only.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from draftsmith.contract import ContextEntrySpec, PagedContextCache, PlanError, ShapeError

_I64 = torch.int64


@dataclass(frozen=True, eq=False)
class _RoundTensors:
    """What a round reads and writes, held by :class:`DecoderBuffers` for every row and by
    :class:`BucketView` for a bucket's rows (shapes: :class:`DecoderBuffers`)."""

    ctx_len: torch.Tensor
    page_table: torch.Tensor
    batch_to_slot: torch.Tensor
    accepted: torch.Tensor
    num_accepted: torch.Tensor
    block_ids: torch.Tensor
    target_len: torch.Tensor
    features: torch.Tensor
    seeds: torch.Tensor
    result: torch.Tensor
    draft_probs: torch.Tensor | None
    dummy_slot_row: int
    verify_tokens: torch.Tensor
    verify_len: torch.Tensor


@dataclass(frozen=True, eq=False)
class BucketView(_RoundTensors):
    """Slices of :class:`DecoderBuffers` for a batch of ``g`` generation rows.

    Slot-indexed tensors (``ctx_len``, ``page_table``, ``draft_probs``) are the base tensors
    themselves: they are indexed by slot, not by batch row, so a bucket never shrinks them.
    """

    g: int


@dataclass(frozen=True, eq=False)
class DecoderBuffers(_RoundTensors):
    """The bind-time buffers. ``C = slot_capacity``, ``num_slots = C + 1`` (the last is the dummy).

    * ``ctx_len: [C+1] int64``, ``page_table: [C+1, pages_per_slot] int64``, ``pool``: the paged
      context cache ``[L, (C+1) * pages_per_slot, planes, heads, P_sz, width]``;
    * per batch row (``[C, ...]``; row ``s`` of a round is slot ``s``): ``batch_to_slot`` (the
      row's drafter slot, or the dummy for a padding row), the round state a round reads and
      writes: ``accepted [C, K+1]`` and ``num_accepted [C]`` (the last round's, whose bonus
      anchors the next block), ``target_len [C]`` (the anchor's position: committed tokens in
      the target cache), ``features [C, K+1, F]`` (the last round's captured target features),
      ``seeds [C]``; ``result [C, K+3]`` (``[n, nan, accepted...]``, what the host reads;
      ``nan`` is 1 when a committed token came from logits holding NaN), followed, when margins
      are recorded, by ``K+1`` pairs ``(top-1 logit, top-1 minus top-2)`` as fp32 bit patterns;
      ``block_ids [C, W]`` (the block's token ids: the mask token, filled once by the round,
      and in column 0 the bonus, written by each placement);
      ``verify_tokens [C, K+1]`` (bonus and drafts) and ``verify_len [C]`` (admitted drafted
      positions), written by a scheduled round's drafting phase for its verify phase;
    * ``verify_count: [1] int64``: the token count ``T`` the drafting phase chose for the
      packed verify, what the host reads between a scheduled round's two phases, and
      ``verify_rows: [C * (K+1)] int64``: the block's token indices ``b * (K+1) + j``, the
      admitted ones first (the packed verify computes the first ``T``);
    * ``draft_probs: [C+1, K, V] fp32`` (rejection sampling only), indexed by slot;
      ``dummy_slot_row = C``, fixed here.

    Frozen: a captured round holds these tensors' addresses, so they are written in place and
    never replaced.
    """

    slot_capacity: int
    num_draft_tokens: int
    block_width: int
    vocab_size: int
    cache: PagedContextCache
    verify_count: torch.Tensor
    verify_rows: torch.Tensor

    @property
    def num_slots(self) -> int:
        """``slot_capacity + 1``."""
        return self.slot_capacity + 1

    @property
    def dummy_slot(self) -> int:
        """The scratch slot (``slot_capacity``)."""
        return self.slot_capacity

    @classmethod
    def allocate(
        cls,
        *,
        slot_capacity: int,
        num_draft_tokens: int,
        block_width: int,
        vocab_size: int,
        max_ctx: int,
        page_size: int,
        pages_per_slot: int,
        entry: ContextEntrySpec,
        pool_dtype: torch.dtype,
        with_draft_probs: bool,
        feature_width: int = 0,
        feature_dtype: torch.dtype = torch.float32,
        record_margins: bool = False,
        device: torch.device | str = "cpu",
    ) -> DecoderBuffers:
        """Allocate every buffer once for ``slot_capacity`` requests, ``pages_per_slot`` pages
        of ``page_size`` entries per slot (the plan's, :func:`pages_per_slot` of ``max_ctx``).

        :raises PlanError: when the buffers would not fit in the device's memory (estimated
            before anything is allocated), naming ``runtime.max_batch`` and ``max_context``.
        """
        if slot_capacity < 1:
            raise ShapeError(f"slot_capacity must be >= 1, got {slot_capacity}")
        dev = torch.device(device)
        c, k, w = slot_capacity, num_draft_tokens, max(block_width, 1)
        pages = pages_per_slot
        num_slots = c + 1
        pool_shape = _pool_shape(entry, num_slots * pages, page_size)
        needed = buffer_bytes(
            slot_capacity=c, num_draft_tokens=k, block_width=block_width, vocab_size=vocab_size,
            page_size=page_size, pages_per_slot=pages, entry=entry, pool_dtype=pool_dtype,
            with_draft_probs=with_draft_probs, feature_width=feature_width,
            feature_dtype=feature_dtype)
        check_buffers_fit(needed, dev, slot_capacity=c, max_ctx=max_ctx, page_size=page_size)
        zeros = lambda *shape: torch.zeros(shape, dtype=_I64, device=dev)  # noqa: E731
        try:
            return cls(
                slot_capacity=c,
                num_draft_tokens=k,
                block_width=block_width,
                vocab_size=vocab_size,
                ctx_len=zeros(num_slots),
                page_table=torch.arange(num_slots * pages, dtype=_I64, device=dev).view(
                    num_slots, pages),
                cache=PagedContextCache(
                    pool=torch.zeros(pool_shape, dtype=pool_dtype, device=dev), page_size=page_size),
                batch_to_slot=torch.full((c,), c, dtype=_I64, device=dev),
                accepted=zeros(c, k + 1),
                num_accepted=torch.ones(c, dtype=_I64, device=dev),
                block_ids=zeros(c, w),
                target_len=zeros(c),
                features=torch.zeros((c, k + 1, feature_width), dtype=feature_dtype, device=dev),
                seeds=zeros(c),
                result=zeros(c, k + 3 + (2 * (k + 1) if record_margins else 0)),
                draft_probs=(torch.zeros((num_slots, k, vocab_size), dtype=torch.float32, device=dev)
                             if with_draft_probs else None),
                dummy_slot_row=c,
                verify_tokens=zeros(c, k + 1),
                verify_len=zeros(c),
                verify_count=torch.full((1,), c * (k + 1), dtype=_I64, device=dev),
                verify_rows=torch.arange(c * (k + 1), dtype=_I64, device=dev),
            )
        except torch.OutOfMemoryError:  # the estimate fitted, but the memory was taken
            raise PlanError(
                f"out of memory allocating about {needed / 2**30:.1f} GiB of decoder buffers on "
                f"{dev} (runtime.max_batch {c}, runtime.max_context {max_ctx}); lower either"
            ) from None

    def view(self, g: int) -> BucketView:
        """Slices for ``g <= slot_capacity`` rows; shares storage with these buffers."""
        if not 0 <= g <= self.slot_capacity:
            raise ShapeError(f"a bucket of {g} rows does not fit slot_capacity {self.slot_capacity}")
        return BucketView(
            g=g,
            ctx_len=self.ctx_len,
            page_table=self.page_table,
            batch_to_slot=self.batch_to_slot[:g],
            accepted=self.accepted[:g],
            num_accepted=self.num_accepted[:g],
            block_ids=self.block_ids[:g],
            target_len=self.target_len[:g],
            features=self.features[:g],
            seeds=self.seeds[:g],
            result=self.result[:g],
            draft_probs=self.draft_probs,
            dummy_slot_row=self.dummy_slot_row,
            verify_tokens=self.verify_tokens[:g],
            verify_len=self.verify_len[:g],
        )

    def load_slots(self, slots: torch.Tensor, *, first_tokens: torch.Tensor,
                   positions: torch.Tensor, seeds: torch.Tensor,
                   features: torch.Tensor | None) -> None:
        """Start the round state of newly admitted ``slots: [A] int64``: each row's first token
        ``[A]`` is its pending bonus (``n = 1``) at ``positions: [A]`` (the prompt lengths), with
        its ``seeds: [A]`` and the prefill's last target features ``[A, F]``; the rows route to
        their own slots from now on. Index kernels only (no host value is copied): a CUDA graph
        can capture it with ``slots`` on the device."""
        self.accepted.index_fill_(0, slots, 0)
        self.accepted[:, 0].index_copy_(0, slots, first_tokens.to(self.accepted.device, _I64))
        self.num_accepted.index_fill_(0, slots, 1)
        self.target_len.index_copy_(0, slots, positions.to(_I64))
        self.seeds.index_copy_(0, slots, seeds.to(_I64))
        if features is not None:
            self.features.index_fill_(0, slots, 0)
            self.features[:, 0].index_copy_(0, slots, features.to(self.features.dtype))
        self.batch_to_slot.index_copy_(0, slots, slots)

    def reset_slots(self) -> None:
        """Every row a padding row with empty state (after a capture ran rounds on them)."""
        self.ctx_len.zero_()
        self.batch_to_slot.fill_(self.dummy_slot)
        self.accepted.zero_()
        self.num_accepted.fill_(1)
        self.target_len.zero_()
        self.features.zero_()
        self.result.zero_()


def available_bytes(device: torch.device) -> int | None:
    """Memory an allocation on ``device`` can use: free CUDA memory, or the host's physical RAM
    for a CPU device; ``None`` where it cannot be told (the allocation is then not checked)."""
    try:
        if device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(device)
            return int(free)
        if device.type == "cpu":
            return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError, RuntimeError):
        pass
    return None


def pages_per_slot(max_ctx: int, block_width: int, page_size: int) -> int:
    """Pages a slot's drafter context holds: ``ceil((max_ctx + max(W, 1)) / P_sz)``."""
    return -(-(max_ctx + max(block_width, 1)) // page_size)


def _pool_shape(entry: ContextEntrySpec, pages: int, page_size: int) -> tuple[int, ...]:
    return (entry.num_layers, pages, entry.planes, entry.heads, page_size, entry.width)


def buffer_bytes(*, slot_capacity: int, num_draft_tokens: int, block_width: int,
                 vocab_size: int, page_size: int, pages_per_slot: int, entry: ContextEntrySpec,
                 pool_dtype: torch.dtype, with_draft_probs: bool, feature_width: int = 0,
                 feature_dtype: torch.dtype = torch.float32) -> int:
    """Bytes :meth:`DecoderBuffers.allocate` takes for these arguments (the paged pool and the
    per-slot state), computed without allocating: what is checked against the device's memory
    at bind, and before any model loads."""
    c, k, w = slot_capacity, num_draft_tokens, max(block_width, 1)
    pages = pages_per_slot
    num_slots = c + 1
    pool = math.prod(_pool_shape(entry, num_slots * pages, page_size))
    needed = pool * pool_dtype.itemsize + 8 * (num_slots * (pages + 1) + c * (k + w + 3))
    needed += c * (k + 1) * feature_width * feature_dtype.itemsize + 8 * c * (3 * k + 8)
    if with_draft_probs:
        needed += 4 * num_slots * k * vocab_size
    return needed


def check_buffers_fit(needed: int, device: torch.device, *, slot_capacity: int, max_ctx: int,
                      page_size: int, besides: tuple[int, str] | None = None) -> None:
    """Raise :class:`PlanError` before allocating ``needed`` bytes of buffers that cannot fit on
    ``device``, so a typo in ``runtime.max_batch`` reads as a config problem instead of an
    allocator crash. ``besides``: bytes that must fit beside them, and what they are."""
    available = available_bytes(device)
    other, what = besides if besides is not None else (0, "")
    if available is None or needed + other <= available:
        return
    gib = 2**30
    where = "free on" if device.type == "cuda" else "of RAM on"
    beside = f" beside {other / gib:.1f} GiB of {what}" if other else ""
    raise PlanError(
        f"the decoder buffers need about {needed / gib:.1f} GiB{beside} for runtime.max_batch "
        f"{slot_capacity} with a context of {max_ctx} tokens (runtime.max_context) in pages of "
        f"{page_size}, but only "
        f"{available / gib:.1f} GiB are {where} {device}; lower runtime.max_batch or "
        "runtime.max_context"
    )


__all__ = ["BucketView", "DecoderBuffers", "available_bytes", "buffer_bytes",
           "check_buffers_fit"]
