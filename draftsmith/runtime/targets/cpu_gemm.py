"""Few-row products on the CPU (``target.gemm = packed``): oneDNN's linear over a weight packed
once at load, with one-row products run as two identical rows.

Why: torch's CPU GEMM (MKL) multiplies 2-8 rows with kernels several times slower than its
one-row GEMV, so a verification of ``K + 1`` tokens cost about twice a plain decoding step.
Measured on the 2-core AMD EPYC (Zen 4, AVX-512) development machine, torch 2.13.0 CPU build,
fp32, SmolLM2-135M's shapes, one thread, 30 distinct weights cycled so each product reads its
weight from memory as a decoding step does (milliseconds, median of 30; other agents loaded the
machine, so compare within a line)::

    product            rows:   1      2      4      8
    [1536 | 1536] x 576  F.linear  0.78   1.41   1.25   1.19
                         W @ x.T   0.77   0.30   0.35   0.80
                         x @ W.T' (transposed copy) 0.44  0.72  1.42  1.41
                         packed    0.53   0.44   0.35   0.41
                         bf16      0.52   0.43   0.42   0.49
    576 x 1536           F.linear  0.29   0.40   0.40   0.33
                         packed    0.36   0.23   0.18   0.21
    LM head 49152 x 576  F.linear  10.8   23.3   18.9   22.3
    (two weights cycled) W @ x.T   10.8    5.0    7.0   16.7
                         packed     5.5    6.1    4.6    7.0
                         bf16       6.1    6.0    6.6    7.3

``packed`` is ``torch.ops.mkldnn._reorder_linear_weight`` (a blocked layout for an expected
batch of :data:`PACK_BATCH_HINT` rows) and ``torch.ops.mkldnn._linear_pointwise``. It costs
about the same at 2-8 rows as one row, where torch's product costs 1.5-2x more. bf16 weights
were no faster than packed fp32 and change the target's logits.

Rounding: oneDNN may multiply some rows with other kernels than the rest, and which depends on
the torch build and the CPU. On an AVX-512 machine torch 2.13 ran a one-row product with another
kernel than two or more rows; on an AVX2 one (2026-12-05) it rounds every row alike whatever the
row count, while torch 2.11 there multiplies rows in blocks of six and rounds the rows of a last
block of one to three rows differently. So a product runs with its row count rounded up
to a multiple of :func:`row_quantum` (copies of its first row added: free in a memory-bound
product), the smallest multiple under which a row's result is bit-identical whatever the row
count, found once per dtype and thread count by probing two weights at 1-33 rows. Then a
verification rounds as decoding its tokens one by one does (checked at 1-100 rows, one and two
threads, with and without bias, fp32 and bf16, by ``tests/runtime/targets/test_cpu_gemm.py`` on
the machine that runs it). torch's GEMM gives three classes (1, 2-3, 4+ rows).

A packed weight is a copy (the module keeps its own parameter, which the embedding may share),
made when the target is built and made again if the parameter is replaced or written in place.
Must not import drafters or selection.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterable

import torch
import torch.nn.functional as F

PACK_BATCH_HINT = 8
"""Rows oneDNN lays the packed weight out for (a verification of ``K + 1 = 8`` tokens); the
layout serves every row count, and the hint changes only its speed (1 measured slower at 2-8
rows on the LM head: 8.0-10.4 ms against 4.6-7.0)."""

QUANTA = (1, 2, 4, 6, 8, 12, 16)
"""Row multiples :func:`row_quantum` tries, smallest first."""

_PROBE_SHAPES = ((96, 64), (1000, 576))
_PROBE_COUNTS = (1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33)

PACKED_DTYPES = (torch.float32, torch.bfloat16)
"""Weight dtypes the packed product takes (bf16 where the CPU multiplies it natively)."""


def packed_blocker(dtype: torch.dtype, device: torch.device) -> str | None:
    """Why the packed product cannot run weights of ``dtype`` on ``device``, or ``None``."""
    if device.type != "cpu":
        return f"the target is on {device}, not the CPU"
    if dtype not in PACKED_DTYPES:
        return f"the packed product takes fp32 and bf16 weights, not {dtype}"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False)"
    if dtype == torch.bfloat16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "this CPU has no native bf16 products for oneDNN"
    try:
        _pack(torch.zeros(2, 2, dtype=dtype))
    except (RuntimeError, AttributeError) as exc:  # an op this torch build lacks
        return f"torch's oneDNN linear ops failed: {exc}"
    if row_quantum(dtype) is None:
        return (f"oneDNN's product on this torch build and CPU rounds a row differently at "
                f"different row counts, even with the count rounded up to a multiple of "
                f"{QUANTA[-1]}")
    return None


def row_quantum(dtype: torch.dtype) -> int | None:
    """The multiple a packed product of ``dtype`` rounds its row count up to, so that a row's
    bits do not depend on the row count (at the current thread count); ``None`` where no
    multiple in :data:`QUANTA` gives that. Probed once per dtype and thread count."""
    return _probe_quantum(dtype, torch.get_num_threads())


@functools.cache
def _probe_quantum(dtype: torch.dtype, threads: int) -> int | None:
    del threads  # the cache key: oneDNN may pick other kernels for another thread count
    g = torch.Generator().manual_seed(0)
    probes = []
    for shape in _PROBE_SHAPES:
        weight = (torch.randn(*shape, generator=g) * 0.05).to(dtype)
        x = torch.randn(max(_PROBE_COUNTS), shape[1], generator=g).to(dtype)
        probes.append((_pack(weight), x))
    with torch.no_grad():
        for quantum in QUANTA:
            if all(_row_stable(packed, x, quantum) for packed, x in probes):
                return quantum
    return None


def _row_stable(packed: torch.Tensor, x: torch.Tensor, quantum: int) -> bool:
    """Whether each row of ``x: [R, in]`` multiplied alone has the bits it has in a product of
    every count in ``_PROBE_COUNTS``, every count rounded up to a multiple of ``quantum``."""
    alone = torch.cat([_padded(x[r : r + 1], packed, None, quantum) for r in range(len(x))])
    return all(torch.equal(_padded(x[:n], packed, None, quantum), alone[:n])
               for n in _PROBE_COUNTS)


def _padded(rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
            quantum: int) -> torch.Tensor:
    """``rows: [n, in]`` contiguous times the packed weight, run with copies of the first row
    added up to a multiple of ``quantum`` rows; ``[n, out]``."""
    n = rows.shape[0]
    extra = -n % quantum
    if extra == 0 or n == 0:
        return _linear(rows, packed, bias)
    full = torch.cat([rows, rows[:1].expand(extra, -1)])
    return _linear(full, packed, bias)[:n]


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_BATCH_HINT)


class PackedWeight:
    """A ``[out, in]`` weight packed for oneDNN, and the parameter it was packed from."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.source = weight
        self.version = weight._version
        self.out_features, self.in_features = (int(n) for n in weight.shape)
        self.packed = _pack(weight)

    def current(self, weight: torch.Tensor) -> PackedWeight:
        """This packing, or a new one when ``weight`` is another tensor or was written since."""
        if weight is self.source and weight._version == self.version:
            return self
        return PackedWeight(weight)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T + bias``: ``x: [..., in]`` -> ``[..., out]`` in the weight's dtype; a row's
        result does not depend on the number of rows (see the module docstring)."""
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features).contiguous()
        out = _padded(rows, self.packed, bias, row_quantum(self.source.dtype) or 1)
        return out.view(*lead, self.out_features)


def _linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


_PACKED: dict[int, tuple[weakref.ref[torch.Tensor], PackedWeight]] = {}
"""Packings of weights multiplied through :func:`packed_linear`, by the weight's ``id`` (with a
reference that tells whether that weight is still the one packed)."""


def packed_linear(x: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` (``x: [..., in]``, ``weight: [out, in]``) through the packing of
    ``weight``, made on its first product (and again after it is written)."""
    key = id(weight)
    entry = _PACKED.get(key)
    if entry is None or entry[0]() is not weight:
        for stale in [k for k, (ref, _) in _PACKED.items() if ref() is None]:
            del _PACKED[stale]
        entry = (weakref.ref(weight), PackedWeight(weight))
    entry = (entry[0], entry[1].current(weight))
    _PACKED[key] = entry
    return entry[1](x, bias)


class PackedLinear(torch.nn.Linear):
    """An ``nn.Linear`` (same parameters, same state dict) whose product runs its packed weight;
    with autograd recording (a parameter or input that requires grad) it runs torch's."""

    packed: PackedWeight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            return F.linear(x, self.weight, self.bias)
        self.packed = self.packed.current(self.weight)
        return self.packed(x, self.bias)


def use_packed(modules: Iterable[torch.nn.Module]) -> None:
    """Pack the weight of every plain ``nn.Linear`` among ``modules`` and make it a
    :class:`PackedLinear`, in place (its parameters and state dict stay as they are)."""
    for module in modules:
        if type(module) is torch.nn.Linear:
            module.packed = PackedWeight(module.weight)
            module.__class__ = PackedLinear


__all__ = ["PACK_BATCH_HINT", "QUANTA", "PackedLinear", "PackedWeight", "packed_blocker",
           "packed_linear", "row_quantum", "use_packed"]
