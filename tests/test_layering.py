"""Every module's imports respect the layer rules of ARCHITECTURE.md (parsed, not executed)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import draftsmith

PACKAGE_DIR = Path(draftsmith.__file__).parent

ALLOWED: dict[str, set[str]] = {
    "contract": {"contract"},
    "kernels": {"contract", "kernels", "<root>"},
    "selection": {"contract", "kernels", "selection", "<root>"},
    "drafters": {"contract", "kernels", "drafters", "<root>"},
    "parallel": {"contract", "parallel"},
    "__main__": {"cli"},
    "runtime": {"contract", "kernels", "selection", "drafters", "parallel", "runtime", "<root>"},
    "cli": {"contract", "kernels", "selection", "drafters", "parallel", "runtime", "cli", "testing",
            "training", "<root>"},
    "testing": {"contract", "kernels", "selection", "drafters", "parallel", "runtime", "cli",
                "testing", "<root>"},
    "training": {"contract", "kernels", "selection", "drafters", "parallel", "runtime", "cli",
                 "testing", "training", "<root>"},
    "checkpoints": set(),
    "<root>": {"<root>"},
}
"""Which draftsmith layers each layer may import."""

FORBIDDEN_EXTERNAL: dict[str, tuple[str, ...]] = {
    "contract": ("triton", "torch.distributed", "pluggy", "transformers", "numpy"),
    "kernels": ("torch.distributed", "pluggy", "transformers"),
    "selection": ("torch.distributed", "triton", "transformers"),
    "drafters": ("torch.distributed", "triton", "transformers"),
    "parallel": ("triton", "transformers"),
    "runtime": ("triton",),
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


def test_package_has_every_layer() -> None:
    layers = {_layer_of(_module_name(p)) for p in MODULES}
    assert {"contract", "kernels", "selection", "drafters", "runtime", "cli"} <= layers


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
