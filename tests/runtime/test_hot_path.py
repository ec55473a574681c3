"""Hooks run at bind time only: importing the decoding hot path never imports pluggy (checked
statically through every draftsmith module it imports at module level)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import draftsmith

HOT_PATH = ("draftsmith.runtime.decoder", "draftsmith.runtime.round",
            "draftsmith.runtime.paging", "draftsmith.runtime.markov",
            "draftsmith.runtime.acceptance")
FORBIDDEN = ("pluggy", "draftsmith.runtime.registry", "draftsmith.runtime.bind",
             "draftsmith.runtime.hookspecs", "draftsmith.selection.builtin")
ROOT = Path(draftsmith.__file__).parent


def _module_file(name: str) -> Path | None:
    rel = name.split(".")[1:]
    for cand in (ROOT.joinpath(*rel).with_suffix(".py"), ROOT.joinpath(*rel, "__init__.py")):
        if cand.is_file():
            return cand
    return None


def _top_level_imports(body: list[ast.stmt]) -> list[ast.stmt]:
    """Import statements that run when the module is imported (function bodies and
    ``if TYPE_CHECKING:`` blocks excluded)."""
    out: list[ast.stmt] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            out.extend(_top_level_imports(node.body + node.orelse))
        elif isinstance(node, ast.Try):
            out.extend(_top_level_imports(node.body + node.orelse + node.finalbody))
    return out


def _imports(name: str) -> set[str]:
    path = _module_file(name)
    assert path is not None, name
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in _top_level_imports(tree.body):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names
                       if _module_file(f"{node.module}.{a.name}") is not None
                       and node.module.startswith("draftsmith"))
    return out


def _closure(start: str) -> set[str]:
    """Every draftsmith module reachable from ``start`` (and its parent packages), except the
    top-level ``draftsmith/__init__`` which only defines the hookimpl marker."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        parts = mod.split(".")
        parents = [".".join(parts[:i]) for i in range(2, len(parts))]
        for dep in [*_imports(mod), *parents]:
            if dep.startswith("draftsmith.") and _module_file(dep) is not None:
                todo.append(dep)
            elif not dep.startswith("draftsmith"):
                seen.add(dep)
    return seen


def test_hot_path_does_not_import_pluggy():
    for mod in HOT_PATH:
        reached = _closure(mod)
        bad = sorted(m for m in reached if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
        assert not bad, f"{mod} reaches {bad}"
        assert importlib.util.find_spec(mod) is not None


def test_the_check_can_fail():
    """Negative control: bind (which builds the plugin registry) does reach pluggy."""
    assert "pluggy" in _closure("draftsmith.runtime.bind")
