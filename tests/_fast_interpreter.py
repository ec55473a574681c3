"""Triton's interpreter, made cheaper to enter for the suite (test set-up only; no result changes).

On every kernel launch and on every call of a ``@triton.jit`` helper from a kernel, the
interpreter re-patches ``triton.language``: ``inspect.getmembers`` over ``tl``, ``tl.core``,
``tl.tensor``, ``tl.math`` and the tensor descriptors, keeping the members that are Triton
builtins. The builtins among those are fixed, yet the scan was a quarter of an
interpreter-bound test's time (``test_strict_accept``'s adversarial rows, 2-core machine,
2026-12-05). :func:`install` lists each package's builtins once, before any kernel has patched
anything, and the patch then walks that list, testing each member as the interpreter does, so
it patches exactly what the scan would. Where the interpreter's private names differ (another
Triton release), nothing is installed and the interpreter runs as shipped.
"""

from __future__ import annotations

import inspect
from typing import Any


def install() -> bool:
    """Replace the interpreter's package scan with a fixed list (once; the scan stays reachable
    as the replacement's ``scan``); whether it is installed."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch_attr = getattr(interpreter, "_patch_attr", None)
    original = getattr(interpreter, "_patch_builtin", None)
    if hasattr(original, "scan"):
        return True
    is_builtin = getattr(getattr(tl, "core", None), "is_builtin", None)
    if patch_attr is None or original is None or is_builtin is None:
        return False
    if list(inspect.signature(original).parameters) != ["pkg", "builder", "scope"]:
        return False
    packages = [tl, tl.core, tl.tensor, tl.math]
    descriptor = getattr(tl.core, "tensor_descriptor_base", None)
    if descriptor is not None:
        packages.append(descriptor)
    names = {id(pkg): [name for name, member in inspect.getmembers(pkg) if is_builtin(member)]
             for pkg in packages}

    def patch_builtin(pkg: Any, builder: Any, scope: Any) -> None:
        listed = names.get(id(pkg))
        if listed is None:
            original(pkg, builder, scope)
            return
        for name in listed:
            member = getattr(pkg, name)
            if is_builtin(member):
                patch_attr(pkg, name, member, builder, scope)

    patch_builtin.scan = original  # type: ignore[attr-defined]
    interpreter._patch_builtin = patch_builtin
    return True
