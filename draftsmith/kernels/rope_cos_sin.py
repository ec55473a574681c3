"""RoPE's ``cos`` and ``sin`` tables of a batch of positions in one launch, beside its reference.

The drafters build these tables on every block forward (``drafters.nn.rope_cos_sin``); in eager
torch they are a product, a concatenation, two functions, two scalings and two casts. Imports
``draftsmith.contract`` and the kernels' launch helpers only. Numerics: the angles are the
reference's fp32 products; ``cos`` and ``sin`` are Triton's (``tl.cos``, ``tl.sin``), not torch's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels import pdl_on
from draftsmith.kernels._launch import block_size, pdl_kwargs, pdl_start


def rope_cos_sin_reference(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype,
                           scale: float = 1.0, *,
                           pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin: [*positions.shape, 2 * len(inv_freq)]`` in ``dtype`` (HF layout: halves
    repeated), from fp32 angles ``positions * inv_freq``; ``scale`` multiplies both. ``pdl``
    (the kernel form's launch option) is accepted and ignored."""
    freqs = positions.float()[..., None] * inv_freq.to(positions.device)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


@triton.jit
def cos_sin_at(pos, freq, scale, dtype: tl.constexpr):
    """``cos`` and ``sin`` of the fp32 angles ``pos * freq``, times ``scale``, rounded to
    ``dtype``: the one rule every launch that makes its angles follows, so that all give the
    tables' bits (each such launch runs without FMA contraction)."""
    angle = pos * freq
    return (tl.cos(angle) * scale).to(dtype), (tl.sin(angle) * scale).to(dtype)


@triton.jit
def rotate_at(x, partner, c, s, dtype: tl.constexpr):
    """One element of rotate-half RoPE in fp32: ``x * c + partner * s`` (``partner``: the element
    half a head away, negated in the first half), each product rounded to ``dtype`` first, as
    the references round. The rule of every launch that rotates a head (each runs without FMA
    contraction), so that ``rope_store``, ``head_norm_rope`` and ``qkv_rope`` give one bits."""
    return (x * c).to(dtype).to(tl.float32) + (partner * s).to(dtype).to(tl.float32)


@triton.jit
def _rope_cos_sin_kernel(pos_ptr, freq_ptr, out_ptr, HALF, scale, BLOCK: tl.constexpr,
                         PDL: tl.constexpr):
    """Program ``r``: cos then sin of position ``r`` over ``2 * HALF`` columns."""
    pdl_start(PDL, True)
    r = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK)
    ok = j < 2 * HALF
    pos = tl.load(pos_ptr + r).to(tl.float32)
    freq = tl.load(freq_ptr + j % HALF, mask=ok, other=0.0)
    c, s = cos_sin_at(pos, freq, scale, out_ptr.dtype.element_ty)
    row = out_ptr + r * 4 * HALF
    tl.store(row + j, c, mask=ok)
    tl.store(row + 2 * HALF + j, s, mask=ok)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype,
                 scale: float = 1.0, *, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel form of :func:`rope_cos_sin_reference` (one launch): ``cos`` and ``sin`` are views
    of one ``[*positions.shape, 2, 2 * len(inv_freq)]`` buffer (rows strided, last dim
    contiguous). ``positions`` int64, ``inv_freq`` fp32 on the same device. ``pdl``: launch
    with programmatic dependent launch where the device has it
    (:func:`~draftsmith.kernels.pdl_on`)."""
    check_tensor("positions", positions, None, torch.int64)
    check_tensor("inv_freq", inv_freq, ("half",), torch.float32, device=positions.device,
                 contiguous=True)
    if dtype not in FLOAT_DTYPES:
        raise ShapeError(f"rope_cos_sin makes fp32, bf16 or fp16 tables, not {dtype}")
    half = int(inv_freq.shape[0])
    flat = positions.reshape(-1).contiguous()
    out = torch.empty(flat.shape[0], 2, 2 * half, dtype=dtype, device=positions.device)
    if flat.shape[0] and half:
        on = pdl_on(pdl, positions)
        _rope_cos_sin_kernel[(flat.shape[0],)](flat, inv_freq, out, half, float(scale),
                                               BLOCK=block_size(2 * half), PDL=on,
                                               num_warps=1, enable_fp_fusion=False,
                                               **pdl_kwargs(on))
    out = out.view(*positions.shape, 2, 2 * half)
    return out[..., 0, :], out[..., 1, :]


__all__ = ["cos_sin_at", "rope_cos_sin", "rope_cos_sin_reference", "rotate_at"]
