"""The suite's faster entry into Triton's interpreter (``tests/_fast_interpreter.py``) patches
exactly the members the interpreter's own package scan patches, on every package it lists."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="only the interpreter is patched")


class _Recorder:
    """A patch scope that records what would be patched and changes nothing."""

    def __init__(self) -> None:
        self.names: list[tuple[int, str]] = []

    def set_attr(self, obj: object, name: str, value: object) -> None:
        self.names.append((id(obj), name))


def test_the_listed_builtins_are_the_scanned_ones():
    import triton.language as tl
    from _fast_interpreter import install
    from triton.runtime import interpreter

    fast = interpreter._patch_builtin
    assert install() and interpreter._patch_builtin is fast, "the conftest installed it once"
    scan = fast.scan
    for pkg in (tl, tl.core, tl.tensor, tl.math, tl.core.tensor_descriptor_base):
        want, got = _Recorder(), _Recorder()
        scan(pkg, None, want)
        fast(pkg, None, got)
        assert got.names == want.names and len(want.names) > 0, pkg
