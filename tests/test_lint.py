"""The package, its tests and its benchmarks are ruff-clean (``make lint``), so that ``make
test``, which CI runs, fails on a lint error too."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import draftsmith

ROOT = Path(draftsmith.__file__).parent.parent


def test_ruff_finds_nothing() -> None:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is missing: install the test extras (pip install -e '.[test]')"
    run = subprocess.run([ruff, "check", "--no-cache", "draftsmith", "tests", "benchmarks"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
