"""Triton kernels, each beside its eager reference (``<op>_reference``, ``_<op>_kernel``, ``<op>``).

May import ``contract`` only. The only layer that imports triton.
"""

from __future__ import annotations

import os


def interpreted() -> bool:
    """Whether Triton runs kernels under its CPU interpreter (``TRITON_INTERPRET=1``, which must
    be set before any kernel module is imported): then kernels launch on CPU tensors too."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


__all__ = ["interpreted"]
