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

Rounding: oneDNN multiplies one row with another kernel than two or more, so a one-row product
runs as two copies of the row (:data:`MIN_ROWS`; at the same cost, the extra row is free in a
memory-bound product). From two rows on, a row's result is bit-identical whatever the row count
(checked at 2-300 rows, one and two threads, with and without bias, for fp32 and bf16, by
``tests/runtime/targets/test_cpu_gemm.py`` on the machine that runs it), so a verification rounds
as decoding its tokens one by one does. torch's GEMM gives three classes (1, 2-3, 4+ rows).

A packed weight is a copy (the module keeps its own parameter, which the embedding may share),
made when the target is built and made again if the parameter is replaced or written in place.
Must not import drafters or selection.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch
import torch.nn.functional as F

PACK_BATCH_HINT = 8
"""Rows oneDNN lays the packed weight out for (a verification of ``K + 1 = 8`` tokens); the
layout serves every row count, and the hint changes only its speed (1 measured slower at 2-8
rows on the LM head: 8.0-10.4 ms against 4.6-7.0)."""

MIN_ROWS = 2
"""Rows a product runs with at least: a one-row product runs its row twice (see above)."""

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
    return None


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
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] < MIN_ROWS:
            out = _linear(rows.expand(MIN_ROWS, -1).contiguous(), self.packed, bias)[:1]
        else:
            out = _linear(rows.contiguous(), self.packed, bias)
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


__all__ = ["MIN_ROWS", "PACK_BATCH_HINT", "PackedLinear", "PackedWeight", "packed_blocker",
           "packed_linear", "use_packed"]
