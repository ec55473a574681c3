"""No import circle among draftsmith's modules (parsed, not executed).

Every import counts, at module level or inside a function: a function-level import that closes a
circle (``bind`` -> ``plan`` -> ``bind``) still makes two modules depend on each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import draftsmith

PACKAGE_DIR = Path(draftsmith.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(name: str, modules: set[str]) -> str | None:
    """The module ``name`` refers to: itself, or the package or module that defines it."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """``module -> the draftsmith modules it imports`` for ``{module name: source text}``;
    ``sources`` holds packages under their package name (``__init__`` dropped)."""
    modules = set(sources)
    packages = {m.rsplit(".", 1)[0] for m in modules if "." in m}
    graph: dict[str, set[str]] = {}
    for module, text in sources.items():
        package = module if module in packages else module.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                # `from pkg import sub` imports the submodule; `from mod import name` the module
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                         for a in node.names]
            else:
                continue
            deps.update(r for n in names if (r := _resolve(n, modules)) is not None)
        deps.discard(module)
        graph[module] = deps
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_import_circle_in_the_package() -> None:
    sources = {_module_name(p): p.read_text(encoding="utf-8")
               for p in sorted(PACKAGE_DIR.rglob("*.py"))}
    graph = import_graph(sources)
    assert "draftsmith.runtime.plan" in graph["draftsmith.runtime.bind"]  # the walk sees imports
    circles = import_circles(graph)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_a_function_level_import_closing_a_circle_is_found() -> None:
    """Negative control: the circle the CLI used to close (plan_command importing bind)."""
    graph = import_graph({
        "draftsmith": "",
        "draftsmith.runtime": "",
        "draftsmith.runtime.bind": "from draftsmith.runtime.plan import make_plan\n",
        "draftsmith.runtime.plan": "def plan_command():\n    from .bind import plan_only\n",
        "draftsmith.cli": "from draftsmith.runtime import bind\n",
    })
    assert graph["draftsmith.cli"] == {"draftsmith.runtime.bind"}
    assert import_circles(graph) == [["draftsmith.runtime.bind", "draftsmith.runtime.plan"]]
