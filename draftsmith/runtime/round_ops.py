"""Small tensor steps the round and the admission share: the moves between a packed verify's
token rows and the ``[G, Q]`` block. Hot path: must not import pluggy, the registry or bind.
"""

from __future__ import annotations

import torch


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


__all__ = ["scatter_rows", "unpack"]
