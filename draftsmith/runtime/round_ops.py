"""Small tensor steps the round and the admission share: the top-2 margins of a row's logits
and the moves between a packed verify's token rows and the ``[G, Q]`` block. Hot path: must
not import pluggy, the registry or bind.
"""

from __future__ import annotations

import torch


def top2(logits: torch.Tensor) -> torch.Tensor:
    """``[rows, 2] fp32``: each row's largest logit and its margin over the second largest
    (``torch.topk(logits, 2)``'s values: a tie gives margin 0, a NaN leads).

    Two max passes, the winner masked between them and put back (``logits`` is left as it
    was), instead of ``topk``'s radix select: that took 0.58 ms of a 1024-row verify round of
    SmolLM2's vocabulary on an H200, and the max passes are not among that round's eight
    costliest kernels (each under 0.13 ms; ``benchmarks/rows.py``)."""
    with torch.inference_mode():  # the logits may be inference tensors (written in place)
        x = logits.float()
        first, where = x.max(-1, keepdim=True)
        held = x.gather(-1, where)
        x.scatter_(-1, where, float("-inf"))
        second = x.max(-1, keepdim=True).values
        x.scatter_(-1, where, held)
        return torch.cat((first, first - second), dim=-1)


def unpack(values: torch.Tensor, rows: torch.Tensor | None, total: int) -> torch.Tensor:
    """``values: [T, ...]`` of a packed verify's ``rows`` placed in ``[total, ...]`` zeros (as is
    when ``rows`` is ``None``)."""
    if rows is None:
        return values
    return values.new_zeros(total, *values.shape[1:]).index_copy_(0, rows, values)


def scatter_rows(dest: torch.Tensor, values: torch.Tensor, rows: torch.Tensor | None) -> None:
    """Write ``values`` (``[G * Q, F]``, or with ``rows: [T]`` those rows' ``[T, F]``) into
    ``dest: [G, Q, F]`` (contiguous when ``rows`` is given); rows not listed keep their values."""
    if rows is None:
        dest.copy_(values.view(dest.shape))
    else:
        dest.view(-1, dest.shape[-1]).index_copy_(0, rows, values.to(dest.dtype))


__all__ = ["scatter_rows", "top2", "unpack"]
