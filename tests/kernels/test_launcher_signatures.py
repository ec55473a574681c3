"""STYLE's kernel layout: each public launcher ``<op>`` takes its reference ``<op>_reference``'s
exact parameters (names, kinds, defaults), so one can replace the other in any call."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import draftsmith.kernels as kernels


def _pairs() -> list[tuple[str, str]]:
    out = []
    for info in pkgutil.iter_modules(kernels.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"draftsmith.kernels.{info.name}")
        for name in getattr(module, "__all__", ()):
            op = name.removesuffix("_reference")
            launcher = getattr(module, op, None) if name != op else None
            # device helpers (``@triton.jit`` objects, not functions) are called from kernels,
            # not in place of the reference
            if inspect.isfunction(launcher):
                out.append((info.name, op))
    return out


PAIRS = _pairs()


def test_the_layout_is_found() -> None:
    ops = {op for _, op in PAIRS}
    assert {"markov_step", "strict_accept", "prepare_placement", "forced_accept",
            "store_context", "argmax_pair", "gumbel_pair"} <= ops


@pytest.mark.parametrize("module,op", PAIRS)
def test_launcher_takes_the_reference_signature(module: str, op: str) -> None:
    mod = importlib.import_module(f"draftsmith.kernels.{module}")

    def params(fn) -> list[tuple[str, object, object]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert params(getattr(mod, op)) == params(getattr(mod, f"{op}_reference"))
