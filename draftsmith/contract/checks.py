"""Shape and dtype validation shared by every tensor-bearing contract type and kernel launcher.

Shapes are written with the glossary's names (``("G", "W")``); a name binds to the first size seen
and must match everywhere after, so one call can check that several tensors agree.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, MutableMapping, Sequence

import torch

from draftsmith.contract.errors import ShapeError

Dim = int | str | None
"""One expected dimension: an exact size, a symbolic name bound on first use, or ``None`` (any)."""

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""The floating dtypes activations, weights and logits may have."""


def check_tensor(
    name: str,
    tensor: object,
    shape: Sequence[Dim] | None = None,
    dtype: torch.dtype | Iterable[torch.dtype] | None = None,
    sizes: MutableMapping[str, int] | None = None,
    device: torch.device | None = None,
    contiguous: bool = False,
    unit_stride: bool = False,
    distinct_rows: bool = False,
) -> torch.Tensor:
    """Raise :class:`ShapeError` unless ``tensor`` is a tensor of the given shape and dtype.

    ``sizes`` carries symbolic bindings across calls; it is updated in place. ``unit_stride``
    asks for consecutive elements along the last dim (a kernel indexes it without a stride);
    ``distinct_rows`` for rows along dim 0 that do not overlap (a kernel writes each row, and an
    expanded view would make every row one).
    """
    if not isinstance(tensor, torch.Tensor):
        raise ShapeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if dtype is not None:
        allowed = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
        if tensor.dtype not in allowed:
            names = " or ".join(str(d).removeprefix("torch.") for d in allowed)
            raise ShapeError(
                f"{name} must have dtype {names}, got {str(tensor.dtype).removeprefix('torch.')}"
            )
    if shape is not None:
        if tensor.dim() != len(shape):
            raise ShapeError(
                f"{name} must have {len(shape)} dims {_fmt(shape)}, got shape {tuple(tensor.shape)}"
            )
        bound = sizes if sizes is not None else {}
        for axis, (want, got) in enumerate(zip(shape, tensor.shape, strict=True)):
            if want is None:
                continue
            if isinstance(want, int):
                if got != want:
                    raise ShapeError(
                        f"{name} dim {axis} must be {want} {_fmt(shape)}, "
                        f"got shape {tuple(tensor.shape)}"
                    )
                continue
            if want in bound and bound[want] != got:
                raise ShapeError(
                    f"{name} dim {axis} ({want}) must be {bound[want]} to match the other "
                    f"tensors, got shape {tuple(tensor.shape)}"
                )
            bound.setdefault(want, int(got))
    if device is not None and tensor.device != device:
        raise ShapeError(f"{name} must be on {device}, got {tensor.device}")
    if contiguous and not tensor.is_contiguous():
        raise ShapeError(f"{name} must be contiguous; call .contiguous() first")
    if unit_stride and tensor.shape[-1] > 1 and tensor.stride(-1) != 1:
        raise ShapeError(f"{name} must have unit stride along its last dim; call .contiguous()")
    if distinct_rows and tensor.shape[0] > 1 and tensor.stride(0) < tensor.shape[-1]:
        raise ShapeError(f"{name} rows overlap in memory (row stride {tensor.stride(0)} < "
                         f"{tensor.shape[-1]} columns); pass a tensor with distinct rows")
    return tensor


_TRUSTED = [0]


@contextlib.contextmanager
def values_trusted() -> Iterator[None]:
    """Within this block, checks that would read tensor *values* back to the host (token ids in
    range) are skipped: the runtime wraps its rounds in it, whose ids it produced itself, so a
    round reads the device once. Shape and dtype checks still run."""
    _TRUSTED[0] += 1
    try:
        yield
    finally:
        _TRUSTED[0] -= 1


def value_checks_enabled(tensor: torch.Tensor) -> bool:
    """False inside :func:`values_trusted` and while a CUDA graph captures ``tensor``'s device
    (a capture cannot read back); True otherwise."""
    if _TRUSTED[0]:
        return False
    return not (tensor.is_cuda and torch.cuda.is_current_stream_capturing())


def check_positive(name: str, value: int, minimum: int = 1) -> int:
    """Raise :class:`ShapeError` unless ``value`` is an int ``>= minimum``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ShapeError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _fmt(shape: Sequence[Dim]) -> str:
    return "[" + ", ".join("*" if d is None else str(d) for d in shape) + "]"


__all__ = ["FLOAT_DTYPES", "Dim", "check_positive", "check_tensor", "value_checks_enabled", "values_trusted"]
