"""MLA's latent rows normalised and rotated in one launch, beside their reference; and the
adjacent-pair (interleaved) RoPE that MLA applies to its rotary dims.

A latent row ``[kv_lora | d_rope]`` (``D_lat = kv_lora + d_rope``) gets an RMSNorm over its first
``kv_lora`` dims and interleaved RoPE on the last ``d_rope``. The MLA drafter does this for the
block's own latents in every layer and for every layer's context latents in each context
projection; in eager torch it is the norm's chain of six kernels, the rotation's six and a
concatenation. Imports ``draftsmith.contract``, ``kernels.rms_norm`` (the norm's reference and
its store step) and the kernels' launch helpers only.

Numerics: the norm is :mod:`draftsmith.kernels.rms_norm`'s (its mean of squares is an fp32 sum in
another order than torch's, so the normed dims may differ from the reference by one rounding of
the output dtype); the rotated dims round each product where the reference rounds it and equal
the reference's bit for bit.
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
from draftsmith.kernels.rope_cos_sin import cos_sin_at, rope_cos_sin_reference


def interleaved_rope_reference(x: torch.Tensor, cos: torch.Tensor,
                               sin: torch.Tensor) -> torch.Tensor:
    """Adjacent-pair RoPE: ``x: [..., n, d]``, ``cos, sin: [..., d]`` in the Hugging Face halves
    layout (only the first ``d / 2`` columns are read), broadcast over the ``n`` heads. Pair
    ``(x[2i], x[2i+1])`` becomes ``(x[2i] c_i - x[2i+1] s_i, x[2i] s_i + x[2i+1] c_i)``, each
    product rounded to the inputs' dtype."""
    half = x.shape[-1] // 2
    c = cos[..., :half].unsqueeze(-2)
    s = sin[..., :half].unsqueeze(-2)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x_even * c - x_odd * s, x_even * s + x_odd * c), dim=-1)
    return out.flatten(-2)


def latent_norm_rope_reference(latent: torch.Tensor, weight: torch.Tensor, eps: float,
                               cos: torch.Tensor, sin: torch.Tensor, *,
                               pdl: bool = False) -> torch.Tensor:
    """Normalise and rotate latent rows: ``latent: [R, n, D_lat] -> [R, n, D_lat]``; ``pdl``
    (the kernel form's launch option) is accepted and ignored.

    RMSNorm (``weight: [kv_lora]`` for every one of the ``n`` rows of a token, or ``[n, kv_lora]``:
    one per row, as a stack of layers) over the first ``kv_lora`` dims; interleaved RoPE
    (``cos, sin: [R, d_rope]``, shared by the ``n`` rows of a token) on the last
    ``d_rope = D_lat - kv_lora``.
    """
    kv_lora = weight.shape[-1]
    normed = rms_norm_reference(latent[..., :kv_lora], weight, eps)
    rotated = interleaved_rope_reference(latent[..., kv_lora:], cos, sin)
    return torch.cat((normed, rotated), dim=-1)


@triton.jit
def _latent_norm_rope_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, KV_LORA, HALF, eps,
                             s_xr, s_xn, s_wn, s_c, s_or, s_on, pos_ptr, freq_ptr, scale,
                             BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr, ANGLES: tl.constexpr,
                             PDL: tl.constexpr):
    """Program ``(r, j)``: row ``j`` of token ``r``, normed over ``KV_LORA`` dims and its
    ``2 * HALF`` rotary dims turned pair by pair. ``ANGLES``: cos and sin from ``pos_ptr[r] *
    freq_ptr`` times ``scale`` in the launch, rounded to the rows' dtype as
    :func:`~draftsmith.kernels.rope_cos_sin.rope_cos_sin` rounds its tables."""
    pdl_start(PDL, True)
    r = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1).to(tl.int64)
    row = x_ptr + r * s_xr + j * s_xn
    out = out_ptr + r * s_or + j * s_on
    d = tl.arange(0, BLOCK_L)
    d_ok = d < KV_LORA
    i = tl.arange(0, BLOCK_R)
    i_ok = i < HALF
    # every load before the first store (a load after a store waits for it)
    x = tl.load(row + d, mask=d_ok, other=0.0)
    w = tl.load(w_ptr + j * s_wn + d, mask=d_ok, other=0.0)
    x_even = tl.load(row + KV_LORA + 2 * i, mask=i_ok, other=0.0)
    x_odd = tl.load(row + KV_LORA + 2 * i + 1, mask=i_ok, other=0.0)
    odt = x_even.dtype
    if ANGLES:
        c, s = cos_sin_at(tl.load(pos_ptr + r).to(tl.float32),
                          tl.load(freq_ptr + i, mask=i_ok, other=0.0), scale, odt)
        c, s = c.to(tl.float32), s.to(tl.float32)
    else:
        c = tl.load(cos_ptr + r * s_c + i, mask=i_ok, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + r * s_c + i, mask=i_ok, other=0.0).to(tl.float32)
    store_norm(x, w, out, d, d_ok, KV_LORA, eps)
    e, o = x_even.to(tl.float32), x_odd.to(tl.float32)
    # each product rounded to the dtype, then the sum, as the reference's torch ops round
    even = (e * c).to(odt).to(tl.float32) - (o * s).to(odt).to(tl.float32)
    odd = (e * s).to(odt).to(tl.float32) + (o * c).to(odt).to(tl.float32)
    tl.store(out + KV_LORA + 2 * i, even.to(odt), mask=i_ok)
    tl.store(out + KV_LORA + 2 * i + 1, odd.to(odt), mask=i_ok)


def latent_norm_rope(latent: torch.Tensor, weight: torch.Tensor, eps: float,
                     cos: torch.Tensor, sin: torch.Tensor, *, pdl: bool = False) -> torch.Tensor:
    """Kernel form of :func:`latent_norm_rope_reference`, one launch: ``latent: [R, n, D_lat]``
    (any row strides, a contiguous last dim), ``weight: [kv_lora]`` or ``[n, kv_lora]``, ``cos,
    sin: [R, d_rope]`` (an even ``d_rope >= 2``), all in one dtype -> a new contiguous
    ``[R, n, D_lat]``. ``pdl``: launch with programmatic dependent launch where the device has
    it (:func:`~draftsmith.kernels.pdl_on`)."""
    s, rope = _check_rows(latent, weight)
    check_tensor("cos", cos, (s["R"], rope), latent.dtype, s, latent.device, unit_stride=True)
    check_tensor("sin", sin, (s["R"], rope), latent.dtype, s, latent.device, unit_stride=True)
    if sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    return _launch(latent, weight, eps, s, rope, (cos, sin, cos.stride(0)), None, pdl)


def latent_norm_rope_at_reference(latent: torch.Tensor, weight: torch.Tensor, eps: float,
                                  positions: torch.Tensor, inv_freq: torch.Tensor,
                                  scale: float = 1.0, *, pdl: bool = False) -> torch.Tensor:
    """:func:`latent_norm_rope_reference` at the angles ``positions: [R] int64`` times
    ``inv_freq: [d_rope / 2] fp32`` (cos and sin times ``scale`` in the rows' dtype, from
    :func:`~draftsmith.kernels.rope_cos_sin.rope_cos_sin_reference`)."""
    cos, sin = rope_cos_sin_reference(positions, inv_freq, latent.dtype, scale)
    return latent_norm_rope_reference(latent, weight, eps, cos, sin)


def latent_norm_rope_at(latent: torch.Tensor, weight: torch.Tensor, eps: float,
                        positions: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0, *,
                        pdl: bool = False) -> torch.Tensor:
    """Kernel form of :func:`latent_norm_rope_at_reference`: :func:`latent_norm_rope` with cos
    and sin made in the same launch from ``positions: [R] int64`` (contiguous) and ``inv_freq:
    [d_rope / 2] fp32`` as :func:`~draftsmith.kernels.rope_cos_sin.rope_cos_sin` makes its
    tables (one launch instead of two), the same bits (neither launch contracts into FMAs)."""
    s, rope = _check_rows(latent, weight)
    check_tensor("positions", positions, (s["R"],), torch.int64, s, latent.device,
                 contiguous=True)
    check_tensor("inv_freq", inv_freq, (rope // 2,), torch.float32, s, latent.device,
                 contiguous=True)
    return _launch(latent, weight, eps, s, rope, None, (positions, inv_freq, float(scale)), pdl)


def _check_rows(latent: torch.Tensor, weight: torch.Tensor) -> tuple[dict[str, int], int]:
    """The checks of ``latent`` and ``weight`` shared by both launchers: ``(sizes, d_rope)``."""
    s: dict[str, int] = {}
    check_tensor("latent", latent, ("R", "n", "D_lat"), FLOAT_DTYPES, s, unit_stride=True)
    check_tensor("weight", weight, (None,) * (weight.dim() - 1) + ("kv_lora",), latent.dtype, s,
                 latent.device, unit_stride=True)
    if weight.dim() == 2:
        check_tensor("weight", weight, (s["n"], s["kv_lora"]), latent.dtype, s)
    elif weight.dim() != 1:
        raise ShapeError(f"weight must be [kv_lora] or [n, kv_lora], got {tuple(weight.shape)}")
    rope = s["D_lat"] - s["kv_lora"]
    if rope < 2 or rope % 2:
        raise ShapeError(f"latent rows of {s['D_lat']} dims past kv_lora = {s['kv_lora']} leave "
                         f"{rope} rotary dims; interleaved RoPE needs an even number >= 2")
    return s, rope


def _launch(latent: torch.Tensor, weight: torch.Tensor, eps: float, s: dict[str, int], rope: int,
            tables: tuple[torch.Tensor, torch.Tensor, int] | None,
            angles: tuple[torch.Tensor, torch.Tensor, float] | None, pdl: bool) -> torch.Tensor:
    """The launch of :func:`latent_norm_rope` (``tables``: cos, sin, their row stride) or
    :func:`latent_norm_rope_at` (``angles``: positions, frequencies, scale)."""
    out = torch.empty(latent.shape, dtype=latent.dtype, device=latent.device)
    if s["R"] and s["n"]:
        block = block_size(s["kv_lora"])
        on = pdl_on(pdl, latent)
        cos, sin, s_c = tables if tables is not None else (latent, latent, 0)
        positions, freq, scale = angles if angles is not None else (latent, latent, 1.0)
        _latent_norm_rope_kernel[(s["R"], s["n"])](
            latent, weight, cos, sin, out, s["kv_lora"], rope // 2, float(eps),
            latent.stride(0), latent.stride(1), weight.stride(0) if weight.dim() == 2 else 0,
            s_c, out.stride(0), out.stride(1), positions, freq, scale, BLOCK_L=block,
            BLOCK_R=block_size(rope // 2), ANGLES=angles is not None, PDL=on,
            num_warps=warps_for(block, ROW_WARPS),
            enable_fp_fusion=False,  # no FMA: the rotation's products round as the reference's
            **pdl_kwargs(on))
    return out


__all__ = ["interleaved_rope_reference", "latent_norm_rope", "latent_norm_rope_at",
           "latent_norm_rope_at_reference", "latent_norm_rope_reference"]
