"""RMSNorm, and the per-head RMSNorm + rotate-half RoPE of queries and keys, each in one launch.

The drafters' layers call these on every block forward and context projection; in eager torch
each is a chain of six to ten elementwise kernels (upcast, square, mean, rsqrt, scale, downcast,
weight; then the two RoPE products and their sum), which inside a captured round cost launch
latency, not bandwidth. Owns ``rms_norm`` and ``head_norm_rope``, each beside its reference.
Imports ``draftsmith.contract`` and the kernels' launch helpers only.

Numerics: the mean of squares is an fp32 sum in another order than torch's, so outputs may differ
from the references by one rounding of the output dtype; every other step rounds where the
reference rounds (the normalised value to the input dtype, each product to the output dtype).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels._launch import ROW_WARPS, block_size, unit_rows, warps_for


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x: [..., D]`` normalised over the last dim in fp32, cast back to ``x``'s dtype, times
    ``weight: [D]`` (Qwen3 / Llama RMSNorm)::

        y = weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)
    """
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rotate_half_rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                               out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate-half RoPE (Hugging Face's ``rotate_half`` form; the drafters' ``apply_rope_neox``):
    ``x: [..., n, d]``, ``cos, sin: [..., d]`` broadcast over the ``n`` heads:
    ``x * cos + [-x2, x1] * sin``; written into ``out`` when given (which may be ``x``)."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    result = x * cos + torch.cat((-x2, x1), dim=-1) * sin
    return result if out is None else out.copy_(result)


def head_norm_rope_reference(x: torch.Tensor, weight: torch.Tensor, eps: float,
                             cos: torch.Tensor, sin: torch.Tensor, cos_group: int = 1,
                             out: torch.Tensor | None = None) -> torch.Tensor:
    """Per-head RMSNorm then rotate-half RoPE: ``x: [R, n, d]`` -> ``[R, n, d]``.

    ``weight``: ``[d]`` (every head), ``[n, d]`` (per head) or ``[L, n, d]`` (row ``r`` uses
    ``weight[r % L]``: rows that interleave ``L`` layers); ``cos, sin: [R / cos_group, d]``, row
    ``r`` rotated by row ``r // cos_group`` (shared by its heads). Written into ``out`` when
    given (which may be ``x``).
    """
    if weight.dim() == 3:
        weight = weight.repeat(x.shape[0] // weight.shape[0], 1, 1)
    if cos_group != 1:
        cos, sin = cos.repeat_interleave(cos_group, 0), sin.repeat_interleave(cos_group, 0)
    result = rotate_half_rope_reference(rms_norm_reference(x, weight, eps), cos, sin)
    return result if out is None else out.copy_(result)


def add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual`` (rounded to their dtype) and ``rms_norm_reference(h)``: a pre-norm
    block's residual add and the next norm. ``x, residual: [..., D]``, ``weight: [D]``."""
    h = x + residual
    return h, rms_norm_reference(h, weight, eps)


@triton.jit
def _store_norm(x, w_ptr, out_ptr, d, ok, D, eps):
    """Store ``weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)`` of one row ``x [BLOCK_D]``
    (masked by ``ok``) at ``out_ptr + d``, rounded where the reference rounds."""
    h = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / D + eps)
    y = (h * inv).to(x.dtype)
    w = tl.load(w_ptr + d, mask=ok, other=0.0)
    out = w.to(tl.float32) * y.to(tl.float32)
    tl.store(out_ptr + d, out.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, D, eps, s_x, s_out, BLOCK_D: tl.constexpr):
    """Program ``r`` normalises row ``r``."""
    r = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    x = tl.load(x_ptr + r * s_x + d, mask=ok, other=0.0)
    _store_norm(x, w_ptr, out_ptr + r * s_out, d, ok, D, eps)


def rope_cos_sin_reference(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype,
                           scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin: [*positions.shape, 2 * len(inv_freq)]`` in ``dtype`` (HF layout: halves
    repeated), from fp32 angles ``positions * inv_freq``; ``scale`` multiplies both."""
    freqs = positions.float()[..., None] * inv_freq.to(positions.device)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


@triton.jit
def _rope_cos_sin_kernel(pos_ptr, freq_ptr, out_ptr, HALF, scale, BLOCK: tl.constexpr):
    """Program ``r``: cos then sin of position ``r`` over ``2 * HALF`` columns."""
    r = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK)
    ok = j < 2 * HALF
    pos = tl.load(pos_ptr + r).to(tl.float32)
    freq = tl.load(freq_ptr + j % HALF, mask=ok, other=0.0)
    angle = pos * freq
    row = out_ptr + r * 4 * HALF
    tl.store(row + j, (tl.cos(angle) * scale).to(out_ptr.dtype.element_ty), mask=ok)
    tl.store(row + 2 * HALF + j, (tl.sin(angle) * scale).to(out_ptr.dtype.element_ty), mask=ok)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype,
                 scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel form of :func:`rope_cos_sin_reference` (one launch): ``cos`` and ``sin`` are views
    of one ``[*positions.shape, 2, 2 * len(inv_freq)]`` buffer (rows strided, last dim
    contiguous). ``positions`` int64, ``inv_freq`` fp32 on the same device."""
    check_tensor("positions", positions, None, torch.int64)
    check_tensor("inv_freq", inv_freq, ("half",), torch.float32, device=positions.device,
                 contiguous=True)
    if dtype not in FLOAT_DTYPES:
        raise ShapeError(f"rope_cos_sin makes fp32, bf16 or fp16 tables, not {dtype}")
    half = int(inv_freq.shape[0])
    flat = positions.reshape(-1).contiguous()
    out = torch.empty(flat.shape[0], 2, 2 * half, dtype=dtype, device=positions.device)
    if flat.shape[0] and half:
        _rope_cos_sin_kernel[(flat.shape[0],)](flat, inv_freq, out, half, float(scale),
                                               BLOCK=block_size(2 * half), num_warps=1)
    out = out.view(*positions.shape, 2, 2 * half)
    return out[..., 0, :], out[..., 1, :]


@triton.jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, sum_ptr, out_ptr, D, eps, s_x, s_r, s_s, s_out,
                         BLOCK_D: tl.constexpr):
    """Program ``r``: row ``r`` of ``x + residual``, stored, and its norm."""
    r = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    x = tl.load(x_ptr + r * s_x + d, mask=ok, other=0.0)
    res = tl.load(r_ptr + r * s_r + d, mask=ok, other=0.0)
    h = (x.to(tl.float32) + res.to(tl.float32)).to(x.dtype)
    tl.store(sum_ptr + r * s_s + d, h, mask=ok)
    _store_norm(h, w_ptr, out_ptr + r * s_out, d, ok, D, eps)


@triton.jit
def _head_norm_rope_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, HEADS, D, eps,
                           s_xt, s_xh, s_ct, s_ot, s_oh, W_ROWS, s_wl, s_wh, COS_GROUP,
                           BLOCK_D: tl.constexpr, NORM: tl.constexpr):
    """Program ``(t, h)`` normalises head ``h`` of row ``t`` (unless ``NORM`` is false) and
    rotates it (in place when ``out`` is ``x``: every value is loaded before any is stored)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    half = D // 2
    partner = tl.where(d < half, d + half, d - half)
    row = x_ptr + t * s_xt + h * s_xh
    x = tl.load(row + d, mask=ok, other=0.0)
    xp = tl.load(row + partner, mask=ok, other=0.0)
    hx = x.to(tl.float32)
    odt = out_ptr.dtype.element_ty
    if NORM:
        inv = 1.0 / tl.sqrt(tl.sum(hx * hx, axis=0) / D + eps)
        w_row = w_ptr + (t % W_ROWS) * s_wl + h * s_wh
        w = tl.load(w_row + d, mask=ok, other=0.0).to(tl.float32)
        wp = tl.load(w_row + partner, mask=ok, other=0.0).to(tl.float32)
        # the normalised vector, rounded as the reference rounds it (input dtype, then weight)
        y = (w * (hx * inv).to(x.dtype).to(tl.float32)).to(odt).to(tl.float32)
        yp = (wp * (xp.to(tl.float32) * inv).to(x.dtype).to(tl.float32)).to(odt).to(tl.float32)
    else:
        y = hx
        yp = xp.to(tl.float32)
    rot = tl.where(d < half, -yp, yp)
    c_row = (t // COS_GROUP) * s_ct
    c = tl.load(cos_ptr + c_row + d, mask=ok, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + c_row + d, mask=ok, other=0.0).to(tl.float32)
    out = (y * c).to(odt).to(tl.float32) + (rot * s).to(odt).to(tl.float32)
    tl.store(out_ptr + t * s_ot + h * s_oh + d, out.to(odt), mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Kernel form of :func:`rms_norm_reference`: one launch for every row of ``x: [..., D]``
    (last dim contiguous); the output dtype is the reference's (``weight`` times ``x``)."""
    if x.ndim < 1 or x.shape[-1] == 0 or x.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"rms_norm needs float x [..., D >= 1], got {x.dtype} {tuple(x.shape)}")
    d = int(x.shape[-1])
    check_tensor("weight", weight, (d,), FLOAT_DTYPES, device=x.device)
    rows = unit_rows(x, d)
    out = torch.empty(rows.shape, dtype=torch.promote_types(x.dtype, weight.dtype),
                      device=x.device)
    if rows.shape[0]:
        block = block_size(d)
        _rms_norm_kernel[(rows.shape[0],)](rows, weight, out, d, float(eps), rows.stride(0),
                                           out.stride(0), BLOCK_D=block,
                                           num_warps=warps_for(block, ROW_WARPS))
    return out.view(x.shape)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel form of :func:`add_rms_norm_reference` (one launch): ``x, residual: [..., D]`` of
    one dtype with a contiguous last dim, ``weight: [D]``."""
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
        _add_rms_norm_kernel[(rows.shape[0],)](
            rows, res, weight, total, out, d, float(eps), rows.stride(0), res.stride(0),
            total.stride(0), out.stride(0), BLOCK_D=block, num_warps=warps_for(block, ROW_WARPS))
    return total.view(x.shape), out.view(x.shape)


def head_norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor,
                   sin: torch.Tensor, cos_group: int = 1,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """Kernel form of :func:`head_norm_rope_reference`, one launch: ``x: [R, n, d]`` (head rows
    with a contiguous last dim), ``weight`` ``[d]``, ``[n, d]`` or ``[L, n, d]``, ``cos, sin:
    [R / cos_group, d]`` in the normalised dtype -> ``[R, n, d]``; written into ``out`` when given
    (which may be ``x`` itself: in place)."""
    s: dict[str, int] = {}
    check_tensor("x", x, ("R", "n", "d"), FLOAT_DTYPES, s)
    if weight.dim() == 1:
        check_tensor("weight", weight, (s["d"],), FLOAT_DTYPES, s, x.device)
        w_rows, s_wl, s_wh = 1, 0, 0
    else:
        check_tensor("weight", weight, (None,) * (weight.dim() - 2) + (s["n"], s["d"]),
                     FLOAT_DTYPES, s, x.device)
        w_rows = int(weight.shape[0]) if weight.dim() == 3 else 1
        s_wl = weight.stride(0) if weight.dim() == 3 else 0
        s_wh = weight.stride(-2)
        if weight.dim() > 3 or s["R"] % w_rows or weight.stride(-1) != 1:
            raise ShapeError(f"weight {tuple(weight.shape)} must be [d], [n, d] or [L, n, d] "
                             f"with L dividing the {s['R']} rows")
    if cos_group < 1 or s["R"] % cos_group:
        raise ShapeError(f"cos_group {cos_group} must divide the {s['R']} rows")
    check_tensor("cos", cos, (s["R"] // cos_group, s["d"]), FLOAT_DTYPES, s, x.device)
    check_tensor("sin", sin, (s["R"] // cos_group, s["d"]), cos.dtype, s, x.device)
    if s["d"] % 2:
        raise ShapeError(f"rotate-half RoPE needs an even head width, got {s['d']}")
    odt = torch.promote_types(x.dtype, weight.dtype)
    if cos.dtype != odt:
        raise ShapeError(f"cos and sin must be in the normalised dtype {odt} (x times weight), "
                         f"got {cos.dtype}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    if out is None:
        out = torch.empty(x.shape, dtype=odt, device=x.device)
    else:
        check_tensor("out", out, tuple(x.shape), odt, device=x.device, unit_stride=True)
    if x.shape[0] and x.shape[1]:
        block = block_size(s["d"])
        _head_norm_rope_kernel[(x.shape[0], x.shape[1])](
            x, weight, cos, sin, out, x.shape[1], s["d"], float(eps), x.stride(0), x.stride(1),
            cos.stride(0), out.stride(0), out.stride(1), w_rows, s_wl, s_wh, cos_group,
            BLOCK_D=block, NORM=True, num_warps=warps_for(block, ROW_WARPS))
    return out


def rotate_half_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """Kernel form of :func:`rotate_half_rope_reference` for head rows, one launch: ``x: [R, n,
    d]`` (any row and head strides, a contiguous last dim), ``cos, sin: [R, d]`` in ``x``'s
    dtype -> ``[R, n, d]``; written into ``out`` when given (which may be ``x``: in place).
    Every product is rounded to ``x``'s dtype where the reference rounds it, so the result
    equals the reference's bit for bit."""
    s: dict[str, int] = {}
    check_tensor("x", x, ("R", "n", "d"), FLOAT_DTYPES, s)
    check_tensor("cos", cos, (s["R"], s["d"]), x.dtype, s, x.device)
    check_tensor("sin", sin, (s["R"], s["d"]), x.dtype, s, x.device)
    if s["d"] % 2:
        raise ShapeError(f"rotate-half RoPE needs an even head width, got {s['d']}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        check_tensor("out", out, tuple(x.shape), x.dtype, device=x.device, unit_stride=True)
    if x.shape[0] and x.shape[1]:
        block = block_size(s["d"])
        _head_norm_rope_kernel[(x.shape[0], x.shape[1])](
            x, x, cos, sin, out, x.shape[1], s["d"], 0.0, x.stride(0), x.stride(1),
            cos.stride(0), out.stride(0), out.stride(1), 1, 0, 0, 1,
            BLOCK_D=block, NORM=False, num_warps=warps_for(block, ROW_WARPS),
            enable_fp_fusion=False)  # no FMA: the two products round as the reference's do
    return out


__all__ = [
    "add_rms_norm",
    "add_rms_norm_reference",
    "head_norm_rope",
    "head_norm_rope_reference",
    "rope_cos_sin",
    "rope_cos_sin_reference",
    "rms_norm",
    "rotate_half_rope",
    "rms_norm_reference",
    "rotate_half_rope_reference",
]
