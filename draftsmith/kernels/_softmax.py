"""The online-softmax tile step shared by the attention kernels (``block_attention``,
``cache_attention``): one tile of keys and values folded into a running max, sum and output, in
fp32 (fp32 operands multiplied exactly, no TF32). Imports nothing of draftsmith.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """``a @ b`` accumulated in fp32; fp32 operands multiplied exactly (no TF32)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee", out_dtype=tl.float32)
    return tl.dot(a, b, out_dtype=tl.float32)


@triton.jit
def _online_softmax(q, k, v, ok, m_i, l_i, acc, qk_scale, IEEE: tl.constexpr):
    """Fold one tile of keys ``k`` and values ``v`` ``[N, D]`` (visible where ``ok [M, N]``)
    into the running max ``m_i``, sum ``l_i`` and output ``acc`` of the queries ``q [M, D]``
    (base-2 softmax; masked scores contribute nothing)."""
    s = _dot(q, tl.trans(k.to(q.dtype)), IEEE) * qk_scale
    s = tl.where(ok, s, -1.0e30)
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    p = tl.where(ok, tl.exp2(s - m_new[:, None]), 0.0)
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + _dot(p.to(q.dtype), v.to(q.dtype), IEEE)
    return m_new, l_i, acc
