"""Per-head RMSNorm then rotate-half RoPE of query and key head rows, and the rotation alone,
each in one launch of one kernel (``NORM`` picks the norm), beside their references.

The layers call these on every block forward and context projection; in eager torch they are a
chain of six to ten elementwise kernels (the norm's upcast, square, mean, rsqrt, scale,
downcast and weight; then the two RoPE products and their sum). ``rotate_half_rope`` is the
kernel's ``NORM = False`` launch, so the two share this file rather than a private kernel across
two. Imports ``draftsmith.contract``, ``kernels.rms_norm`` (the norm's reference) and the kernels'
launch helpers only.

Numerics: the norm's mean of squares is an fp32 sum in another order than torch's, so
``head_norm_rope`` may differ from its reference by one rounding of the output dtype; every other
step rounds where the reference rounds (the normalised value to the input dtype, each product to
the output dtype), and ``rotate_half_rope`` equals its reference bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels import pdl_on
from draftsmith.kernels._launch import ROW_WARPS, block_size, pdl_kwargs, pdl_start, warps_for
from draftsmith.kernels.rms_norm import rms_norm_reference
from draftsmith.kernels.rope_cos_sin import cos_sin_at, rope_cos_sin_reference, rotate_at


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
                             out: torch.Tensor | None = None, *,
                             pdl: bool = False) -> torch.Tensor:
    """Per-head RMSNorm then rotate-half RoPE: ``x: [R, n, d]`` -> ``[R, n, d]``; ``pdl`` (the
    kernel form's launch option) is accepted and ignored.

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


@triton.jit
def _head_norm_rope_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, D, eps,
                           s_xt, s_xh, s_ct, s_ot, s_oh, W_ROWS, s_wl, s_wh, COS_GROUP,
                           pos_ptr, freq_ptr, scale,
                           BLOCK_D: tl.constexpr, NORM: tl.constexpr, ANGLES: tl.constexpr,
                           PDL: tl.constexpr):
    """Program ``(t, h)`` normalises head ``h`` of row ``t`` (unless ``NORM`` is false) and
    rotates it (in place when ``out`` is ``x``: every value is loaded before any is stored).
    ``ANGLES``: cos and sin from ``pos_ptr[t // COS_GROUP] * freq_ptr`` in the launch, computed
    and rounded as :func:`~draftsmith.kernels.rope_cos_sin.rope_cos_sin` makes its tables."""
    pdl_start(PDL, True)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    half = D // 2
    partner = tl.where(d < half, d + half, d - half)
    row = x_ptr + t * s_xt + h * s_xh
    x = tl.load(row + d, mask=ok, other=0.0)
    xp = tl.load(row + partner, mask=ok, other=0.0)
    # every load before the sum of squares: a load after it waits for it
    if NORM:
        w_row = w_ptr + (t % W_ROWS) * s_wl + h * s_wh
        w = tl.load(w_row + d, mask=ok, other=0.0).to(tl.float32)
        wp = tl.load(w_row + partner, mask=ok, other=0.0).to(tl.float32)
    if ANGLES:
        pos = tl.load(pos_ptr + t // COS_GROUP).to(tl.float32)
        freq = tl.load(freq_ptr + d % half, mask=ok, other=0.0)
    else:
        c_row = (t // COS_GROUP) * s_ct
        c = tl.load(cos_ptr + c_row + d, mask=ok, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + c_row + d, mask=ok, other=0.0).to(tl.float32)
    hx = x.to(tl.float32)
    odt = out_ptr.dtype.element_ty
    if NORM:
        inv = 1.0 / tl.sqrt(tl.sum(hx * hx, axis=0) / D + eps)
        # the normalised vector, rounded as the reference rounds it (input dtype, then weight)
        y = (w * (hx * inv).to(x.dtype).to(tl.float32)).to(odt).to(tl.float32)
        yp = (wp * (xp.to(tl.float32) * inv).to(x.dtype).to(tl.float32)).to(odt).to(tl.float32)
    else:
        y = hx
        yp = xp.to(tl.float32)
    rot = tl.where(d < half, -yp, yp)
    if ANGLES:
        c, s = cos_sin_at(pos, freq, scale, odt)
        c, s = c.to(tl.float32), s.to(tl.float32)
    out = rotate_at(y, rot, c, s, odt)
    tl.store(out_ptr + t * s_ot + h * s_oh + d, out.to(odt), mask=ok)


def _check_heads(x: torch.Tensor, weight: torch.Tensor,
                 cos_group: int) -> tuple[dict[str, int], int, int, int]:
    """:func:`head_norm_rope`'s checks of ``x``, ``weight`` and ``cos_group``: the sizes and
    the weight's row count and strides."""
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
    if s["d"] % 2 or not s["d"]:
        raise ShapeError(f"rotate-half RoPE needs an even, non-zero head width, got {s['d']}")
    return s, w_rows, s_wl, s_wh


def head_norm_rope(x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor,
                   sin: torch.Tensor, cos_group: int = 1,
                   out: torch.Tensor | None = None, *, pdl: bool = False) -> torch.Tensor:
    """Kernel form of :func:`head_norm_rope_reference`, one launch: ``x: [R, n, d]`` (head rows
    with a contiguous last dim), ``weight`` ``[d]``, ``[n, d]`` or ``[L, n, d]``, ``cos, sin:
    [R / cos_group, d]`` in the normalised dtype -> ``[R, n, d]``; written into ``out`` when given
    (which may be ``x`` itself: in place). ``pdl``: launch with programmatic dependent launch
    where the device has it (:func:`~draftsmith.kernels.pdl_on`)."""
    s, w_rows, s_wl, s_wh = _check_heads(x, weight, cos_group)
    check_tensor("cos", cos, (s["R"] // cos_group, s["d"]), FLOAT_DTYPES, s, x.device)
    check_tensor("sin", sin, (s["R"] // cos_group, s["d"]), cos.dtype, s, x.device)
    odt = torch.promote_types(x.dtype, weight.dtype)
    if cos.dtype != odt:
        raise ShapeError(f"cos and sin must be in the normalised dtype {odt} (x times weight), "
                         f"got {cos.dtype}")
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    return _launch(x, weight, eps, (cos, sin, cos.stride(0)), None, cos_group, out,
                   (w_rows, s_wl, s_wh), pdl)


def head_norm_rope_at_reference(x: torch.Tensor, weight: torch.Tensor, eps: float,
                                positions: torch.Tensor, inv_freq: torch.Tensor,
                                scale: float = 1.0, cos_group: int = 1,
                                out: torch.Tensor | None = None, *,
                                pdl: bool = False) -> torch.Tensor:
    """:func:`head_norm_rope_reference` at the angles ``positions: [R / cos_group] int64`` times
    ``inv_freq: [d / 2] fp32`` (cos and sin times ``scale``, in the normalised dtype, from
    :func:`~draftsmith.kernels.rope_cos_sin.rope_cos_sin_reference`)."""
    odt = torch.promote_types(x.dtype, weight.dtype)
    cos, sin = rope_cos_sin_reference(positions, inv_freq, odt, scale)
    return head_norm_rope_reference(x, weight, eps, cos, sin, cos_group, out)


def head_norm_rope_at(x: torch.Tensor, weight: torch.Tensor, eps: float,
                      positions: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0,
                      cos_group: int = 1, out: torch.Tensor | None = None, *,
                      pdl: bool = False) -> torch.Tensor:
    """Kernel form of :func:`head_norm_rope_at_reference`: :func:`head_norm_rope` with cos and
    sin made in the same launch from the positions as
    :func:`~draftsmith.kernels.rope_cos_sin.rope_cos_sin` makes its tables (one launch instead
    of two), the same bits: neither launch contracts a product and a sum into an FMA, so the
    angles and each product of the rotation round alike in both."""
    s, w_rows, s_wl, s_wh = _check_heads(x, weight, cos_group)
    check_tensor("positions", positions, (s["R"] // cos_group,), torch.int64, None, x.device,
                 contiguous=True)
    check_tensor("inv_freq", inv_freq, (s["d"] // 2,), torch.float32, None, x.device,
                 contiguous=True)
    return _launch(x, weight, eps, None, (positions, inv_freq, float(scale)), cos_group, out,
                   (w_rows, s_wl, s_wh), pdl)


def _launch(x: torch.Tensor, weight: torch.Tensor, eps: float,
            tables: tuple[torch.Tensor, torch.Tensor, int] | None,
            angles: tuple[torch.Tensor, torch.Tensor, float] | None, cos_group: int,
            out: torch.Tensor | None, w_layout: tuple[int, int, int], pdl: bool) -> torch.Tensor:
    """The normalising launch of :func:`head_norm_rope` (``tables``: cos, sin, their row
    stride) or :func:`head_norm_rope_at` (``angles``: positions, frequencies, scale)."""
    rows, heads, width = x.shape
    odt = torch.promote_types(x.dtype, weight.dtype)
    if x.stride(-1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty(x.shape, dtype=odt, device=x.device)
    else:
        check_tensor("out", out, tuple(x.shape), odt, device=x.device, unit_stride=True)
    if rows and heads:
        block = block_size(width)
        on = pdl_on(pdl, x)
        cos, sin, s_ct = tables if tables is not None else (x, x, 0)
        positions, freq, scale = angles if angles is not None else (x, x, 1.0)
        _head_norm_rope_kernel[(rows, heads)](
            x, weight, cos, sin, out, width, float(eps), x.stride(0), x.stride(1),
            s_ct, out.stride(0), out.stride(1), *w_layout, cos_group, positions, freq, scale,
            BLOCK_D=block, NORM=True, ANGLES=angles is not None, PDL=on,
            num_warps=warps_for(block, ROW_WARPS),
            enable_fp_fusion=False,  # no FMA: each product rounds, whatever order the code has
            **pdl_kwargs(on))
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
    if s["d"] % 2 or not s["d"]:
        raise ShapeError(f"rotate-half RoPE needs an even, non-zero head width, got {s['d']}")
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
            x, x, cos, sin, out, s["d"], 0.0, x.stride(0), x.stride(1),
            cos.stride(0), out.stride(0), out.stride(1), 1, 0, 0, 1, x, x, 1.0,
            BLOCK_D=block, NORM=False, ANGLES=False, PDL=False, num_warps=warps_for(block, ROW_WARPS),
            enable_fp_fusion=False)  # no FMA: the two products round as the reference's do
    return out


__all__ = [
    "head_norm_rope",
    "head_norm_rope_at",
    "head_norm_rope_at_reference",
    "head_norm_rope_reference",
    "rotate_half_rope",
    "rotate_half_rope_reference",
]
