"""RMSNorm, and the per-head RMSNorm + rotate-half RoPE of queries and keys, each in one launch.

The drafters' layers call these on every block forward and context projection; in eager torch
each is a chain of six to ten elementwise kernels (upcast, square, mean, rsqrt, scale, downcast,
weight; then the two RoPE products and their sum), which inside a captured round cost launch
latency, not bandwidth. Owns ``rms_norm`` and ``head_norm_rope``, each beside its reference.
Imports ``draftsmith.contract`` only.

Numerics: the mean of squares is an fp32 sum in another order than torch's, so outputs may differ
from the references by one rounding of the output dtype; every other step rounds where the
reference rounds (the normalised value to the input dtype, each product to the output dtype).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.kernels._launch import FastLaunch

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x: [..., D]`` normalised over the last dim in fp32, cast back to ``x``'s dtype, times
    ``weight: [D]`` (Qwen3 / Llama RMSNorm)::

        y = weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)
    """
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rotate_half_rope_reference(x: torch.Tensor, cos: torch.Tensor,
                               sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (Hugging Face's ``rotate_half`` form; the drafters' ``apply_rope_neox``):
    ``x: [..., n, d]``, ``cos, sin: [..., d]`` broadcast over the ``n`` heads:
    ``x * cos + [-x2, x1] * sin``."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def head_norm_rope_reference(x: torch.Tensor, weight: torch.Tensor, eps: float,
                             cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Per-head RMSNorm then rotate-half RoPE: ``x: [T, n, d]``, ``weight: [d]``,
    ``cos, sin: [T, d]`` (one row per token, shared by its heads) -> ``[T, n, d]``."""
    return rotate_half_rope_reference(rms_norm_reference(x, weight, eps), cos, sin)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, D, eps, s_x, s_out, BLOCK_D: tl.constexpr):
    """Program ``r`` normalises row ``r``."""
    r = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    x = tl.load(x_ptr + r * s_x + d, mask=ok, other=0.0)
    h = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / D + eps)
    y = (h * inv).to(x.dtype)
    w = tl.load(w_ptr + d, mask=ok, other=0.0)
    out = w.to(tl.float32) * y.to(tl.float32)
    tl.store(out_ptr + r * s_out + d, out.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _head_norm_rope_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, HEADS, D, eps,
                           s_xt, s_xh, s_ct, s_ot, s_oh, BLOCK_D: tl.constexpr):
    """Program ``(t, h)`` normalises head ``h`` of token ``t`` and rotates it."""
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
    inv = 1.0 / tl.sqrt(tl.sum(hx * hx, axis=0) / D + eps)
    w = tl.load(w_ptr + d, mask=ok, other=0.0).to(tl.float32)
    wp = tl.load(w_ptr + partner, mask=ok, other=0.0).to(tl.float32)
    odt = out_ptr.dtype.element_ty
    # the normalised vector, rounded as the reference rounds it (input dtype, then weight)
    y = (w * (hx * inv).to(x.dtype).to(tl.float32)).to(odt).to(tl.float32)
    yp = (wp * (xp.to(tl.float32) * inv).to(x.dtype).to(tl.float32)).to(odt).to(tl.float32)
    rot = tl.where(d < half, -yp, yp)
    c = tl.load(cos_ptr + t * s_ct + d, mask=ok, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + t * s_ct + d, mask=ok, other=0.0).to(tl.float32)
    out = (y * c).to(odt).to(tl.float32) + (rot * s).to(odt).to(tl.float32)
    tl.store(out_ptr + t * s_ot + h * s_oh + d, out.to(odt), mask=ok)


def _num_warps(block: int) -> int:
    """Warps for one program over ``block`` elements."""
    return 4 if block >= 2048 else 2 if block >= 512 else 1


_RMS_LAUNCH = FastLaunch(_rms_norm_kernel)
_HEAD_LAUNCH = FastLaunch(_head_norm_rope_kernel)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Kernel form of :func:`rms_norm_reference`: one launch for every row of ``x: [..., D]``
    (last dim contiguous); the output dtype is the reference's (``weight`` times ``x``)."""
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ShapeError(f"rms_norm needs x [..., D] with D >= 1, got {tuple(x.shape)}")
    d = int(x.shape[-1])
    check_tensor("weight", weight, (d,), _FLOATS, device=x.device)
    if x.dtype not in _FLOATS:
        raise ShapeError(f"rms_norm needs a float x, got {x.dtype}")
    rows = x.reshape(-1, d)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=torch.promote_types(x.dtype, weight.dtype),
                      device=x.device)
    if rows.shape[0]:
        block = triton.next_power_of_2(d)
        _RMS_LAUNCH((rows.shape[0],), (rows, weight, out, d, float(eps), rows.stride(0),
                                       out.stride(0), block), num_warps=_num_warps(block))
    return out.view(x.shape)


def head_norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor,
                   sin: torch.Tensor) -> torch.Tensor:
    """Kernel form of :func:`head_norm_rope_reference`: ``x: [T, n, d]`` (head rows with a
    contiguous last dim), ``weight: [d]``, ``cos, sin: [T, d]`` in the normalised dtype -> ``[T, n, d]``, one launch."""
    s: dict[str, int] = {}
    check_tensor("x", x, ("T", "n", "d"), _FLOATS, s)
    check_tensor("weight", weight, (s["d"],), _FLOATS, s, x.device)
    check_tensor("cos", cos, ("T", "d"), _FLOATS, s, x.device)
    check_tensor("sin", sin, ("T", "d"), cos.dtype, s, x.device)
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
    out = torch.empty(x.shape, dtype=odt, device=x.device)
    if x.shape[0] and x.shape[1]:
        block = triton.next_power_of_2(s["d"])
        _HEAD_LAUNCH((x.shape[0], x.shape[1]), (
            x, weight, cos, sin, out, x.shape[1], s["d"], float(eps), x.stride(0), x.stride(1),
            cos.stride(0), out.stride(0), out.stride(1), block), num_warps=_num_warps(block))
    return out


__all__ = [
    "head_norm_rope",
    "head_norm_rope_reference",
    "rms_norm",
    "rms_norm_reference",
    "rotate_half_rope_reference",
]
