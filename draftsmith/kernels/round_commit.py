"""The end of a round on the device: each row's accepted tokens and count written to the round
state and to the one row the host reads, in one launch.

Owns ``round_commit``. In torch the same writes were about ten launches a round (two copies,
an add, a comparison, a product and a max for the NaN flag, three slice assignments and the
margins' bit casts); inside a captured round each cost launch latency, not bandwidth. Imports
``draftsmith.contract`` only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from draftsmith.contract import ShapeError, check_tensor
from draftsmith.kernels._launch import block_size, or_dummy

_I64 = torch.int64


def round_commit_reference(
    accepted: torch.Tensor,
    num_accepted: torch.Tensor,
    starts: torch.Tensor,
    nan: torch.Tensor,
    top2: torch.Tensor | None,
    state_accepted: torch.Tensor,
    state_num: torch.Tensor,
    state_len: torch.Tensor,
    result: torch.Tensor,
    margin_col: int,
) -> None:
    """Write a round's outcome in place.

    ``accepted: [G, Q] int64`` (the bonus and drafts a row keeps come first), ``num_accepted:
    [G] int64`` (``n``), ``starts: [G] int64`` (each row's first verified position), ``nan:
    [G * Q] int64`` (non-zero where that verify row's logits hold a NaN), ``top2: [G * Q, 2]
    fp32 | None`` (:func:`~draftsmith.kernels.logit_summary.logit_summary`'s margins). Writes
    ``state_accepted[:, :Q]`` (``[G, >= Q]``), ``state_num [G]``, ``state_len [G]`` and
    ``result: [G, W] int64``::

        state_accepted[:, :Q] = accepted;  state_num = n;  state_len = starts + n
        result[:, 0] = n
        result[:, 1] = max over j < n of nan[b * Q + j]     (a committed token's NaN)
        result[:, 2 : Q + 2] = accepted
        result[:, margin_col : margin_col + 2 Q] = top2's fp32 bit patterns, sign-extended
                                                    (only when top2 is given)
    """
    g, q = accepted.shape
    state_accepted[:, :q].copy_(accepted)
    state_num.copy_(num_accepted)
    torch.add(starts, num_accepted, out=state_len)
    columns = torch.arange(q, device=accepted.device)
    result[:, 0] = num_accepted
    result[:, 1] = (nan.view(g, q) * (columns < num_accepted[:, None])).amax(-1)
    result[:, 2 : q + 2] = accepted
    if top2 is not None:
        bits = top2.view(torch.int32).to(_I64)
        result[:, margin_col : margin_col + 2 * q] = bits.view(g, 2 * q)


@triton.jit
def _round_commit_kernel(
    acc_ptr, n_ptr, start_ptr, nan_ptr, top2_ptr, st_acc_ptr, st_n_ptr, st_len_ptr, res_ptr,
    Q, margin_col, s_acc, s_st_acc, s_res,
    MARGINS: tl.constexpr, BLOCK_Q: tl.constexpr,
):
    """Program ``b`` writes row ``b``'s outcome."""
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_Q)
    ok = j < Q
    # every load before the first store (a load after a store waits for it): the flags of every
    # column, those past the accepted count zeroed after
    n = tl.load(n_ptr + b)
    tokens = tl.load(acc_ptr + b * s_acc + j, mask=ok)
    start = tl.load(start_ptr + b)
    flags = tl.load(nan_ptr + b * Q + j, mask=ok, other=0)
    if MARGINS:
        pair = top2_ptr + (b * Q + j) * 2
        first = tl.load(pair, mask=ok).to(tl.int32, bitcast=True).to(tl.int64)
        margin = tl.load(pair + 1, mask=ok).to(tl.int32, bitcast=True).to(tl.int64)
    flags = tl.where(j < n, flags, 0)
    tl.store(st_acc_ptr + b * s_st_acc + j, tokens, mask=ok)
    tl.store(st_n_ptr + b, n)
    tl.store(st_len_ptr + b, start + n)
    row = res_ptr + b * s_res
    tl.store(row, n)
    tl.store(row + 1, tl.max(flags, axis=0))
    tl.store(row + 2 + j, tokens, mask=ok)
    if MARGINS:
        tl.store(row + margin_col + 2 * j, first, mask=ok)
        tl.store(row + margin_col + 2 * j + 1, margin, mask=ok)


def round_commit(
    accepted: torch.Tensor,
    num_accepted: torch.Tensor,
    starts: torch.Tensor,
    nan: torch.Tensor,
    top2: torch.Tensor | None,
    state_accepted: torch.Tensor,
    state_num: torch.Tensor,
    state_len: torch.Tensor,
    result: torch.Tensor,
    margin_col: int,
) -> None:
    """Kernel form of :func:`round_commit_reference` (same arguments, same writes), one launch.
    ``accepted``, ``state_accepted`` and ``result`` need a unit stride along their last dim;
    ``num_accepted``, ``starts``, ``state_num``, ``state_len`` and ``nan`` a unit stride;
    ``top2`` contiguous."""
    s: dict[str, int] = {}
    check_tensor("accepted", accepted, ("G", "Q"), _I64, s, unit_stride=True)
    dev = accepted.device
    for name, t in (("num_accepted", num_accepted), ("starts", starts), ("state_num", state_num),
                    ("state_len", state_len)):
        check_tensor(name, t, ("G",), _I64, s, dev, contiguous=True)
    g, q = s["G"], s["Q"]
    check_tensor("nan", nan, (g * q,), _I64, None, dev, contiguous=True)
    if top2 is not None:
        check_tensor("top2", top2, (g * q, 2), torch.float32, None, dev, contiguous=True)
    check_tensor("state_accepted", state_accepted, ("G", None), _I64, s, dev, unit_stride=True)
    check_tensor("result", result, ("G", None), _I64, s, dev, unit_stride=True)
    if state_accepted.shape[1] < q:
        raise ShapeError(f"state_accepted has {state_accepted.shape[1]} columns, the round "
                         f"commits {q}")
    need = max(q + 2, margin_col + 2 * q if top2 is not None else 0)
    if result.shape[1] < need or (top2 is not None and margin_col < q + 2):
        raise ShapeError(f"result has {result.shape[1]} columns; [n, nan, {q} tokens] and the "
                         f"margins from column {margin_col} need {need}, the margins after the "
                         "tokens")
    if g == 0:
        return
    _round_commit_kernel[(g,)](
        accepted, num_accepted, starts, nan, or_dummy(top2, nan), state_accepted, state_num,
        state_len, result, q, margin_col, accepted.stride(0), state_accepted.stride(0),
        result.stride(0), MARGINS=top2 is not None, BLOCK_Q=block_size(q, lo=2), num_warps=1,
    )


__all__ = ["round_commit", "round_commit_reference"]
