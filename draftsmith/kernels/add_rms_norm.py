"""A pre-norm block's residual add and the next RMSNorm in one launch, beside its reference.

Imports ``draftsmith.contract``, ``kernels.rms_norm`` (the norm's reference and its store step)
and the kernels' launch helpers only. Numerics: the sum rounds to the inputs' dtype as torch's
add does; the norm is :mod:`draftsmith.kernels.rms_norm`'s.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels import pdl_on
from draftsmith.kernels._launch import (
    ROW_WARPS,
    block_size,
    pdl_kwargs,
    pdl_start,
    unit_rows,
    warps_for,
)
from draftsmith.kernels.rms_norm import rms_norm_reference, store_norm


def add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float, *, pdl: bool = False
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual`` (rounded to their dtype) and ``rms_norm_reference(h)``: a pre-norm
    block's residual add and the next norm. ``x, residual: [..., D]``, ``weight: [D]``.
    ``pdl`` (the kernel form's launch option) is accepted and ignored."""
    h = x + residual
    return h, rms_norm_reference(h, weight, eps)


@triton.jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, sum_ptr, out_ptr, D, eps, s_x, s_r, s_s, s_out,
                         BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    """Program ``r``: row ``r`` of ``x + residual``, stored, and its norm."""
    pdl_start(PDL, True)
    r = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    x = tl.load(x_ptr + r * s_x + d, mask=ok, other=0.0)
    res = tl.load(r_ptr + r * s_r + d, mask=ok, other=0.0)
    w = tl.load(w_ptr + d, mask=ok, other=0.0)
    h = (x.to(tl.float32) + res.to(tl.float32)).to(x.dtype)
    tl.store(sum_ptr + r * s_s + d, h, mask=ok)
    store_norm(h, w, out_ptr + r * s_out, d, ok, D, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float, *, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel form of :func:`add_rms_norm_reference` (one launch): ``x, residual: [..., D]`` of
    one dtype with a contiguous last dim, ``weight: [D]``. ``pdl``: launch with programmatic
    dependent launch where the device has it (:func:`~draftsmith.kernels.pdl_on`)."""
    d = int(x.shape[-1]) if x.ndim else 0
    check_tensor("weight", weight, (d,), FLOAT_DTYPES, device=x.device)
    check_tensor("residual", residual, tuple(x.shape), x.dtype, device=x.device)
    if x.dtype not in FLOAT_DTYPES or d == 0:
        raise ShapeError(f"add_rms_norm needs float x [..., D >= 1], got {x.dtype} "
                         f"{tuple(x.shape)}")
    rows, res = unit_rows(x, d), unit_rows(residual, d)
    total = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    out = torch.empty(rows.shape, dtype=torch.promote_types(x.dtype, weight.dtype),
                      device=x.device)
    if rows.shape[0]:
        block = block_size(d)
        on = pdl_on(pdl, x)
        _add_rms_norm_kernel[(rows.shape[0],)](
            rows, res, weight, total, out, d, float(eps), rows.stride(0), res.stride(0),
            total.stride(0), out.stride(0), BLOCK_D=block, PDL=on,
            num_warps=warps_for(block, ROW_WARPS), **pdl_kwargs(on))
    return total.view(x.shape), out.view(x.shape)


__all__ = ["add_rms_norm", "add_rms_norm_reference"]
