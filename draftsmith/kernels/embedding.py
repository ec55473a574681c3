"""Embedding lookups as Triton launches: ``embed_rows`` (the rows of a table) and
``embed_rms_norm`` (the rows and their RMSNorm, a decoder's lookup and its first layer's input
norm in one launch), each beside its reference. Both take programmatic dependent launch, so inside
a captured round they start while the kernel before runs, where torch's gather is an ordinary
launch between them. Imports ``draftsmith.contract`` and the kernels' launch helpers only.

Numerics: the rows are the table's bits; the norm is :func:`~draftsmith.kernels.rms_norm.rms_norm`'s
code on them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels import pdl_on
from draftsmith.kernels._launch import ROW_WARPS, block_size, pdl_kwargs, pdl_start, warps_for
from draftsmith.kernels.rms_norm import rms_norm_reference, store_norm


def _check_table(name: str, ids: torch.Tensor, table: torch.Tensor) -> int:
    """``D`` of a float ``table: [V, D]`` with unit column stride on ``ids``' device (``ids:
    [R] int64``, any stride: a column of the decoder's token buffer is read in place)."""
    check_tensor("ids", ids, ("R",), torch.int64)
    if table.ndim != 2 or table.shape[-1] == 0 or table.stride(-1) != 1 \
            or table.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"{name} needs a float table [V, D >= 1] with unit column stride, got "
                         f"{table.dtype} {tuple(table.shape)}")
    if ids.device != table.device:
        raise ShapeError(f"ids are on {ids.device}, the table on {table.device}")
    return int(table.shape[1])


def embed_rows_reference(ids: torch.Tensor, table: torch.Tensor, *,
                         pdl: bool = False) -> torch.Tensor:
    """``table[ids]``: ``ids: [R] int64``, ``table: [V, D]`` -> ``[R, D]``; ``pdl`` is
    ignored."""
    return torch.nn.functional.embedding(ids, table)


@triton.jit
def _embed_rows_kernel(ids_ptr, t_ptr, h_ptr, D, s_ids, s_t, BLOCK_D: tl.constexpr,
                       PDL: tl.constexpr):
    """Program ``r`` copies row ``ids[r]`` of the table to row ``r``."""
    pdl_start(PDL, True)
    r = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    token = tl.load(ids_ptr + r * s_ids)
    tl.store(h_ptr + r * D + d, tl.load(t_ptr + token * s_t + d, mask=ok, other=0.0), mask=ok)


def embed_rows(ids: torch.Tensor, table: torch.Tensor, *, pdl: bool = False) -> torch.Tensor:
    """Kernel form of :func:`embed_rows_reference`, one launch. Ids are not range-checked (an
    id outside ``0 .. V-1`` reads outside the table). ``pdl``: launch with programmatic
    dependent launch where the device has it (:func:`~draftsmith.kernels.pdl_on`)."""
    d = _check_table("embed_rows", ids, table)
    rows = int(ids.shape[0])
    h = torch.empty(rows, d, dtype=table.dtype, device=table.device)
    if rows:
        block = block_size(d)
        on = pdl_on(pdl, table)
        _embed_rows_kernel[(rows,)](ids, table, h, d, ids.stride(0), table.stride(0),
                                    BLOCK_D=block, PDL=on,
                                    num_warps=warps_for(block, ROW_WARPS), **pdl_kwargs(on))
    return h


def embed_rms_norm_reference(ids: torch.Tensor, table: torch.Tensor, weight: torch.Tensor,
                             eps: float, *, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h, y)``: the rows ``h = table[ids]`` (``ids: [R] int64``, ``table: [V, D]``) and
    ``y = rms_norm_reference(h, weight, eps)``, both ``[R, D]``; ``pdl`` is ignored."""
    h = embed_rows_reference(ids, table)
    return h, rms_norm_reference(h, weight, eps)


@triton.jit
def _embed_rms_norm_kernel(ids_ptr, t_ptr, w_ptr, h_ptr, out_ptr, D, eps, s_ids, s_t,
                           BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    """Program ``r`` copies row ``ids[r]`` of the table to ``h`` and normalises it."""
    pdl_start(PDL, True)
    r = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    token = tl.load(ids_ptr + r * s_ids)
    w = tl.load(w_ptr + d, mask=ok, other=0.0)
    x = tl.load(t_ptr + token * s_t + d, mask=ok, other=0.0)
    tl.store(h_ptr + r * D + d, x, mask=ok)
    store_norm(x, w, out_ptr + r * D, d, ok, D, eps)


def embed_rms_norm(ids: torch.Tensor, table: torch.Tensor, weight: torch.Tensor, eps: float, *,
                   pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel form of :func:`embed_rms_norm_reference`, one launch: a decoder's embedding
    lookup and its first layer's input norm. ``h`` has the table's bits; ``y`` those of
    :func:`~draftsmith.kernels.rms_norm.rms_norm` on ``h``. Ids are not range-checked (an id
    outside ``0 .. V-1`` reads outside the table). ``pdl`` as in :func:`embed_rows`."""
    d = _check_table("embed_rms_norm", ids, table)
    check_tensor("weight", weight, (d,), FLOAT_DTYPES, device=table.device)
    rows = int(ids.shape[0])
    h = torch.empty(rows, d, dtype=table.dtype, device=table.device)
    out = torch.empty(rows, d, dtype=torch.promote_types(table.dtype, weight.dtype),
                      device=table.device)
    if rows:
        block = block_size(d)
        on = pdl_on(pdl, table)
        _embed_rms_norm_kernel[(rows,)](ids, table, weight, h, out, d, float(eps),
                                        ids.stride(0), table.stride(0), BLOCK_D=block, PDL=on,
                                        num_warps=warps_for(block, ROW_WARPS), **pdl_kwargs(on))
    return h, out


__all__ = ["embed_rms_norm", "embed_rms_norm_reference", "embed_rows", "embed_rows_reference"]
