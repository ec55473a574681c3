"""Counter-based uniforms: Philox4x32-10 keyed by a 64-bit seed.

Owns the keyed uniforms' pure-torch reference ``philox_uniform_reference``, the raw block
function ``philox4x32_10_reference`` and the ``@triton.jit`` helpers that kernels call
(``philox4x32_10``, ``centred_uniform``, ``split_u64``). Imports ``draftsmith.contract`` only.

Keying (identical on every tensor-parallel rank): one Philox call yields four 32-bit words, and
the four consecutive global ids ``4q .. 4q + 3`` share call ``q``::

    key     = (seed & 0xFFFFFFFF, seed >> 32)                          the request seed
    counter = (id >> 2, offset & 0xFFFFFFFF, offset >> 32, stream)     offset = sequence position
    k       = philox4x32_10(counter, key)[id & 3] >> 9                 top 23 bits of that word
    u       = (k + 0.5) * 2**-23                                       in [2**-24, 1 - 2**-24]

Streams: 0 target sample / residual / bonus, 1 draft sample, 2 acceptance uniform (id 0, so
word 0 of counter ``(0, offset, stream)``). Bits 29 and 30 of the stream word key
``gumbel_pair``'s per-group draws. Every ``u`` is exact in fp32 and never 0 or 1, so
``-ln(-ln(u))`` is finite.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError
from draftsmith.kernels._launch import block_size

PHILOX_M0 = 0xD2511F53
"""Philox4x32 round multiplier applied to counter word 0."""
PHILOX_M1 = 0xCD9E8D57
"""Philox4x32 round multiplier applied to counter word 2."""
PHILOX_W0 = 0x9E3779B9
"""Key schedule increment of key word 0 (golden ratio)."""
PHILOX_W1 = 0xBB67AE85
"""Key schedule increment of key word 1 (sqrt(3) - 1)."""
PHILOX_ROUNDS = 10

STREAM_TARGET = 0
"""Target sample, residual and bonus draws."""
STREAM_DRAFT = 1
"""Draft-token sampling."""
STREAM_ACCEPT = 2
"""Acceptance uniforms of rejection sampling (token id 0, ``u`` used directly)."""

_MASK32 = 0xFFFFFFFF
_U_SCALE = 2.0**-23


def _mulhilo32(a: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hi, lo)`` words of the 64-bit product of uint32 values held in int64.

    The product can exceed ``2**63``; torch's int64 multiply wraps modulo ``2**64`` (two's
    complement), which keeps all 64 product bits, so masking recovers both words exactly. The
    known-answer tests pin this down.
    """
    prod = a * b
    return (prod >> 32) & _MASK32, prod & _MASK32


def philox4x32_10_reference(
    counter: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    key: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Philox4x32-10 block function (Salmon et al., SC'11; Random123 ``philox4x32``).

    ``counter``: four broadcastable int64 tensors holding uint32 values; ``key``: two. Returns the
    four output words as int64 tensors in ``[0, 2**32)``. Each round::

        hi0, lo0 = mulhilo(M0, c0);  hi1, lo1 = mulhilo(M1, c2)
        c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0);  k += (W0, W1) mod 2**32
    """
    c0, c1, c2, c3 = (torch.as_tensor(c, dtype=torch.int64) & _MASK32 for c in counter)
    k0, k1 = (torch.as_tensor(k, dtype=torch.int64) & _MASK32 for k in key)
    for _ in range(PHILOX_ROUNDS):
        hi0, lo0 = _mulhilo32(c0, PHILOX_M0)
        hi1, lo1 = _mulhilo32(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + PHILOX_W0) & _MASK32
        k1 = (k1 + PHILOX_W1) & _MASK32
    return c0, c1, c2, c3


def centred_uniform_reference(word: torch.Tensor) -> torch.Tensor:
    """``u = ((word >> 9) + 0.5) * 2**-23`` as fp32 (exact) for ``word`` uint32 held in int64."""
    return ((word >> 9).to(torch.float32) + 0.5) * _U_SCALE


def _check_stream(stream: int) -> None:
    if not isinstance(stream, int) or not 0 <= stream < 2**32:
        raise ShapeError(f"stream must be an int in [0, 2**32) (0 target, 1 draft, 2 accept), "
                         f"got {stream!r}")


def philox_uniform_reference(
    seeds: torch.Tensor, offsets: torch.Tensor, ids: torch.Tensor, stream: int
) -> torch.Tensor:
    """Keyed uniforms ``u[row, i]`` of global id ``ids[row, i]`` at ``(offsets[row], stream)``.

    ``seeds: [rows] int64``, ``offsets: [rows] int64`` (or ``[rows, n]``, one offset per
    element), ``ids: [rows, n] int64`` (or ``[n]``, shared by every row) global token ids;
    ``stream`` 0, 1 or 2. Returns ``[rows, n] float32`` in ``[2**-24, 1 - 2**-24]`` (see the
    module docstring for the exact map).
    """
    _check_stream(stream)
    seeds, offsets = seeds.to(torch.int64), offsets.to(torch.int64)
    ids = ids.to(torch.int64)
    if ids.dim() == 1:
        ids = ids.expand(seeds.shape[0], -1)
    col = (slice(None), None)
    if offsets.dim() == 1:
        offsets = offsets[col]
    words = philox4x32_10_reference(
        (ids >> 2, offsets & _MASK32, (offsets >> 32) & _MASK32, torch.full_like(ids, stream)),
        ((seeds & _MASK32)[col], ((seeds >> 32) & _MASK32)[col]),
    )
    lane = ids & 3
    word = torch.where(lane == 0, words[0], torch.where(lane == 1, words[1], torch.where(
        lane == 2, words[2], words[3])))
    return centred_uniform_reference(word)


@triton.jit
def _mul_wide(a, b: tl.constexpr):
    """``(hi, lo)`` of the 64-bit product of uint32 ``a`` and the constant ``b``, as one
    ``mul.wide.u32`` (ptxas keeps ``umulhi`` and ``*`` as two multiplies)."""
    return tl.inline_asm_elementwise(
        "{ .reg .b64 p; mul.wide.u32 p, $2, $3; mov.b64 {$1, $0}, p; }", "=r,=r,r,r",
        [a, tl.full(a.shape, b, tl.uint32)], dtype=(tl.uint32, tl.uint32), is_pure=True, pack=1)


@triton.jit
def philox4x32_10(k0, k1, c0, c1, c2, c3, WIDE_MUL: tl.constexpr):
    """The four words of Philox4x32-10 for uint32 key ``(k0, k1)`` and counter ``(c0..c3)``.

    Scalars stay scalars (a counter word shared by the tile costs one multiply per program).
    ``WIDE_MUL`` (CUDA only): each round's products as one wide multiply (same bits).
    """
    for _ in tl.static_range(10):
        if WIDE_MUL:
            hi0, lo0 = _mul_wide(c0, 0xD2511F53)
            hi1, lo1 = _mul_wide(c2, 0xCD9E8D57)
        else:
            hi0 = tl.umulhi(c0, 0xD2511F53)
            lo0 = c0 * 0xD2511F53
            hi1 = tl.umulhi(c2, 0xCD9E8D57)
            lo1 = c2 * 0xCD9E8D57
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@triton.jit
def centred_uniform(word):
    """``((word >> 9) + 0.5) * 2**-23`` in fp32 for a uint32 ``word``; exact, never 0 or 1.

    Built from bits (no int-to-float conversion): ``1 + k * 2**-23`` minus ``1 - 2**-24`` is
    ``(2k + 1) * 2**-24``, representable, hence exact.
    """
    one_plus = ((word >> 9) | 0x3F800000).to(tl.float32, bitcast=True)
    return one_plus - 0.9999999403953552  # 1 - 2**-24


@triton.jit
def split_u64(x):
    """``(x & 0xFFFFFFFF, x >> 32)`` of an int64 value as two uint32 values."""
    lo = (x & 0xFFFFFFFF).to(tl.uint32)
    hi = ((x >> 32) & 0xFFFFFFFF).to(tl.uint32)
    return lo, hi


@triton.jit
def _philox_uniform_kernel(seeds_ptr, offsets_ptr, ids_ptr, out_ptr, n, s_off_row, s_off_col,
                           s_ids_row, s_ids_col, STREAM: tl.constexpr, BLOCK: tl.constexpr,
                           WIDE_MUL: tl.constexpr):
    """Program ``(row, block)``: ``u[row, block * BLOCK ..]``, the reference's map."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n
    k0, k1 = split_u64(tl.load(seeds_ptr + row))
    off = tl.load(offsets_ptr + row * s_off_row + cols * s_off_col, mask=ok, other=0)
    ids = tl.load(ids_ptr + row * s_ids_row + cols * s_ids_col, mask=ok, other=0)
    off_lo, off_hi = split_u64(off)
    w0, w1, w2, w3 = philox4x32_10(k0, k1, (ids >> 2).to(tl.uint32), off_lo, off_hi, STREAM,
                                   WIDE_MUL)
    lane = ids & 3
    word = tl.where(lane == 0, w0, tl.where(lane == 1, w1, tl.where(lane == 2, w2, w3)))
    tl.store(out_ptr + row * n + cols, centred_uniform(word), mask=ok)


def philox_uniform(
    seeds: torch.Tensor, offsets: torch.Tensor, ids: torch.Tensor, stream: int
) -> torch.Tensor:
    """Kernel form of :func:`philox_uniform_reference` (same arguments, same bits), one launch:
    a few keyed uniforms (rejection sampling's acceptance draws) without the reference's ~200
    small integer kernels."""
    _check_stream(stream)
    rows = seeds.shape[0] if seeds.dim() == 1 else -1
    n = ids.shape[-1] if ids.dim() in (1, 2) else -1
    if (rows < 0 or n < 0 or (ids.dim() == 2 and ids.shape[0] != rows)
            or offsets.dim() not in (1, 2) or offsets.shape[0] != rows
            or (offsets.dim() == 2 and offsets.shape[1] != n)):
        raise ShapeError(f"philox_uniform needs seeds [rows], offsets [rows] or [rows, n] and "
                         f"ids [n] or [rows, n], got {tuple(seeds.shape)}, "
                         f"{tuple(offsets.shape)} and {tuple(ids.shape)}")
    ids = ids.to(torch.int64)
    if ids.dim() == 1:
        ids = ids.expand(rows, -1)
    offsets = offsets.to(torch.int64)
    s_off = (offsets.stride(0), offsets.stride(1)) if offsets.dim() == 2 else (offsets.stride(0),
                                                                              0)
    out = torch.empty(rows, n, dtype=torch.float32, device=seeds.device)
    if rows and n:
        block = block_size(n, lo=16, hi=1024)
        _philox_uniform_kernel[(rows, triton.cdiv(n, block))](
            seeds.to(torch.int64).contiguous(), offsets, ids, out, n, *s_off, ids.stride(0),
            ids.stride(1), STREAM=stream, BLOCK=block, WIDE_MUL=seeds.is_cuda)
    return out


__all__ = [
    "STREAM_ACCEPT",
    "STREAM_DRAFT",
    "STREAM_TARGET",
    "centred_uniform",
    "centred_uniform_reference",
    "philox4x32_10",
    "philox4x32_10_reference",
    "philox_uniform",
    "philox_uniform_reference",
    "split_u64",
]
