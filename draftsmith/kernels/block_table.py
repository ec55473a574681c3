"""Block-table decode for a host-bound context pool (spec 4.5).

Owns ``decode_block_table``: turns a host KV manager's encoded per-request block offsets
(``pool_block * divisor + field``, negative for unallocated pages) into physical page ids and
per-row allocated-page counts. Imports ``draftsmith.contract`` only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.kernels._launch import FastLaunch, hooks_installed, raw_stream


def decode_block_table_reference(
    offsets: torch.Tensor, divisor: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode ``offsets: [B, max_blocks] int32/int64`` (the field-0 plane, any strides).

    ``divisor`` is ``kv_factor`` when one layer's view advances by one layer-block, or
    ``num_pool_layers * kv_factor`` when the view spans all layers::

        counts = (offsets >= 0).sum(1)                 [B] int64, counted before clamping
        table  = offsets.clamp(min=0) // divisor       [B, max_blocks] int64

    A negative entry (unallocated) decodes to page 0, which belongs to another request; callers
    bound every write with ``counts`` (spec 4.6).
    """
    enc = offsets.to(torch.int64)
    counts = (enc >= 0).sum(dim=1, dtype=torch.int64)
    return torch.div(enc.clamp(min=0), divisor, rounding_mode="floor"), counts


@triton.jit
def _decode_block_table_kernel(
    offsets_ptr, table_ptr, counts_ptr, M, stride_b, stride_m, divisor, BLOCK: tl.constexpr
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
        tl.store(table_ptr + b * M + cols, tl.maximum(enc, 0) // divisor, mask=ok)
    tl.store(counts_ptr + b, tl.sum(total, axis=0))


def _decode_launch_sizes(max_blocks: int) -> int:
    """``BLOCK`` columns per loop step."""
    return max(16, min(triton.next_power_of_2(max(max_blocks, 1)), 1024))


_LAUNCH = FastLaunch(_decode_block_table_kernel)
_BLOCKS: dict[int, int] = {}
_PLANS: dict[tuple, tuple] = {}
"""Direct-launch plans: ``(shape, strides, divisor, dtype, device)`` of ``offsets`` ->
``(B, out size, table geometry, counts geometry, counts byte offset, trailing args, run,
function, packed)``, recorded after a checked launch with a 16-byte aligned ``offsets`` pointer
and used only for such pointers (outputs from the caching allocator always are; the ``counts``
view sits ``B * max_blocks`` elements in, so its alignment is fixed by the key). A hit implies
the checks passed, so the direct path repeats none of them."""
_T = torch.Tensor
_OFFSET_DTYPES = (torch.int32, torch.int64)
_I64 = torch.int64


def decode_block_table(offsets: torch.Tensor, divisor: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel form of :func:`decode_block_table_reference`; identical output, one launch.

    ``offsets: [B, max_blocks] int32/int64`` (strided views allowed), ``divisor >= 1``.
    Returns ``(table [B, max_blocks] int64, counts [B] int64)``, disjoint views of one fresh
    allocation.
    """
    # the call is host-bound (the kernel runs for about 5 us): a recorded plan skips the checks,
    # one allocation holds both outputs, as_strided makes each view in one call, and raw
    # pointers spare Triton's launcher its per-tensor pointer query (cuPointerGetAttribute)
    if type(offsets) is _T and type(divisor) is int:
        dev = offsets.get_device()
        plan = _PLANS.get((offsets.shape, offsets.stride(), divisor, offsets.dtype, dev))
        if plan is not None:
            src = offsets.data_ptr()
            if not src & 15 and not hooks_installed():
                b, size, table_at, counts_at, counts_bytes, tail, run, function, packed = plan
                out = offsets.new_empty(size, dtype=_I64)
                dst = out.data_ptr()
                run(b, 1, 1, raw_stream(dev), function, packed, None, None, None,
                    src, dst, dst + counts_bytes, *tail)
                return out.as_strided(*table_at), out.as_strided(*counts_at)
    if type(offsets) is not _T or offsets.dim() != 2 or offsets.dtype not in _OFFSET_DTYPES:
        check_tensor("offsets", offsets, ("B", "max_blocks"), _OFFSET_DTYPES)
    if type(divisor) is not int or divisor < 1:
        raise ShapeError(f"divisor must be an int >= 1 (kv_factor or layers * kv_factor), "
                         f"got {divisor!r}")
    b, m = offsets.shape
    size, table_at, counts_at = (b * m + b,), ((b, m), (m, 1)), ((b,), (1,), b * m)
    out = offsets.new_empty(size, dtype=_I64)
    table, counts = out.as_strided(*table_at), out.as_strided(*counts_at)
    if not b:
        return table, counts
    stride_b, stride_m = offsets.stride()
    block = _BLOCKS.get(m)
    if block is None:
        block = _BLOCKS[m] = _decode_launch_sizes(m)
    tail = (m, stride_b, stride_m, divisor, block)
    args = (offsets, table, counts, *tail)
    _LAUNCH((b,), args)
    dev = offsets.get_device()
    if dev >= 0 and not offsets.data_ptr() & 15:
        hit = _LAUNCH.handle(dev, args)
        if hit is not None:
            key = (offsets.shape, offsets.stride(), divisor, offsets.dtype, dev)
            _PLANS[key] = (b, size, table_at, counts_at, 8 * b * m, tail, *hit)
    return table, counts


__all__ = ["decode_block_table", "decode_block_table_reference"]
