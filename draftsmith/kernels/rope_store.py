"""RoPE of a packed ``[q | k | v]`` projection and the write of its keys and values into a static
cache, in one launch.

After the packed projection of a decoding step, the target rotates queries and keys (Qwen3
normalises each head first) and writes the new keys and values at each token's slot and
position. In torch that is a rotary table (several launches), the rotation, and two indexed
writes a layer; here one program per token and head computes its angles from the position,
rotates, and stores: the heads in place, keys and values into the cache too. Owns
``rope_store`` beside its reference. Imports ``draftsmith.contract``, the references of
``kernels.head_norm_rope`` and ``kernels.rope_cos_sin``, and the kernels' launch helpers only.

Numerics: the angles are ``position * inv_freq`` in fp32 as transformers computes them; cos and
sin are rounded to the heads' dtype before use, and every product rounds where the reference
rounds, so outputs equal the reference's up to the last bit of cos and sin (``tl.cos`` against
torch's).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.contract.checks import FLOAT_DTYPES
from draftsmith.kernels import pdl_on
from draftsmith.kernels._launch import (
    block_size,
    or_dummy,
    pdl_kwargs,
    pdl_release,
    pdl_start,
    warps_for,
)
from draftsmith.kernels.head_norm_rope import head_norm_rope_reference, rotate_half_rope_reference
from draftsmith.kernels.rope_cos_sin import cos_sin_at, rope_cos_sin_reference, rotate_at

_I64 = torch.int64


def rope_store_reference(qkv: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                         keys: torch.Tensor, values: torch.Tensor, rows: torch.Tensor,
                         num_q_heads: int, scale: float = 1.0,
                         qk_norm: torch.Tensor | None = None, eps: float = 0.0, *,
                         pdl: bool = False) -> None:
    """In place: ``qkv: [R, nq + 2 nkv, hd]`` (``nq = num_q_heads``) holds each token's query,
    key and value heads. Query and key heads are normalised per head by ``qk_norm: [nq + nkv,
    hd]`` when given (Qwen3), then rotated (rotate-half RoPE at angles ``positions[r] *
    inv_freq``, cos and sin times ``scale`` in the heads' dtype) in place; the rotated keys and
    the values are also written to ``keys, values: [S, nkv, L, hd]`` at slot
    ``rows[r]``, column ``positions[r]`` (``positions, rows: [R] int64``). ``pdl`` (the kernel
    form's launch option) is accepted and ignored."""
    nkv = (qkv.shape[1] - num_q_heads) // 2
    heads = qkv[:, : num_q_heads + nkv]
    cos, sin = rope_cos_sin_reference(positions, inv_freq, qkv.dtype, scale)
    if qk_norm is None:
        rotate_half_rope_reference(heads, cos, sin, out=heads)
    else:
        head_norm_rope_reference(heads, qk_norm, eps, cos, sin, out=heads)
    keys[rows, :, positions] = qkv[:, num_q_heads : num_q_heads + nkv]
    values[rows, :, positions] = qkv[:, num_q_heads + nkv :]


@triton.jit
def _rope_store_kernel(qkv_ptr, pos_ptr, freq_ptr, nw_ptr, k_ptr, v_ptr, rows_ptr,
                       NQ, NKV, D, eps, scale,
                       s_t, s_h, s_ks, s_kh, s_kl, s_vs, s_vh, s_vl,
                       BLOCK_D: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr):
    """Program ``(t, h)``: head ``h`` of token ``t``, rotated in place (``h >= NQ``: key head
    ``h - NQ``, also written to the cache, with its value head copied beside it). Under ``PDL``
    the next kernel (the attention) may start once every program has stored: started at once,
    its programs sat on the SMs while a verification's RoPE ran (8 tokens a row: 50-80 us a
    round more on 1.7B and 8B targets, H100, 2026-12-05)."""
    pdl_start(PDL, False)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    ok = d < D
    half = D // 2
    partner = tl.where(d < half, d + half, d - half)
    row = qkv_ptr + t * s_t + h * s_h
    # every load before the sum of squares and the first store (a load after either waits
    # for it): the head, the norm weight, the angle's inputs, a key head's slot and value
    x = tl.load(row + d, mask=ok, other=0.0)
    xp = tl.load(row + partner, mask=ok, other=0.0)
    if NORM:
        w = tl.load(nw_ptr + h * D + d, mask=ok, other=0.0).to(tl.float32)
        wp = tl.load(nw_ptr + h * D + partner, mask=ok, other=0.0).to(tl.float32)
    pos = tl.load(pos_ptr + t)
    freq = tl.load(freq_ptr + d % half, mask=ok, other=0.0)
    is_kv = h >= NQ
    slot = tl.load(rows_ptr + t)
    v = tl.load(row + NKV * s_h + d, mask=d < tl.where(is_kv, D, 0), other=0.0)
    dt = x.dtype
    hx = x.to(tl.float32)
    if NORM:
        inv = 1.0 / tl.sqrt(tl.sum(hx * hx, axis=0) / D + eps)
        y = (w * (hx * inv).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        yp = (wp * (xp.to(tl.float32) * inv).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    else:
        y = hx
        yp = xp.to(tl.float32)
    c, s = cos_sin_at(pos.to(tl.float32), freq, scale, dt)
    c, s = c.to(tl.float32), s.to(tl.float32)
    rot = tl.where(d < half, -yp, yp)
    out = rotate_at(y, rot, c, s, dt).to(dt)
    tl.store(row + d, out, mask=ok)
    if is_kv:
        kvh = h - NQ
        tl.store(k_ptr + slot * s_ks + kvh * s_kh + pos * s_kl + d, out, mask=ok)
        tl.store(v_ptr + slot * s_vs + kvh * s_vh + pos * s_vl + d, v, mask=ok)
    pdl_release(PDL)


def rope_store(qkv: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
               keys: torch.Tensor, values: torch.Tensor, rows: torch.Tensor,
               num_q_heads: int, scale: float = 1.0,
               qk_norm: torch.Tensor | None = None, eps: float = 0.0, *,
               pdl: bool = False) -> None:
    """Kernel form of :func:`rope_store_reference` (same arguments and effect), one launch.
    ``pdl``: as :func:`~draftsmith.kernels.rms_norm.rms_norm`'s.

    ``qkv`` needs a contiguous last dim (rows and heads may be strided); ``keys`` and
    ``values`` too; ``inv_freq: [hd / 2] float32``; ``qk_norm`` contiguous. Slots and
    positions are trusted (the target computes them): nothing is read back to the host.
    """
    s: dict[str, int] = {}
    check_tensor("qkv", qkv, ("R", "h", "hd"), FLOAT_DTYPES, s, unit_stride=True)
    check_tensor("keys", keys, ("S", "nkv", "L", "hd"), qkv.dtype, s, qkv.device,
                 unit_stride=True)
    check_tensor("values", values, ("S", "nkv", "L", "hd"), qkv.dtype, s, qkv.device,
                 unit_stride=True)
    check_tensor("positions", positions, ("R",), _I64, s, qkv.device)
    check_tensor("rows", rows, ("R",), _I64, s, qkv.device)
    check_tensor("inv_freq", inv_freq, (s["hd"] // 2,), torch.float32, device=qkv.device,
                 contiguous=True)
    nq, nkv = int(num_q_heads), s["nkv"]
    if s["h"] != nq + 2 * nkv or s["hd"] % 2 or not s["hd"]:
        raise ShapeError(f"qkv holds {s['h']} heads of width {s['hd']}; rope_store needs "
                         f"{nq} + 2 x {nkv} heads of an even, non-zero width")
    if qk_norm is not None:
        check_tensor("qk_norm", qk_norm, (nq + nkv, s["hd"]), qkv.dtype, device=qkv.device,
                     contiguous=True)
    if s["R"] == 0:
        return
    block = block_size(s["hd"])
    on = pdl_on(pdl, qkv)
    _rope_store_kernel[(s["R"], nq + nkv)](
        qkv, positions.contiguous(), inv_freq, or_dummy(qk_norm, qkv),
        keys, values, rows.contiguous(), nq, nkv, s["hd"], float(eps), float(scale),
        qkv.stride(0), qkv.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2),
        BLOCK_D=block, NORM=qk_norm is not None, PDL=on, num_warps=warps_for(block, (256,)),
        enable_fp_fusion=False,  # no FMA: the two products round as the reference's do
        **pdl_kwargs(on))


__all__ = ["rope_store", "rope_store_reference"]
