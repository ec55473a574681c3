"""Every module's imports respect the layer rules of docs/layers.md (parsed, not executed)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import draftsmith

PACKAGE_DIR = Path(draftsmith.__file__).parent
DOC = PACKAGE_DIR.parent / "docs" / "layers.md"

_BELOW_RUNTIME = {"<root>", "contract", "parallel", "kernels", "selection", "drafters"}

ALLOWED: dict[str, set[str]] = {
    "contract": {"contract"},
    "parallel": {"contract", "parallel"},
    "__main__": {"__main__", "cli"},
    "kernels": {"<root>", "contract", "kernels"},
    "selection": {"<root>", "contract", "kernels", "selection"},
    "drafters": {"<root>", "contract", "kernels", "drafters"},
    "runtime": _BELOW_RUNTIME | {"runtime"},
    "training": _BELOW_RUNTIME | {"runtime", "training"},
    "testing": _BELOW_RUNTIME | {"runtime", "testing"},
    "cli": _BELOW_RUNTIME | {"runtime", "training", "testing", "cli"},
    "checkpoints": set(),
    "<root>": {"<root>"},
}
"""Which draftsmith layers each layer may import (its own included); docs/layers.md says the same."""

_EVERYWHERE = ("triton", "torch.distributed", "pytest")
"""Each lives in one layer only: kernels, parallel, testing."""

FORBIDDEN_EXTERNAL: dict[str, tuple[str, ...]] = {
    "contract": (*_EVERYWHERE, "pluggy", "transformers", "numpy"),
    "parallel": ("triton", "pytest", "pluggy", "transformers"),
    "kernels": ("torch.distributed", "pytest", "pluggy", "transformers"),
    "selection": (*_EVERYWHERE, "transformers"),
    "drafters": (*_EVERYWHERE, "transformers"),
    "runtime": _EVERYWHERE,
    "training": _EVERYWHERE,
    "testing": ("triton", "torch.distributed"),
    "cli": _EVERYWHERE,
    "<root>": (*_EVERYWHERE, "torch"),
}
"""Third-party modules a layer must not import (triton lives only in kernels)."""


def _layer_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "draftsmith":
        raise ValueError(module)
    if len(parts) == 1 or parts[1] == "__init__":
        return "<root>"
    return parts[1].removesuffix(".py")


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            if target == "draftsmith":  # `from draftsmith import contract` names a layer
                found.extend((node.lineno, f"draftsmith.{a.name}") for a in node.names
                             if (PACKAGE_DIR / a.name).exists()
                             or (PACKAGE_DIR / f"{a.name}.py").exists())
    return found


MODULES = sorted(PACKAGE_DIR.rglob("*.py"))


def test_every_layer_has_rules() -> None:
    """A new top-level module or package must be given a place in the table before it lands."""
    layers = {_layer_of(_module_name(p)) for p in MODULES}
    assert layers == set(ALLOWED)


def test_checkpoints_hold_no_code() -> None:
    """``draftsmith/checkpoints`` is data read by path: its modules import nothing."""
    for path in MODULES:
        if _layer_of(_module_name(path)) == "checkpoints":
            assert [t for _, t in _imports(path, _module_name(path)) if t != "__future__"] == []


def _documented_rules() -> dict[str, set[str]]:
    """The "may import" column of docs/layers.md, as layer -> layers (its own included)."""
    rules: dict[str, set[str]] = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        layer = cells[0].strip("`").replace("draftsmith", "<root>")
        if cells[2].startswith("every layer"):
            rules[layer] = set(ALLOWED) - {"checkpoints", "__main__"}
        elif cells[2].startswith("nothing"):
            rules[layer] = {layer} if layer != "checkpoints" else set()
        else:
            named = {c.strip().strip("`").replace("draftsmith", "<root>")
                     for c in cells[2].split(",")}
            rules[layer] = named | {layer}
    return rules


def test_docs_state_the_rules() -> None:
    assert _documented_rules() == ALLOWED


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE_DIR)))
def test_imports_respect_layers(path: Path) -> None:
    _check(path, _module_name(path))


def _check(path: Path, module: str) -> None:
    layer = _layer_of(module)
    problems = []
    for lineno, target in _imports(path, module):
        top = target.split(".")[0]
        if top == "draftsmith":
            dep = _layer_of(target)
            if dep not in ALLOWED[layer]:
                problems.append(f"line {lineno}: {layer} may not import {target}")
        for banned in FORBIDDEN_EXTERNAL.get(layer, ()):
            if target == banned or target.startswith(banned + "."):
                problems.append(f"line {lineno}: {layer} may not import {target}")
    assert not problems, "\n".join(problems)


def test_checker_catches_a_crossing(tmp_path: Path) -> None:
    """Negative control: the parser sees a forbidden import in a drafter module."""
    bad = tmp_path / "probe.py"
    bad.write_text("from ..runtime import config\nimport torch.distributed as dist\n")
    with pytest.raises(AssertionError, match="drafters may not import draftsmith.runtime"):
        _check(bad, "draftsmith.drafters.probe")
    with pytest.raises(AssertionError, match="torch.distributed"):
        _check(bad, "draftsmith.drafters.probe")
    above = tmp_path / "above.py"
    above.write_text("from draftsmith.cli import main\n")
    with pytest.raises(AssertionError, match="training may not import draftsmith.cli"):
        _check(above, "draftsmith.training.probe")
