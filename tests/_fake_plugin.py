"""Third-party draftsmith plugins for tests, installed with real ``.dist-info`` metadata in a
directory of one's choosing, as pip would install them: the ``acme-dspark`` family of
docs/plugins.md section 7 (distribution ``acme-drafters``, entry point ``acme``), and one-module
plugins of any source (:func:`install_module`)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

DOC = Path(__file__).parents[1] / "docs" / "plugins.md"
ENTRY_POINT, DISTRIBUTION, FAMILY = "acme", "acme-drafters", "acme-dspark"


def docs_example() -> tuple[str, str]:
    """The plugin module and the conformance test of docs/plugins.md section 7."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## 7. A family built on a built-in one"):]
    plugin, test = re.findall(r"```python\n(.*?)```", section, re.S)[:2]
    return plugin, test


def install_acme(site: Path) -> Path:
    """Install the docs' plugin into ``site`` (put it on ``sys.path`` to make it installed)."""
    plugin, _ = docs_example()
    package = site / "acme_drafters"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "plugin.py").write_text(plugin)
    info = site / "acme_drafters-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[draftsmith]\n{ENTRY_POINT} = acme_drafters.plugin\n")
    return site


def install_module(site: Path, module: str, source: str, dist: str) -> None:
    """Install ``source`` as the module ``module`` of distribution ``dist`` into ``site``, its
    entry point in the ``draftsmith`` group named ``module``."""
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[draftsmith]\n{module} = {module}\n")
