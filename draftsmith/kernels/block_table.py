"""Block-table decode for a host-bound context pool (spec 4.5).

Owns ``decode_block_table``: turns a host KV manager's encoded per-request block offsets
(``pool_block * divisor + field``, negative for unallocated pages) into physical page ids and
per-row allocated-page counts, either into fresh tensors or into bind-time buffers sized by slot
capacity (the graph-safe form of spec 7). Imports ``draftsmith.contract`` only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.kernels._launch import FastLaunch, hooks_installed, raw_stream


def decode_block_table_reference(
    offsets: torch.Tensor,
    divisor: int,
    table: torch.Tensor | None = None,
    counts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode ``offsets: [B, max_blocks] int32/int64`` (the field-0 plane, any strides).

    ``divisor`` is ``kv_factor`` when one layer's view advances by one layer-block, or
    ``num_pool_layers * kv_factor`` when the view spans all layers::

        counts[:B] = (offsets >= 0).sum(1)                 int64, counted before clamping
        table[:B]  = offsets.clamp(min=0) // divisor       int64

    Without buffers the result is ``(table [B, max_blocks], counts [B])``, freshly allocated.
    With ``table: [R, max_blocks] int64`` and ``counts: [R'] int64`` (``R, R' >= B``, bind-time
    buffers) rows ``:B`` are written in place, the rest are left alone, and the buffers
    themselves are returned (as a torch ``out=`` does). Buffers the kernel refuses are refused
    here too (each layout is checked once).

    A negative entry (unallocated) decodes to page 0, which belongs to another request; callers
    bound every write with ``counts`` (spec 4.6).
    """
    if table is None and counts is None:
        enc = offsets.to(torch.int64)
        counts = (enc >= 0).sum(dim=1, dtype=torch.int64)
        return torch.div(enc.clamp(min=0), divisor, rounding_mode="floor"), counts
    # torch's out= would resize a short buffer (moving it away from a captured graph's pointer)
    # and cast a wrong dtype: the reference refuses the buffers the kernel refuses
    layout = None
    if type(offsets) is _T and type(table) is _T and type(counts) is _T:
        layout = _buffer_layout(offsets, divisor, table, counts)
    if layout is None or layout not in _CHECKED_LAYOUTS:
        _check_offsets(offsets, divisor)
        _check_buffers(offsets, table, counts)
        _remember(_CHECKED_LAYOUTS, layout, True)
    enc = offsets.to(torch.int64)
    b = enc.shape[0]
    torch.sum(enc >= 0, dim=1, dtype=torch.int64, out=counts[:b])
    torch.div(enc.clamp(min=0), divisor, rounding_mode="floor", out=table[:b])
    return table, counts


@triton.jit
def _decode_block_table_kernel(
    offsets_ptr, table_ptr, counts_ptr, M, stride_b, stride_m, table_stride_b, table_stride_m,
    counts_stride, divisor, BLOCK: tl.constexpr
):
    """One program per row."""
    b = tl.program_id(0).to(tl.int64)
    total = tl.zeros((BLOCK,), tl.int64)
    for start in range(0, M, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        ok = cols < M
        enc = tl.load(offsets_ptr + b * stride_b + cols.to(tl.int64) * stride_m, mask=ok,
                      other=-1).to(tl.int64)
        total += (enc >= 0).to(tl.int64)
        tl.store(table_ptr + b * table_stride_b + cols.to(tl.int64) * table_stride_m,
                 tl.maximum(enc, 0) // divisor, mask=ok)
    tl.store(counts_ptr + b * counts_stride, tl.sum(total, axis=0))


def _decode_launch_sizes(max_blocks: int) -> int:
    """``BLOCK`` columns per loop step."""
    return max(16, min(triton.next_power_of_2(max(max_blocks, 1)), 1024))


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """``[first, last)`` bytes a non-empty tensor can touch: its address range."""
    reach = sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return t.data_ptr(), t.data_ptr() + (reach + 1) * t.element_size()


def _distinct_elements(t: torch.Tensor) -> bool:
    """Every index of ``t`` names its own element (strides sorted ascending each clear the
    reach of the smaller ones; a sufficient test, exact for the usual slices of a buffer)."""
    reach = 0
    for n, s in sorted(((n, s) for n, s in zip(t.shape, t.stride(), strict=True) if n > 1),
                       key=lambda d: d[1]):
        if s <= reach:
            return False
        reach += (n - 1) * s
    return True


def _check_offsets(offsets: object, divisor: object) -> None:
    if type(offsets) is not _T or offsets.dim() != 2 or offsets.dtype not in _OFFSET_DTYPES:
        check_tensor("decode_block_table: offsets", offsets, ("B", "max_blocks"),
                     _OFFSET_DTYPES)
    if type(divisor) is not int or divisor < 1:
        raise ShapeError(f"decode_block_table: divisor must be an int >= 1 (kv_factor or "
                         f"layers * kv_factor), got {divisor!r}")


def _check_buffers(offsets: torch.Tensor, table: object, counts: object) -> None:
    """Refuse buffers of the wrong kind, too few rows, another device, or shared addresses."""
    if table is None or counts is None:
        raise ShapeError("decode_block_table: pass both table and counts buffers, or neither")
    b, m = offsets.shape
    check_tensor("decode_block_table: table", table, (None, None), torch.int64, None,
                 offsets.device)
    check_tensor("decode_block_table: counts", counts, (None,), torch.int64, None,
                 offsets.device)
    if table.shape[1] != m:
        raise ShapeError(f"decode_block_table: table has {table.shape[1]} columns; it needs "
                         f"max_blocks = {m}, the width of offsets")
    for name, buf in (("table", table), ("counts", counts)):
        if buf.shape[0] < b:
            raise ShapeError(f"decode_block_table: {name} has {buf.shape[0]} rows, fewer than "
                             f"the {b} rows of offsets; size it by slot capacity")
    if not b or not m:
        return
    if not (_distinct_elements(table[:b]) and _distinct_elements(counts[:b])):
        raise ShapeError("decode_block_table: table and counts need one element per entry "
                         "(a buffer with a zero or overlapping stride writes entries over "
                         "each other)")
    spans = {"offsets": _byte_span(offsets), "table": _byte_span(table[:b]),
             "counts": _byte_span(counts[:b])}
    for x, y in (("table", "counts"), ("table", "offsets"), ("counts", "offsets")):
        (lo1, hi1), (lo2, hi2) = spans[x], spans[y]
        if lo1 < hi2 and lo2 < hi1:
            raise ShapeError(f"decode_block_table: the address ranges of {x} and {y} overlap; "
                             "give each its own range (columns of one buffer interleave and "
                             "are refused too)")


def _buffer_layout(offsets: torch.Tensor, divisor: int, table: torch.Tensor,
                   counts: torch.Tensor) -> tuple:
    """Everything the buffer checks and the launch depend on, pointers included (a CUDA
    address names its device, and bind-time buffers keep theirs)."""
    return (offsets.shape, offsets.stride(), divisor, offsets.dtype, offsets.data_ptr(),
            table.shape, table.stride(), table.dtype, table.data_ptr(),
            counts.shape, counts.stride(), counts.dtype, counts.data_ptr())


_SRC, _DST, _CNT = 4, 8, 12
"""Positions of the three data pointers in a :func:`_buffer_layout` key."""


def _remember(cache: dict, key: tuple | None, value: object) -> None:
    """Store with a bound: callers that pass fresh tensors each step would grow it forever."""
    if key is None:
        return
    if len(cache) >= _MAX_BUFFER_PLANS:
        cache.clear()
    cache[key] = value


_LAUNCH = FastLaunch(_decode_block_table_kernel)
_T = torch.Tensor
_OFFSET_DTYPES = (torch.int32, torch.int64)
_BLOCKS: dict[int, int] = {}
_PLANS: dict[tuple, tuple] = {}
"""Direct-launch plans of the allocating form: ``(shape, strides, divisor, dtype, device)`` of
``offsets`` -> ``(B, out size, table geometry, counts geometry, counts byte offset, trailing
args, run, function, packed)``, recorded after a checked launch with a 16-byte aligned
``offsets`` pointer and used only for such pointers (outputs from the caching allocator always
are; the ``counts`` view sits ``B * max_blocks`` elements in, so its alignment is fixed by the
key). A hit implies the checks passed, so the direct path repeats none of them."""
_BUFFER_PLANS: dict[tuple, tuple] = {}
"""Direct-launch plans of the buffered form, keyed by :func:`_buffer_layout` (bind-time buffers
keep their pointers, so the overlap and alignment checks of the recording call hold for every
hit) -> ``(B, trailing args, run, function, packed, device)``."""
_CHECKED_LAYOUTS: dict[tuple, bool] = {}
"""Buffered layouts the reference has checked (it validates each layout once, as the kernel's
plans do)."""
_MAX_BUFFER_PLANS = 256
_I64 = torch.int64


def decode_block_table(
    offsets: torch.Tensor,
    divisor: int,
    table: torch.Tensor | None = None,
    counts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel form of :func:`decode_block_table_reference`; identical output, one launch.

    ``offsets: [B, max_blocks] int32/int64`` (strided views allowed), ``divisor >= 1``.
    Without buffers, returns ``(table [B, max_blocks] int64, counts [B] int64)``, disjoint views
    of one fresh allocation. With ``table: [R, max_blocks] int64`` and ``counts: [R'] int64``
    (``R, R' >= B``, any strides, address ranges disjoint from ``offsets`` and each other) it writes
    rows ``:B`` and returns the buffers: no allocation, so the call is graph-safe (spec 7).
    """
    # the call is host-bound (the kernel runs for about 5 us): a recorded plan skips the checks,
    # raw pointers spare Triton's launcher its per-tensor pointer query (cuPointerGetAttribute),
    # and the allocating form makes its two outputs from one allocation with as_strided
    if type(offsets) is _T and type(divisor) is int:
        if table is None:
            if counts is None:
                dev = offsets.get_device()
                plan = _PLANS.get((offsets.shape, offsets.stride(), divisor, offsets.dtype, dev))
                if plan is not None:
                    src = offsets.data_ptr()
                    if not src & 15 and not hooks_installed():
                        b, size, table_at, counts_at, counts_bytes, tail, run, function, \
                            packed = plan
                        out = offsets.new_empty(size, dtype=_I64)
                        dst = out.data_ptr()
                        run(b, 1, 1, raw_stream(dev), function, packed, None, None, None,
                            src, dst, dst + counts_bytes, *tail)
                        return out.as_strided(*table_at), out.as_strided(*counts_at)
        elif type(table) is _T and type(counts) is _T:
            key = _buffer_layout(offsets, divisor, table, counts)
            plan = _BUFFER_PLANS.get(key)
            if plan is not None and not hooks_installed():
                b, tail, run, function, packed, dev = plan
                run(b, 1, 1, raw_stream(dev), function, packed, None, None, None,
                    key[_SRC], key[_DST], key[_CNT], *tail)
                return table, counts
    _check_offsets(offsets, divisor)
    b, m = offsets.shape
    buffered = table is not None or counts is not None
    if buffered:
        _check_buffers(offsets, table, counts)
    else:
        size, table_at, counts_at = (b * m + b,), ((b, m), (m, 1)), ((b,), (1,), b * m)
        out = offsets.new_empty(size, dtype=_I64)
        table, counts = out.as_strided(*table_at), out.as_strided(*counts_at)
    if not b:
        return table, counts
    stride_b, stride_m = offsets.stride()
    block = _BLOCKS.get(m)
    if block is None:
        block = _BLOCKS[m] = _decode_launch_sizes(m)
    tail = (m, stride_b, stride_m, *table.stride(), counts.stride(0), divisor, block)
    args = (offsets, table, counts, *tail)
    _LAUNCH((b,), args)
    dev = offsets.get_device()
    if dev < 0:
        return table, counts
    if buffered:
        hit = _LAUNCH.handle(dev, args)
        if hit is not None:
            _remember(_BUFFER_PLANS, _buffer_layout(offsets, divisor, table, counts),
                      (b, tail, *hit, dev))
    elif not offsets.data_ptr() & 15:
        hit = _LAUNCH.handle(dev, args)
        if hit is not None:
            key = (offsets.shape, offsets.stride(), divisor, offsets.dtype, dev)
            _PLANS[key] = (b, size, table_at, counts_at, 8 * b * m, tail, *hit)
    return table, counts


__all__ = ["decode_block_table", "decode_block_table_reference"]
