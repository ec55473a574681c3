"""Drafter context paging: slots, the per-step placement and the context store.

Owns :class:`SlotManager` (slot assignment, the dummy slot) and
:class:`ContextPager` (prefill context store, per-step ``place`` + ``store``). The fused Triton
kernels and their eager references sit behind one method each, chosen by the plan. Hot path: must
not import pluggy, the registry or bind.
"""

from __future__ import annotations

import heapq
from typing import Literal

import torch

from draftsmith.contract import ConfigError, DraftBlockPlacement, PlanError, ShapeError
from draftsmith.kernels.context_store import (
    store_context,
    store_context_reference,
    store_context_rows,
    store_context_rows_reference,
)
from draftsmith.kernels.paging import prepare_placement, prepare_placement_reference
from draftsmith.runtime.buffers import DecoderBuffers

_I64 = torch.int64


class SlotManager:
    """Hands out slots ``0 .. C-1``, lowest first; slot ``C`` is the dummy and is never handed
    out (padding rows write there). A slot's drafter context length is zeroed when it is assigned
    and when it is released, so a freed slot never advertises a stale context."""

    def __init__(self, slot_capacity: int, ctx_len: torch.Tensor) -> None:
        if ctx_len.shape != (slot_capacity + 1,):
            raise ShapeError(f"ctx_len must be [{slot_capacity + 1}], got {tuple(ctx_len.shape)}")
        self.slot_capacity = slot_capacity
        self.dummy_slot = slot_capacity
        self.ctx_len = ctx_len
        self._free = list(range(slot_capacity))  # a heap: rounds stay in the smallest bucket
        self._slots: dict[int, int] = {}

    @property
    def num_free(self) -> int:
        """Slots available for new requests."""
        return len(self._free)

    def assign(self, request_id: int) -> int:
        """Give ``request_id`` the lowest free slot (its context starts empty)."""
        if request_id in self._slots:
            raise PlanError(f"request {request_id} already holds slot {self._slots[request_id]}")
        if not self._free:
            raise PlanError(
                f"all {self.slot_capacity} slots are taken; raise runtime.max_batch or wait for a "
                "request to finish"
            )
        slot = heapq.heappop(self._free)
        self._slots[request_id] = slot
        self.ctx_len[slot].fill_(0)  # a fill kernel: no host-to-device copy
        return slot

    def release(self, request_id: int) -> int:
        """Return ``request_id``'s slot to the pool, its context emptied."""
        slot = self._slots.pop(request_id)
        heapq.heappush(self._free, slot)
        self.ctx_len[slot].fill_(0)  # a fill kernel: no host-to-device copy
        return slot

    def slot(self, request_id: int | None) -> int:
        """The slot of ``request_id``; the dummy for padding (``None``) or unknown ids."""
        if request_id is None:
            return self.dummy_slot
        return self._slots.get(request_id, self.dummy_slot)


class ContextPager:
    """The private paged pool of one decoder: placement of each step and the context stores."""

    def __init__(
        self,
        buffers: DecoderBuffers,
        *,
        max_ctx: int,
        block_width: int,
        mode: Literal["eager", "fused"],
    ) -> None:
        self.buffers = buffers
        self.max_ctx = max_ctx
        self.block_width = block_width
        self.mode = mode
        self.page_size = buffers.cache.page_size

    @property
    def ctx_len(self) -> torch.Tensor:
        """``[num_slots] int64``: stored context positions per slot."""
        return self.buffers.ctx_len

    def store_prefill(self, slot: int, entries: torch.Tensor, start: int = 0) -> None:
        """Write a prefill chunk's entries ``[T, L, planes, heads, width]`` at positions
        ``start .. start + T - 1`` of ``slot``, then set ``ctx_len[slot] = start + T``.

        A first chunk (``start == 0``) resets the slot.
        """
        t = int(entries.shape[0])
        if start + t > self.max_ctx:
            raise ConfigError(
                f"a prefill of {start + t} positions exceeds the drafter context limit "
                f"{self.max_ctx}; shorten the prompt or raise runtime.max_context"
            )
        if t:
            dev = self.ctx_len.device
            cols = torch.arange(start, start + t, dtype=_I64, device=dev)
            pages = self.buffers.page_table[slot, cols // self.page_size].contiguous()
            offsets = (cols % self.page_size).contiguous()
            mask = torch.ones(t, dtype=torch.bool, device=dev)
            store = store_context_rows if self.mode == "fused" else store_context_rows_reference
            store(self.buffers.cache.pool, entries.contiguous(), pages, offsets, mask)
        self.ctx_len[slot] = start + t

    def store_prompt(self, slot: torch.Tensor, entries: torch.Tensor,
                     count: torch.Tensor) -> None:
        """Write the first ``count[i]`` of prompt ``i``'s entries at positions
        ``0 .. count[i] - 1`` of ``slot[i]`` and set ``ctx_len[slot] = count`` (``slot``,
        ``count``: ``[G] int64`` on the device; ``entries: [G * T, L, planes, heads, width]``,
        prompt-major; no host read, graph-capturable). Entries at and after ``count[i]`` write
        zeros at their positions: beyond the context, never attended, and overwritten by the
        rounds that reach them."""
        g = int(slot.shape[0])
        t = int(entries.shape[0]) // g
        if t > self.max_ctx:
            raise ConfigError(f"a prefill of {t} positions exceeds the drafter context limit "
                              f"{self.max_ctx}; shorten the prompt or raise runtime.max_context")
        if t:
            cols = torch.arange(t, dtype=_I64, device=self.ctx_len.device)
            pages = self.buffers.page_table.index_select(0, slot)[:, cols // self.page_size]
            offsets = (cols % self.page_size).expand(g, t)
            store = store_context_rows if self.mode == "fused" else store_context_rows_reference
            store(self.buffers.cache.pool, entries.contiguous(), pages.reshape(-1),
                  offsets.reshape(-1), (cols[None, :] < count[:, None]).reshape(-1))
        self.ctx_len.index_copy_(0, slot, count)

    def place(
        self, batch_to_slot: torch.Tensor, accepted: torch.Tensor, num_accepted: torch.Tensor
    ) -> DraftBlockPlacement:
        """Advance ``ctx_len`` by each row's ``n`` and place the next block; each row's bonus
        also becomes the block's first token, column 0 of ``block_ids`` (the other columns hold
        the mask token the round filled them with once).

        ``batch_to_slot: [g] int64``, ``accepted: [g, K+1] int64``, ``num_accepted: [g] int64``.
        """
        fn = prepare_placement if self.mode == "fused" else prepare_placement_reference
        g = batch_to_slot.shape[0]
        return fn(
            self.ctx_len, batch_to_slot.contiguous(), accepted.contiguous(),
            num_accepted.contiguous(), self.buffers.page_table, self.max_ctx, self.block_width,
            self.page_size, self.buffers.dummy_slot, self.buffers.block_ids[:g],
        )

    def store(self, placement: DraftBlockPlacement, entries: torch.Tensor) -> None:
        """Write the step's new context entries ``[g*(K+1), L, planes, heads, width]`` (masked)."""
        fn = store_context if self.mode == "fused" else store_context_reference
        fn(self.buffers.cache.pool, entries.contiguous(), placement.dest_pages,
           placement.dest_offsets, placement.write_mask)


__all__ = ["ContextPager", "SlotManager"]
