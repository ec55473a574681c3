"""The online-softmax steps shared by the attention kernels (``block_attention``,
``cache_attention``): one tile of keys and values folded into a running max, sum and output, in
fp32 (fp32 operands multiplied exactly, no TF32), and the fold of a split context's partials.
Imports nothing of draftsmith.
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


@triton.jit
def _fold_splits(m_ptr, l_ptr, acc_ptr, base, d, d_ok, HD, SPLITS):
    """The output ``[BLOCK_D]`` (fp32) of one query row and head from its ``SPLITS`` partials
    (running max and sum at ``m_ptr + base + s``, unnormalised output at ``acc_ptr + (base +
    s) * HD``), folded in split order ``s = 0, 1, ..``: a split that saw no column holds exact
    zeros and a -1e30 max, so it changes no bit and makes no NaN. ``SPLITS`` is a runtime
    count, so one compiled kernel serves every width: unrolled over a constant count, the
    combine kernel took 2.8 s to compile for sm_90 at 64 splits (16k columns), 14.3 s at 128 and
    102 s at 256 (64k columns), once per cache width."""
    top = tl.load(m_ptr + base)
    for s in range(1, SPLITS):
        top = tl.maximum(top, tl.load(m_ptr + base + s))
    total = tl.zeros([1], tl.float32)
    acc = tl.zeros(d.shape, tl.float32)
    for s in range(SPLITS):
        w = tl.exp2(tl.load(m_ptr + base + s) - top)
        total += tl.load(l_ptr + base + s) * w
        acc += tl.load(acc_ptr + (base + s) * HD + d, mask=d_ok, other=0.0) * w
    return acc / tl.maximum(total, 1.0e-30)
