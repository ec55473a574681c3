"""Triton kernels, each beside its eager reference (``<op>_reference``, ``_<op>_kernel``, ``<op>``).

May import ``contract`` only. The only layer that imports triton.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from functools import cache

import torch

from draftsmith.contract import ConfigError


def interpreted() -> bool:
    """Whether Triton runs kernels under its CPU interpreter (``TRITON_INTERPRET=1``, which must
    be set before any kernel module is imported): then kernels launch on CPU tensors too."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string such as ``3.6.0`` or ``2.4.0rc1+git``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else (0, 0)


def interpreter_blocker(triton_version: str, numpy_version: str) -> str | None:
    """Why Triton's CPU interpreter cannot run draftsmith's kernels with these releases, or
    ``None``: Triton 3.6 and earlier turn a kernel's integer arguments into one-element arrays
    and call ``int()`` on them in loop bounds, which NumPy 2.4 refuses (every kernel with a
    loop over a runtime size then fails); Triton 3.7 squeezes them first."""
    if _release(triton_version) < (3, 7) and _release(numpy_version) >= (2, 4):
        return (f"TRITON_INTERPRET=1: Triton {triton_version}'s CPU interpreter cannot run with "
                f"NumPy {numpy_version} (it converts one-element arrays to int, which NumPy 2.4 "
                "refuses); install 'numpy<2.4' or 'triton>=3.7', or unset TRITON_INTERPRET")
    return None


if interpreted():
    import numpy
    import triton

    _blocker = interpreter_blocker(triton.__version__, numpy.__version__)
    if _blocker is not None:
        raise ConfigError(_blocker)


@cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def has_pdl(device: torch.device | str) -> bool:
    """Whether launches on ``device`` can be programmatically dependent: a CUDA device of
    compute capability 9.0 or above (Hopper's ``griddepcontrol``), on a host where CUDA is
    available."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _capability(index) >= (9, 0)


def pdl_on(asked: bool, tensor: torch.Tensor) -> bool:
    """Whether a launch on ``tensor``'s device runs with programmatic dependent launch (PDL):
    ``asked``, a CUDA tensor, and a device of compute capability 9.0 or above (Hopper's
    ``griddepcontrol``). Elsewhere (the CPU, Triton's interpreter, older GPUs) the launch is an
    ordinary one, with the same bits.

    Under PDL the next kernel's programs may start while this one's finish: each program of a
    PDL kernel waits (``_launch.pdl_start``) before it reads what an earlier kernel wrote or writes
    anything, so the order of every read and write is the stream's; only work that reads
    nothing an earlier kernel writes (an L2 prefetch of a weight) runs before the wait."""
    return asked and tensor.is_cuda and has_pdl(tensor.device)


_SCOPE = [0]


@contextlib.contextmanager
def pdl_scope(on: bool) -> Iterator[None]:
    """Within this block (when ``on``), the drafters' fused helpers launch their kernels with
    programmatic dependent launch (:func:`in_pdl_scope`): the runtime wraps a round's drafting
    in it under the plan's ``round_pdl``. Launches made outside it (training, evaluation, a
    plugin calling the helpers itself) are ordinary ones."""
    _SCOPE[0] += bool(on)
    try:
        yield
    finally:
        _SCOPE[0] -= bool(on)


def in_pdl_scope() -> bool:
    """Whether a :func:`pdl_scope` that asked for PDL is open (the helpers still launch with
    PDL only where :func:`pdl_on` holds)."""
    return _SCOPE[0] > 0


__all__ = [
    "has_pdl", "in_pdl_scope", "interpreted", "interpreter_blocker", "pdl_on", "pdl_scope",
]
