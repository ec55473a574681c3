"""Nothing in ``draftsmith/`` is unused outside tests.

A simple import-graph walk over the package source (parsed, never imported; tests excluded). The
nodes are modules and their top-level definitions (functions, classes, constants). The walk
starts at the public entry points:

- the console script and the pytest plugin named in ``pyproject.toml``;
- the names a public module exports (:data:`PUBLIC_MODULES`) and the names in :data:`ALLOW`;
- in every module it reaches: the hook implementations and specifications pluggy calls by name,
  the hooks and fixtures pytest calls by name, a module ``__getattr__``, and the top-level
  statements that run on import.

From a definition it follows every name the definition mentions: a name of its module, an
imported name, ``module.attribute``, a string that spells a draftsmith module, and a string that
names a definition of a module spelled in the same module (``_lazy("draftsmith.x", "f")``: how
built-in plugins, CLI commands and lazy exports are loaded). A used ``<op>`` keeps its
``<op>_reference``, the eager specification its parity tests compare it with. Methods are not
nodes: a used class keeps all of its body. The walk errs towards "used": a name mentioned in an
annotation counts.

A definition the walk does not reach is unused: delete it, or, if it is public API nobody in the
package calls, name it in :data:`ALLOW` with the reason.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import draftsmith

PACKAGE_DIR = Path(draftsmith.__file__).parent
PYPROJECT = PACKAGE_DIR.parent / "pyproject.toml"

PUBLIC_MODULES: dict[str, str] = {
    "draftsmith": "the plugin marker and the version",
    "draftsmith.contract": "the contract plugin authors and the runtime share",
    "draftsmith.testing": "the conformance kit (lazy exports of conformance and suite)",
    "draftsmith.runtime.api": "the text-in, text-out entry point",
    "draftsmith.drafters.derived": "a plugin's family built on a built-in one (docs/plugins.md)",
}
"""Modules whose ``__all__`` (every exported name) is public API."""

ALLOW: dict[tuple[str, str], str] = {
    # public API that no draftsmith module calls, and where it is documented
    ("draftsmith.runtime.reference_loop", "*"):
        "the golden-path loop: the decoder is tested against it, and it is how to read a round",
    ("draftsmith.checkpoints", "*"): "data: the shipped checkpoint, read by path",
    ("draftsmith.__main__", "*"): "entry point: python -m draftsmith",
    ("draftsmith.cli.__main__", "*"): "entry point: python -m draftsmith.cli",
    ("draftsmith.drafters.nn", "gather_context"):
        "a plugin's building block for reading its paged context (docs/plugins.md); the "
        "built-in families read the pages inside their attention kernels and references",
}
"""What the walk keeps although nothing in the package uses it, and why; ``"*"`` keeps a whole
module. Every entry must name something that exists and that nothing else reaches."""


@dataclass
class Module:
    """What the walk needs to know about one parsed module."""

    name: str
    is_package: bool
    definitions: dict[str, list[ast.AST]] = field(default_factory=dict)
    """Top-level name -> the nodes that define it."""
    bindings: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    """Name bound by an import anywhere in the module -> (module, name or None for a module)."""
    on_import: list[ast.AST] = field(default_factory=list)
    """Top-level statements that run on import and are not definitions."""
    roots: set[str] = field(default_factory=set)
    """Definitions something outside the package calls by name (hooks, fixtures)."""
    exports: list[str] = field(default_factory=list)
    """The literal ``__all__``."""
    spelled: set[str] = field(default_factory=set)
    """draftsmith modules a string in this module spells (lazy imports)."""


_CALLED_BY_NAME = {"hookimpl", "hookspec", "fixture", "pytest.fixture"}
"""Decorators of functions that pluggy or pytest find and call by name."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _decorator_names(node: ast.AST) -> set[str]:
    names = set()
    for deco in getattr(node, "decorator_list", []):
        target = deco.func if isinstance(deco, ast.Call) else deco
        if isinstance(target, ast.Attribute):
            names.add(target.attr)
            if isinstance(target.value, ast.Name):
                names.add(f"{target.value.id}.{target.attr}")
        elif isinstance(target, ast.Name):
            names.add(target.id)
    return names


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Top-level statements, looking inside ``if`` / ``try`` blocks (``TYPE_CHECKING``)."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            yield from _top_level(stmt.body)
            yield from _top_level(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody,
                          *(h.body for h in stmt.handlers)):
                yield from _top_level(block)
        else:
            yield stmt


def _resolve_from(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.name if module.is_package else module.name.rsplit(".", 1)[0]
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def parse_package(package_dir: Path = PACKAGE_DIR) -> dict[str, Module]:
    """Every module of the package, parsed."""
    modules: dict[str, Module] = {}
    paths = {_module_name(p): p for p in sorted(package_dir.rglob("*.py"))}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        module = Module(name, path.name == "__init__.py")
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        module.bindings[alias.asname] = (alias.name, None)
                    else:
                        top = alias.name.split(".")[0]
                        module.bindings[top] = (top, None)
            elif isinstance(node, ast.Constant) and node.value in paths:
                module.spelled.add(node.value)
            elif isinstance(node, ast.ImportFrom):
                source = _resolve_from(module, node)
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    target = (submodule, None) if submodule in paths else (source, alias.name)
                    module.bindings[alias.asname or alias.name] = target
        for stmt in _top_level(tree.body):
            if isinstance(stmt, ast.Import | ast.ImportFrom):
                continue
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                module.definitions.setdefault(stmt.name, []).append(stmt)
                if _CALLED_BY_NAME & _decorator_names(stmt) or stmt.name.startswith("pytest_") \
                        or stmt.name == "__getattr__":
                    module.roots.add(stmt.name)
                continue
            targets = (stmt.targets if isinstance(stmt, ast.Assign)
                       else [stmt.target] if isinstance(stmt, ast.AnnAssign) else [])
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if names == ["__all__"] and isinstance(stmt.value, ast.List | ast.Tuple):
                module.exports = [e.value for e in stmt.value.elts if isinstance(e, ast.Constant)]
            elif names and len(names) == len(targets):
                for n in names:
                    module.definitions.setdefault(n, []).append(stmt)
            elif not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
                module.on_import.append(stmt)
        modules[name] = module
    return modules


def _references(module: Module, modules: dict[str, Module],
                nodes: list[ast.AST]) -> Iterator[tuple[str, str | None]]:
    """The (module, name) pairs, or (module, None) for a whole module, that ``nodes`` mention."""
    for root in nodes:
        for node in ast.walk(root):
            if isinstance(node, ast.Name):
                if node.id in module.definitions:
                    yield module.name, node.id
                elif node.id in module.bindings:
                    yield module.bindings[node.id]
            elif isinstance(node, ast.Attribute):
                chain = []
                base: ast.AST = node
                while isinstance(base, ast.Attribute):
                    chain.append(base.attr)
                    base = base.value
                if not isinstance(base, ast.Name) or base.id not in module.bindings:
                    continue
                target, name = module.bindings[base.id]
                if name is not None:
                    continue
                for attr in reversed(chain):
                    if f"{target}.{attr}" in modules:
                        target = f"{target}.{attr}"
                        yield target, None
                    else:
                        yield target, attr
                        break
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value in modules:
                    yield node.value, None
                for spelled in module.spelled:
                    if node.value in modules[spelled].definitions:
                        yield spelled, node.value


def _entry_points() -> list[tuple[str, str | None]]:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    specs = list(project.get("scripts", {}).values())
    for group in project.get("entry-points", {}).values():
        specs.extend(group.values())
    found: list[tuple[str, str | None]] = []
    for spec in specs:
        module, _, attr = spec.partition(":")
        found.append((module, attr or None))
    return found


def reachable(modules: dict[str, Module],
              allow: dict[tuple[str, str], str] = ALLOW) -> set[tuple[str, str | None]]:
    """Every (module, name) and (module, None) the walk reaches from the entry points."""
    todo: list[tuple[str, str | None]] = list(_entry_points())
    for public in PUBLIC_MODULES:
        todo.append((public, None))
        todo.extend((public, name) for name in modules[public].exports)
    todo.extend(allow)
    seen: set[tuple[str, str | None]] = set()
    while todo:
        item = todo.pop()
        if item in seen or item[0] not in modules:
            continue
        seen.add(item)
        module = modules[item[0]]
        name = item[1]
        if name is None:
            if "." in module.name:  # importing a module runs its package first
                todo.append((module.name.rsplit(".", 1)[0], None))
            todo.extend(_references(module, modules, module.on_import))
            todo.extend((module.name, root) for root in module.roots)
            continue
        todo.append((module.name, None))
        if name == "*":
            todo.extend((module.name, n) for n in module.definitions)
        elif name in module.definitions:
            todo.extend(_references(module, modules, module.definitions[name]))
            todo.append((module.name, f"{name}_reference"))  # the kernel file pattern
        elif name in module.bindings:
            todo.append(module.bindings[name])
        elif f"{module.name}.{name}" in modules:
            todo.append((f"{module.name}.{name}", None))
    return seen


def unused(modules: dict[str, Module] | None = None) -> list[str]:
    """``module:name`` of every top-level definition the walk does not reach, and ``module``
    of every module it never loads."""
    modules = parse_package() if modules is None else modules
    seen = reachable(modules)
    found = []
    for module in modules.values():
        if (module.name, None) not in seen:
            found.append(module.name)
            continue
        found.extend(f"{module.name}:{name}" for name in module.definitions
                     if (module.name, name) not in seen and not name.startswith("__"))
    return sorted(found)


def test_nothing_is_unused() -> None:
    leftovers = unused()
    assert not leftovers, (
        "unused outside tests (delete it, or name public API in ALLOW with the reason):\n  "
        + "\n  ".join(leftovers)
    )


def test_every_allowance_is_needed() -> None:
    """An entry of ALLOW names a definition (or module) that exists and that the walk does not
    reach without the allow-list: one that is used, renamed or deleted must leave the list."""
    modules = parse_package()
    seen = reachable(modules, allow={})
    stale = []
    for (module, name), why in ALLOW.items():
        exists = module in modules and (name == "*" or name in modules[module].definitions
                                        or name in modules[module].bindings)
        if not exists or (module, None if name == "*" else name) in seen:
            stale.append(f"{module}:{name} ({why})")
    assert not stale, "ALLOW entries that are gone or used; remove them:\n  " + "\n  ".join(stale)


def test_walk_sees_an_unused_definition() -> None:
    """Negative control: a definition nothing mentions is reported, one a used one mentions is
    not, and a name spelled in a string of a module spelled in the same module counts as used."""
    modules = parse_package()
    fake = Module("draftsmith.runtime.probe", False)
    for source in ("def orphan():\n    return helper()\n", "def helper():\n    return 1\n"):
        node = ast.parse(source).body[0]
        fake.definitions[node.name] = [node]
    modules[fake.name] = fake
    cli = modules["draftsmith.cli"]
    cli.on_import.append(ast.parse(repr(fake.name)).body[0])  # the module loads, nothing else
    found = [f for f in unused(modules) if f.startswith(fake.name)]
    assert found == [f"{fake.name}:helper", f"{fake.name}:orphan"]
    cli.spelled.add(fake.name)
    cli.on_import.append(ast.parse(f"_lazy({fake.name!r}, 'orphan')").body[0])
    assert not [f for f in unused(modules) if f.startswith(fake.name)]


if __name__ == "__main__":
    print("\n".join(unused()))
