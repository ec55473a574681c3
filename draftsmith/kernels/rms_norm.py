"""RMSNorm of rows in one launch, beside its reference; ``store_norm``, the normalise-and-store
step of one row, which ``add_rms_norm`` shares.

The drafters' and the target's layers call it on every block forward; in eager torch it is a
chain of six elementwise kernels (upcast, square, mean, rsqrt, scale, downcast, weight), which
inside a captured round cost launch latency, not bandwidth. Imports ``draftsmith.contract`` and
the kernels' launch helpers only.

Numerics: the mean of squares is an fp32 sum in another order than torch's, so outputs may differ
from the reference by one rounding of the output dtype; every other step rounds where the
reference rounds (the normalised value to the input dtype, the weight product to the output
dtype).
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


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, *,
                       pdl: bool = False) -> torch.Tensor:
    """``x: [..., D]`` normalised over the last dim in fp32, cast back to ``x``'s dtype, times
    ``weight: [D]`` (Qwen3 / Llama RMSNorm)::

        y = weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)

    ``pdl`` (the kernel form's launch option) is accepted and ignored.
    """
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


@triton.jit
def store_norm(x, w, out_ptr, d, ok, D, eps):
    """Store ``weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)`` of one row ``x [BLOCK_D]``
    (masked by ``ok``) at ``out_ptr + d``, rounded where the reference rounds. ``w [BLOCK_D]``:
    the weight, loaded by the caller with the row, before its first store: a load after the
    sum of squares (a barrier across warps) or after a store waits for them, one more round
    trip to memory in series."""
    h = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / D + eps)
    y = (h * inv).to(x.dtype)
    out = w.to(tl.float32) * y.to(tl.float32)
    tl.store(out_ptr + d, out.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, D, eps, s_x, s_out, BLOCK_D: tl.constexpr,
                     PDL: tl.constexpr):
    """Program ``r`` normalises row ``r``."""
    pdl_start(PDL, True)
    r = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    x = tl.load(x_ptr + r * s_x + d, mask=ok, other=0.0)
    w = tl.load(w_ptr + d, mask=ok, other=0.0)
    store_norm(x, w, out_ptr + r * s_out, d, ok, D, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *,
             pdl: bool = False) -> torch.Tensor:
    """Kernel form of :func:`rms_norm_reference`: one launch for every row of ``x: [..., D]``
    (last dim contiguous); the output dtype is the reference's (``weight`` times ``x``).
    ``pdl``: launch with programmatic dependent launch where the device has it
    (:func:`~draftsmith.kernels.pdl_on`), letting the next kernel start at once."""
    if x.ndim < 1 or x.shape[-1] == 0 or x.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"rms_norm needs float x [..., D >= 1], got {x.dtype} {tuple(x.shape)}")
    d = int(x.shape[-1])
    check_tensor("weight", weight, (d,), FLOAT_DTYPES, device=x.device)
    rows = unit_rows(x, d)
    out = torch.empty(rows.shape, dtype=torch.promote_types(x.dtype, weight.dtype),
                      device=x.device)
    if rows.shape[0]:
        block = block_size(d)
        on = pdl_on(pdl, x)
        _rms_norm_kernel[(rows.shape[0],)](rows, weight, out, d, float(eps), rows.stride(0),
                                           out.stride(0), BLOCK_D=block, PDL=on,
                                           num_warps=warps_for(block, ROW_WARPS),
                                           **pdl_kwargs(on))
    return out.view(x.shape)


__all__ = ["rms_norm", "rms_norm_reference", "store_norm"]
